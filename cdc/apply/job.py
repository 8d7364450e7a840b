"""The apply job: PySpark Structured Streaming from the change topics into each store.

One streaming query per store, each with its own checkpoint under
`<data_dir>/checkpoints/<pipeline>/<store>`, reading the pipeline's change topics
with the spark-sql-kafka source. Each micro-batch keeps every key's last event and
hands it to the store, which writes it only if it is newer than what it holds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cdc.apply.batch import BatchWriter, apply_say, wait_for
from cdc.apply.own_process import StoreProcess
from cdc.capture.rewrites import Rewrite, act_on_rewrites, check_rewrites
from cdc.capture.snapshot.held import read_held
from cdc.capture.source_reader import captured_tables
from cdc.core.catalog import Table
from cdc.core.errors import (
    CdcError,
    ConfigError,
    LogRewoundError,
    NotInstalledError,
    SourceRewoundError,
    StoreError,
    StoreUnavailableError,
    carried_message,
)
from cdc.core.one_writer import one_writer
from cdc.core.settings import Settings
from cdc.core.spark import execution_profile, kafka_options, spark_session, views_session
from cdc.core.store_declarations import Publisher, declared, with_ability
from cdc.core.topics import change_topic_ends, change_topic_pattern
from cdc.log.checkpoints import checkpoint
from cdc.log.progress import (
    Progress,
    forget_other_definition,
    forget_other_view_queries,
    note_late,
    read_progress,
    write_progress,
)
from cdc.stores.base import DerivedQuery, StoreWriter
from cdc.stores.registry import derived_views, make_writer

__all__ = ["failure_line", "run_apply"]

log = logging.getLogger(__name__)


def run_apply(
    settings: Settings,
    stores: list[str] | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Run the apply job. once: apply what the topics hold now, then return."""
    selected = stores or list(settings.apply.stores)
    own = own_processes(settings, selected, once)
    with contextlib.ExitStack() as writers:
        # a store that takes one writer (the warehouse on S3): its lock, before anything
        # (a store in a process of its own takes it there)
        for name in selected:
            if name not in own:
                writers.enter_context(one_writer(settings, name, "cdc apply"))
        _run_apply(settings, selected, own, once, stop)


def own_processes(settings: Settings, selected: list[str], once: bool) -> list[str]:
    """The stores of `selected` that run in a process of their own: beside other stores,
    each that asks for one, in the local profile. In the cluster profile the master
    shares the cores, and a second application would get none on a standalone master
    while the first holds every worker's (Spark's default; test_scale found the
    warehouse's waiting so)."""
    own = with_ability(selected, "own_process")
    if once or not settings.apply.own_process or not own or len(own) == len(selected):
        return []
    return own if execution_profile(settings)[0] == "local" else []


def _run_apply(
    settings: Settings,
    selected: list[str],
    own: list[str],
    once: bool,
    stop: threading.Event | None,
) -> None:
    spark = spark_session(settings, f"cdc-apply-{settings.pipeline.name}")
    tables = captured_tables(settings)
    check_rewrites(settings, tables.values(), apply_say)  # DDL while the job was down
    selected = [s for s in selected if s not in own]
    apart = [StoreProcess(settings, s, settings.apply.own_process_nice) for s in own]
    door = derived_views(settings, selected)  # this process runs the derived views
    views = door.checked(settings, tables) if door is not None else []
    rewritten = _Rewritten(settings)  # what the batches found DDL rewrote: acted on here
    starters: dict[str, Callable[[], Any]] = {}
    for name in selected:
        store = make_writer(settings, name, spark)
        if with_ability([name], "views"):  # its views refreshed after each batch
            store.take_views(views)
        _prepare(settings, store, tables)
        starters[name] = functools.partial(
            _start_store_query, spark, settings, store, once, rewritten.add
        )
    # the streaming views, in queries with a watermark
    queries = list(door.queries(views)) if door is not None else []
    if door is not None:
        forget_other_view_queries(settings, {q.label for q in queries})
    for query in queries:
        starters[query.label] = functools.partial(
            _start_view_query, spark, settings, query, tables, once
        )
    late = _LateNotes(settings, queries)
    if late.names:
        late.listen(views_session(spark, settings))
    try:
        with _publishing(settings, selected, once):
            _run_queries(settings, starters, apart, late, rewritten, once, stop)
    finally:
        late.stop(views_session(spark, settings))


@contextlib.contextmanager
def _publishing(settings: Settings, selected: list[str], once: bool) -> Iterator[None]:
    """Each selected store's publisher (its declaration's `publisher`, when its settings
    ask for one: the warehouse's tables as Iceberg tables) publishes while
    the job runs (every trigger interval, in a thread of its own), and once more at the
    end of a run `once` (whose failure is the run's)."""
    publishers: list[Publisher] = []
    for name in selected:
        made = declared()[name].publisher_of(settings)
        if made is not None:
            publishers.append(made)
    done = threading.Event()

    def publish(publisher: Publisher) -> None:
        while not done.is_set():
            try:
                publisher.publish_all(apply_say)
            except Exception as exc:  # e.g. the catalog unreachable: said, tried again
                apply_say(f"{publisher.name}: not published ({failure_line(exc)}); trying again")
            done.wait(max(settings.apply.trigger_interval_s, 1.0))

    threads = [
        threading.Thread(target=publish, args=(p,), name=p.name, daemon=True)
        for p in ([] if once else publishers)
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
    if once:
        for publisher in publishers:
            publisher.publish_all(apply_say, strict=True)


def _run_queries(
    settings: Settings,
    starters: dict[str, Callable[[], Any]],
    apart: list[StoreProcess],
    late: _LateNotes,
    rewritten: _Rewritten,
    once: bool,
    stop: threading.Event | None,
) -> None:
    """Start the queries, then (once) wait for them to end, or keep them running until
    `stop`, starting a failed one again."""
    queries = {name: start() for name, start in starters.items()}
    windows = {n: q for n, q in queries.items() if n in late.queries}
    for process in apart:
        process.start()
        apply_say(
            f"{process.name}: in a process of its own (pid {process.pid}, nice {process.nice})"
        )
    if once:
        try:
            for query in queries.values():
                try:
                    query.awaitTermination()
                except Exception as exc:
                    raise _fatal(exc) or StoreError(
                        f"the apply job stopped: {failure_line(exc)}"
                    ) from None
        finally:
            for query in queries.values():
                query.stop()
            late.ended(list(windows.values()))
        late.catch_up(windows)
        rewritten.act()
        return
    failures: dict[str, int] = {}
    try:
        while not (stop and stop.is_set()):
            for name, query in list(queries.items()):
                error = query.exception()
                if error is None:
                    continue
                fatal = _fatal(error)
                if fatal is not None:
                    raise fatal
                # a query stopped (Kafka or the store went away, a batch failed): say so
                # and start it again from its checkpoint, as a restart of `cdc apply` would
                failures[name] = failures.get(name, 0) + 1
                pause = min(2 ** failures[name], 60)
                apply_say(
                    f"{name}: stopped ({failure_line(error)}); starting it again in {pause} s"
                )
                if stop is not None and stop.wait(pause):
                    return
                if stop is None:
                    time.sleep(pause)
                try:
                    queries[name] = starters[name]()
                except Exception as exc:  # e.g. Kafka not back yet: the next round tries again
                    apply_say(f"{name}: could not start again ({failure_line(exc)})")
                    continue
                if name in late.queries:
                    windows[name] = queries[name]
            for process in apart:
                _watch_apart(process, failures, stop)
            late.note_recent(windows)
            rewritten.act()
            # (never a query's awaitTermination here: it raises the query's failure,
            # which the loop above restarts the query for)
            if stop is None:
                time.sleep(1)
            else:
                stop.wait(1)
    finally:
        for query in queries.values():
            query.stop()
        late.ended(list(windows.values()))
        for process in apart:
            process.stop()


# what a store's own process exits with when starting it again cannot help: a setting,
# an install, or a log or source that went back
_FATAL_EXITS = {e.exit_code: e for e in (ConfigError, NotInstalledError, LogRewoundError)}


def _watch_apart(
    apart: StoreProcess, failures: dict[str, int], stop: threading.Event | None
) -> None:
    """Start a store's own process again when it has stopped (after a pause that grows
    with its failures), as a failed query is; raise its error when that cannot help."""
    code = apart.exit_code()
    if code is None:
        return
    said, name = apart.last_said, apart.name
    if code in _FATAL_EXITS:
        raise _FATAL_EXITS[code](f"the {name}'s apply process stopped: {said}")
    failures[name] = failures.get(name, 0) + 1
    pause = min(2 ** failures[name], 60)
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    apply_say(
        f"{name}: its process exited ({how}{'; ' + said if said else ''}); "
        f"starting it again in {pause} s"
    )
    if stop is not None and stop.wait(pause):
        return
    if stop is None:
        time.sleep(pause)
    apart.start()


_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


class _LateNotes:
    """Events a windowed aggregate or a stream-stream join did not count (later than its
    watermark), added up per window for `cdc status`. Each query's progress report is
    noted as Spark's listener bus delivers it, after every batch, so that neither a
    query that fails next (and is replaced) nor a `--once` run of more batches than
    Spark keeps in memory (`recentProgress`, the last 100) loses one; the reports
    still in memory are noted too, once a second (a report is noted once: by batch id)."""

    def __init__(self, settings: Settings, queries: list[DerivedQuery]) -> None:
        self.settings = settings
        self.queries = {q.label: q for q in queries}
        self.names = {q.name(settings): q.label for q in queries}
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}  # query -> the newest batch id of a report noted
        self._listener: Any = None
        self._ended: set[str] = set()  # the ids of the queries it was told ended

    def note(self, label: str, reports: list[dict[str, Any]]) -> None:
        """Note each view's late events in its query's reports (a view's own stateful
        steps: DerivedQuery.steps)."""
        query = self.queries[label]
        with self._lock:
            for view, steps in zip(query.members, query.steps, strict=False):
                note_late(self.settings, view.name, reports, view.late_readers, steps)
            for report in reports:
                self._seen[label] = max(self._seen.get(label, -1), int(report["batchId"]))

    def note_recent(self, windows: dict[str, Any]) -> None:
        for name, query in windows.items():
            self.note(name, query.recentProgress)

    def listen(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        notes = self

        class _Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                name = notes.names.get(event.progress.name)
                if name is not None:
                    notes.note(name, [json.loads(event.progress.json)])

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                notes._ended.add(str(event.id))

        self._listener = _Listener()
        spark.streams.addListener(self._listener)

    def ended(self, queries: list[Any], timeout: float = 10.0) -> None:
        """Wait (at most `timeout` seconds) until the listener has been told that each
        of these stopped queries ended: Spark tells it on its listener bus after the
        query stops, and a call still under way when the process exits fails with a
        Py4J stack trace on the terminal."""
        if self._listener is None:
            return
        ids = {str(q.id) for q in queries}
        deadline = time.monotonic() + timeout
        while not ids <= self._ended and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, spark: Any) -> None:
        if self._listener is not None:
            spark.streams.removeListener(self._listener)
            self._listener = None

    def catch_up(self, windows: dict[str, Any], timeout: float = 30.0) -> None:
        """Wait until the listener has noted each query's last batch (its reports arrive
        after the query ends), then note what is still in memory."""
        deadline = time.monotonic() + timeout
        for name, query in windows.items():
            ran = [p["batchId"] for p in query.recentProgress if p.get("stateOperators")]
            while ran and self._seen.get(name, -1) < max(ran) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.note_recent(windows)


def failure_line(exc: BaseException) -> str:
    """One line saying why a query failed: the Python exception at the end of the
    traceback Spark carries back as text (not "Traceback (most recent call last):"),
    else the error's first line."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    marker = "Traceback (most recent call last)"
    if marker in text:  # the last traceback's exception: the first line naming one
        for line in text[text.rindex(marker) :].splitlines()[1:]:
            if not line.startswith(" ") and (m := _RAISED.match(line.strip())):
                return f"{m[1]}: {m[2]}"[:500]
    return text.splitlines()[0][:500]


def _fatal(exc: BaseException) -> CdcError | None:
    """The error that must stop the apply job (not be retried), from a query's failure."""
    if isinstance(exc, LogRewoundError):
        return exc
    for kind in (SourceRewoundError, LogRewoundError):
        if (message := carried_message(exc, kind)) is not None:
            return kind(message)
    return None


def _prepare(settings: Settings, store: StoreWriter, tables: dict[str, Table]) -> None:
    """The store's indexes, tables...; a store that does not answer yet is waited for."""
    while True:
        try:
            store.prepare(tables.values())
            return
        except StoreUnavailableError as exc:
            wait_for(settings, store.name, str(exc), -1, store.ping)


class _Rewritten:
    """The tables the batches found DDL rewrote (intents: cdc/capture/rewrites.py),
    acted on by the job once a second and at the end of a run: a backfill started, or
    what to run said. One whose backfill cannot start yet is found again by the next
    batch."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._found: dict[str, Rewrite] = {}

    def add(self, found: list[Rewrite]) -> None:
        with self._lock:
            self._found.update({r.table.qualified: r for r in found})

    def act(self) -> None:
        with self._lock:
            found, self._found = list(self._found.values()), {}
        if found:
            act_on_rewrites(self.settings, found, apply_say)


def _start_store_query(
    spark: Any,
    settings: Settings,
    store: StoreWriter,
    once: bool,
    rewritten: Callable[[list[Rewrite]], None] | None = None,
) -> Any:
    limit = store.max_offsets(settings.apply.max_offsets_per_trigger)
    source = (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings))
        # every change topic of the pipeline, also of tables added while it runs
        .option("subscribePattern", change_topic_pattern(settings.pipeline))
        .option("startingOffsets", _starting_offsets(settings, store.name))
        # records a re-snapshot deleted are gone on purpose; start from what is there
        .option("failOnDataLoss", "false")
        .option("maxOffsetsPerTrigger", limit)
        # each task's consumer finds the fetch it sent ahead at the end of the last batch
        # still waiting at the broker for new records (up to 500 ms by default) and waits
        # for it before it can fetch its range: a small batch then costs a partition's
        # quiet time per task
        .option("kafka.fetch.max.wait.ms", "100")
        .load()
    )
    writer = (
        source.writeStream.queryName(f"cdc-{settings.pipeline.name}-{store.name}")
        .option("checkpointLocation", str(checkpoint(settings, store.name)))
        .foreachBatch(BatchWriter(settings, store, rewritten=rewritten))
    )
    return _triggered(settings, writer, once).start()


def _starting_offsets(settings: Settings, store: str) -> str:
    """Where the store's query starts when it has no checkpoint yet: every change topic
    at its earliest record, except the partitions the snapshot wrote into the store
    itself (cdc/capture/snapshot/held.py), at the end of what it holds of them; the
    store's progress record then takes what it skips so as applied. A query with a
    checkpoint goes on from it (Spark ignores this)."""
    held = read_held(settings, store)
    if held is None or not held.ends:
        return "earliest"
    if checkpoint(settings, store).last_committed_batch() is not None:
        return "earliest"
    # Spark takes specific offsets only for every partition the pattern matches now
    ends = change_topic_ends(settings.kafka, settings.pipeline)
    starting = {
        topic: {str(p): held.ends.get(f"{topic}:{p}", -2) for p in sorted(parts)}
        for topic, parts in sorted(ends.items())
    }
    progress = read_progress(settings, store) or Progress()
    for where, end in held.ends.items():
        if end and progress.applied.get(where, -1) < end - 1:
            progress.applied[where] = end - 1
    write_progress(settings, store, progress)
    log.info("%s: its query starts after the snapshot's records it holds", store)
    return json.dumps(starting)


def _start_view_query(
    spark: Any, settings: Settings, query: DerivedQuery, tables: dict[str, Table], once: bool
) -> Any:
    """The query of window aggregates and stream-stream joins (the derived views')."""
    where = checkpoint(settings, query.label)
    forget_other_definition(settings, where, query.definition())
    # a pool of its own (the query's thread inherits it from this one)
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", query.label)
    writer = query.query(views_session(spark, settings), settings, tables, where)
    return _triggered(settings, writer, once, settings.apply.views_trigger_interval_s).start()


def _triggered(settings: Settings, writer: Any, once: bool, every: float | None = None) -> Any:
    if once:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{every or settings.apply.trigger_interval_s} seconds")
