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
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cdc.capture.generation import read_generation
from cdc.capture.rewrites import check_rewrites
from cdc.capture.slot import int_to_lsn
from cdc.capture.source import SourceReader, captured_tables, ping_source, timeline_forks
from cdc.catalog import TRUNCATIONS_TABLE, Table
from cdc.clients import kafka_admin, kafka_client_kwargs
from cdc.errors import (
    CdcError,
    ConfigError,
    LogRewoundError,
    NotInstalledError,
    SourceRewoundError,
    SourceUnavailableError,
    StoreError,
    StoreUnavailableError,
)
from cdc.settings import Settings
from cdc.spark import kafka_options, spark_session
from cdc.topics import change_topic, change_topic_pattern
from materializers.apply.dead_letters import DeadLetters
from materializers.apply.freshness import RATIO, Freshness
from materializers.apply.warehouse_process import WarehouseProcess
from materializers.apply.writer import RESULT_DDL, partition_writer, result_schema
from materializers.log.events import parse_events
from materializers.log.generated import expressions_dsn, with_generated
from materializers.log.progress import (
    Progress,
    add_cut,
    checkpoint_dir,
    forget_other_definition,
    note_late,
    read_progress,
    set_waiting,
    write_progress,
)
from materializers.log.typed import may_hold_placeholder, unheld_columns
from materializers.stores.base import FrameStore, RowStore, Store
from materializers.stores.registry import executor_settings, make_row_store, make_store
from materializers.stores.warehouse.iceberg import IcebergPublisher
from materializers.stores.warehouse.streams import (
    PLAN,
    late_readers,
    stream_join_query,
    window_query,
)
from materializers.stores.warehouse.tables import warehouse_base, warehouse_root
from materializers.stores.warehouse.views import check_views

__all__ = [
    "BULK_EVENTS",
    "backlog",
    "check_source_not_rewound",
    "failure_line",
    "run_apply",
    "unavailable_reason",
]

log = logging.getLogger(__name__)

# a batch is written in bulk (Store.bulk) when the store is at least this many events
# behind the log at its start: a catch-up, never a steady batch
BULK_EVENTS = 20_000


def _batch_writer(
    settings: Settings, store: Store, chunk: int = 5000
) -> Callable[[Any, int], None]:
    dead = DeadLetters(settings, store.name)

    def write(batch: Any, batch_id: int) -> None:
        # each store's queries run in a scheduler pool of their own (FAIR between pools)
        batch.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", store.name)
        waited = False
        while True:
            try:
                write_once(batch, batch_id)
            except Exception as exc:
                why = unavailable_reason(exc)
                if why is not None:
                    # a store that is down blocks its own batch: nothing is committed,
                    # nothing goes to the dead-letter topic; the batch is written again
                    # once it answers
                    _wait_for(settings, store.name, why, batch_id, store.ping)
                elif (source := unavailable_reason(exc, SourceUnavailableError)) is not None:
                    # the catalog is read every batch, generated columns computed in the
                    # Python workers: each waits for PostgreSQL likewise
                    _wait_for(settings, store.name, source, batch_id, lambda: ping_source(settings))
                else:
                    raise
                waited = True
                continue
            if waited:
                notify(f"{store.name}: answers again; batch {batch_id} written")
            return

    ends = _EndOffsets(settings)
    source = SourceReader(settings)
    cuts: dict[str, list[list[int]]] = {}  # table -> its TRUNCATEs (Progress.truncations)
    topic_ids: dict[str, str] = {}  # topic -> its id, as the batch's check found it

    def write_once(batch: Any, batch_id: int) -> None:
        started_ms = int(time.time() * 1000)  # events' ages are counted from here
        tables, wal = source.read()
        check_rewrites(settings, tables.values(), notify)
        topics = {change_topic(settings.pipeline, t): t for t in [*tables, TRUNCATIONS_TABLE]}
        batch = with_generated(batch, expressions_dsn(settings), topics, tables)
        progress = read_progress(settings, store.name) or Progress()
        check_source_not_rewound(store.name, wal, progress)
        check_source_lineage(
            store.name, source.lineage, functools.partial(timeline_forks, settings), progress
        )
        behind = backlog(
            ends.check_not_rewound(store.name, topics, progress), progress.applied_of(topics)
        )
        topic_ids.update(ends.ids)
        cutoffs = dict(progress.truncated)
        cuts.clear()
        cuts.update(progress.truncations)
        if isinstance(store, RowStore):
            mode = (
                "bulk"
                if behind >= BULK_EVENTS
                else "driver"
                if behind <= settings.apply.driver_batch_events
                else "workers"
            )
            _write_partitions(batch, topics, tables, batch_id, cutoffs, mode, started_ms)
        else:
            parsed = _unheld_as_errors(
                parse_events(batch, topics).where("table IS NOT NULL"), tables
            ).cache()
            try:
                _write_frame(parsed, tables, batch_id, cutoffs, started_ms)
            finally:
                parsed.unpersist()
        _sweep_generation(tables)

    def _sweep_generation(tables: dict[str, Table]) -> None:
        """Once the store holds a new snapshot generation whole, remove what it still
        holds from before it (cdc/capture/generation.py)."""
        generation = read_generation(settings)
        progress = read_progress(settings, store.name) or Progress()
        if generation is None or progress.generation >= generation.lsn:
            return
        if generation.previous is None:  # the first: nothing from before it to remove
            return
        if not generation.applied_by(progress.applied):
            return
        for table in tables.values():
            store.truncate(table, (generation.lsn, 0), generation.ts_ms)
        progress.generation = generation.lsn
        write_progress(settings, store.name, progress)
        log.info("%s: generation %d whole; rows from before it removed", store.name, generation.lsn)

    def _write_frame(
        parsed: Any,
        tables: dict[str, Table],
        batch_id: int,
        cutoffs: dict[str, tuple[int, int]],
        started_ms: int,
    ) -> None:
        """A store that writes Spark frames (the warehouse) takes the batch as one. One
        job tells what the batch holds (per topic partition: last offset, events, newest
        commit time, poison events); the dead-letter and TRUNCATE jobs run only when the
        batch has some, as each Spark job costs a few hundred ms on a small machine."""
        from pyspark.sql import functions as F

        valid = F.col("error").isNull()
        placeholders = {t.placeholder for t in tables.values()}
        # per topic partition and fine age bucket (materializers/apply/freshness.py) of the
        # changes (not the snapshot's or a backfill's reads), in one job
        age = F.greatest(F.lit(started_ms) - F.col("commit_ms"), F.lit(1))
        bucket = F.when(
            valid & F.col("commit_ms").isNotNull() & (F.col("op") != "r"),
            F.greatest(F.ceil(F.log(age) / math.log(RATIO)) - 1, F.lit(0)),
        )
        groups = (
            parsed.groupBy("table", "topic", "partition", bucket.alias("bucket"))
            .agg(
                F.max("offset").alias("offset"),
                F.count(F.when(valid, 1)).alias("n"),
                F.max(F.when(valid, F.col("commit_ms"))).alias("commit_ms"),
                F.max(F.when(valid, F.col("commit_lsn"))).alias("commit_lsn"),
                F.count("error").alias("errors"),
                F.count(
                    F.when(valid & may_hold_placeholder(F.col("after"), placeholders), 1)
                ).alias("toasted"),
            )
            .collect()
        )
        ages: dict[int, int] = {}
        merged: dict[tuple[str, str, int], dict[str, Any]] = {}
        for g in groups:
            if g["bucket"] is not None and g["table"] != TRUNCATIONS_TABLE:
                ages[g["bucket"]] = ages.get(g["bucket"], 0) + g["n"]
            part = merged.setdefault(
                (g["table"], g["topic"], g["partition"]),
                {
                    "table": g["table"],
                    "topic": g["topic"],
                    "partition": g["partition"],
                    "offset": -1,
                    "n": 0,
                    "commit_ms": None,
                    "commit_lsn": None,
                    "errors": 0,
                    "toasted": 0,
                },
            )
            part["offset"] = max(part["offset"], g["offset"])
            part["n"] += g["n"]
            part["errors"] += g["errors"]
            part["toasted"] += g["toasted"]
            for newest in ("commit_ms", "commit_lsn"):
                if g[newest] is not None:
                    part[newest] = max(part[newest] or g[newest], g[newest])
        parts = list(merged.values())
        if any(p["errors"] for p in parts):
            for row in parsed.where("error IS NOT NULL").toLocalIterator():
                dead.send_row(row)
        truncated = any(p["table"] == TRUNCATIONS_TABLE and p["n"] for p in parts)
        cut_ms = _truncated(parsed, tables, cutoffs, found=truncated)
        data = [p for p in parts if p["table"] != TRUNCATIONS_TABLE]
        commits = [p["commit_ms"] for p in data if p["commit_ms"] is not None]
        summary = {
            "n": sum(p["n"] for p in data),
            "commit_ms": max(commits, default=None),
            "commit_lsn": max((p["commit_lsn"] or 0 for p in parts), default=0),
        }
        offsets = {f"{p['topic']}:{p['partition']}": p["offset"] for p in parts}
        present = {p["table"] for p in data if p["n"]}
        started = time.monotonic()
        events = parsed.where(valid & (F.col("table") != TRUNCATIONS_TABLE))
        # an event from before its table's last TRUNCATE is history, not current state
        assert isinstance(store, FrameStore)
        toasted = {p["table"] for p in data if p["toasted"]}
        store.write_frame(tables, events.withColumn("cut_ms", cut_ms), present, toasted)
        dead.flush()
        log.info(
            "%s batch %d: %d events in %.1f s",
            store.name,
            batch_id,
            summary["n"],
            time.monotonic() - started,
        )
        _record(batch_id, summary, offsets, None, cutoffs, ages, started_ms)

    def _write_partitions(
        batch: Any,
        topics: dict[str, str],
        tables: dict[str, Table],
        batch_id: int,
        cutoffs: dict[str, tuple[int, int]],
        mode: str,
        started_ms: int,
    ) -> None:
        """A Python store's batch goes through materializers/apply/writer.py: a small one
        (`mode` "driver") here, collected in partition order and written through the
        driver's own connection, as cheap as a micro-batch gets (no Python worker, no
        connection per task, no per-task imports: bench/results/streaming.jsonl); a
        larger one ("workers", or "bulk": a catch-up, Store.bulk) by Spark's Python
        workers, partition by partition. Either way the driver gets the counts, the dead
        letters and the batch's TRUNCATEs. A TRUNCATE is applied after the batch's
        writes: it empties what was written before its LSN, which is what applying it
        first and leaving out the older events would have left."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        mapping = F.create_map(*[x for t, n in topics.items() for x in (F.lit(t), F.lit(n))])
        frame = batch.select(
            mapping[F.col("topic")].alias("table"),
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
        ).where("table IS NOT NULL")
        topic_of = functools.partial(change_topic, settings.pipeline)
        offsets: dict[str, int] = {}
        counts = {"written": 0, "stale": 0}
        summary: dict[str, Any] = {"n": 0, "commit_ms": None, "commit_lsn": 0}
        truncations = []
        results: list[Any]
        if mode == "driver":
            assert isinstance(store, RowStore)
            here = partition_writer(
                lambda: store,
                tables,
                topic_of,
                TRUNCATIONS_TABLE,
                cutoffs,
                chunk,
                close=False,
                started_ms=started_ms,
            )
            arrow = frame.toArrow()  # partition by partition, each in offset order
            results = pa.Table.from_batches(
                list(here(iter(arrow.to_batches()))), schema=result_schema()
            ).to_pylist()
        else:
            run = partition_writer(
                functools.partial(
                    make_row_store, executor_settings(settings, store.name), store.name
                ),
                tables,
                topic_of,
                TRUNCATIONS_TABLE,
                cutoffs,
                chunk,
                started_ms=started_ms,
            )
            if mode == "bulk":  # a batch of a backlog: written for throughput (Store.bulk)
                store.bulk(tables.values(), on=True)
            try:
                results = frame.mapInArrow(run, RESULT_DDL).collect()
            finally:
                if mode == "bulk":  # before the batch commits: its writes are visible then
                    store.bulk(tables.values(), on=False)
        ages: dict[int, int] = {}
        for row in results:
            if row["kind"] == "age":
                ages[row["bucket"]] = ages.get(row["bucket"], 0) + row["n"]
                continue
            if row["kind"] == "dead":
                dead.send_row(row)
                continue
            if row["kind"] == "truncate":
                truncations.append(row)
                continue
            summary["commit_lsn"] = max(row["commit_lsn"] or 0, summary["commit_lsn"])
            where = f"{row['topic']}:{row['partition']}"
            offsets[where] = max(row["offset"], offsets.get(where, -1))
            summary["n"] += row["n"] or 0
            if row["commit_ms"] is not None:
                summary["commit_ms"] = max(row["commit_ms"], summary["commit_ms"] or 0)
            counts["written"] += row["written"] or 0
            counts["stale"] += row["stale"] or 0
        dead.flush()
        for row in sorted(truncations, key=lambda r: (r["commit_lsn"], r["lsn"])):
            if row["table"] in tables:
                at = (row["commit_lsn"], row["lsn"])
                store.truncate(tables[row["table"]], at, row["commit_ms"])
                cutoffs[row["table"]] = max(at, cutoffs.get(row["table"], (0, 0)))
        log.info("%s batch %d: %s", store.name, batch_id, counts)
        _record(batch_id, summary, offsets, counts, cutoffs, ages, started_ms)

    def _truncated(
        parsed: Any, tables: dict[str, Table], cutoffs: dict[str, tuple[int, int]], found: bool
    ) -> Any:
        """Apply the batch's TRUNCATEs (rows of cdc.truncations; `found`: the batch has
        some) to the store, in position order, adding them to `cutoffs` (and to `cuts`,
        with their commit times). Returns, per event, the commit time of the first
        TRUNCATE after it (NULL for the events after their table's last TRUNCATE). The
        cut-offs are kept in the progress file, so an event from before a TRUNCATE that
        comes in a later batch (another topic, read further behind) is known as such."""
        from pyspark.sql import functions as F

        rows = (
            parsed.where(F.col("table") == TRUNCATIONS_TABLE)
            .where("error IS NULL AND op IN ('c', 'r')")
            .select(
                F.get_json_object("after", "$.table_name").alias("name"),
                "commit_lsn",
                "lsn",
                "commit_ms",
            )
            .orderBy("commit_lsn", "lsn")
            .collect()
            if found
            else []
        )
        for row in rows:
            if row["name"] in tables:
                at = (row["commit_lsn"], row["lsn"])
                store.truncate(tables[row["name"]], at, row["commit_ms"])
                cutoffs[row["name"]] = max(at, cutoffs.get(row["name"], (0, 0)))
                cuts[row["name"]] = add_cut(cuts.get(row["name"], []), at, row["commit_ms"])
        cut_ms = F.lit(None).cast("long")
        for name, table_cuts in cuts.items():
            # the first TRUNCATE after the event (cut_for); tombstones (no position)
            # follow their delete event, which the cut-off judges
            first = None
            for commit, lsn, ms in table_cuts:
                before = (
                    (F.col("table") == name)
                    & F.col("commit_lsn").isNotNull()
                    & (
                        (F.col("commit_lsn") < commit)
                        | ((F.col("commit_lsn") == commit) & (F.col("lsn") <= lsn))
                    )
                )
                first = F.when(before, F.lit(ms)) if first is None else first.when(before, ms)
            if first is not None:
                cut_ms = first.otherwise(cut_ms)
        return cut_ms

    def _record(
        batch_id: int,
        summary: Any,
        offsets: dict[str, int],
        counts: Any,
        cutoffs: dict[str, tuple[int, int]],
        ages: dict[int, int],
        started_ms: int,
    ) -> None:
        previous = read_progress(settings, store.name) or Progress()
        applied_ms = int(time.time() * 1000)
        freshness = Freshness.from_json(previous.freshness)
        freshness.add(ages, applied_ms - started_ms, applied_ms, settings.apply.freshness_window_s)
        commit_ms = summary["commit_ms"] if summary and summary["n"] else previous.commit_ms
        newest = [summary.get("commit_lsn") or 0, previous.commit_lsn]
        newest += [commit for commit, _ in cutoffs.values()]
        record = Progress(
            batch=batch_id,
            applied={**previous.applied, **offsets},
            # the id of each topic the store has applied records of
            topic_ids={
                **previous.topic_ids,
                **{
                    t: i
                    for t, i in topic_ids.items()
                    if any(o.startswith(f"{t}:") for o in offsets)
                },
            },
            commit_lsn=max(newest),  # the newest source position the store took
            commit_ms=commit_ms,
            applied_ms=applied_ms,
            last_batch=counts,
            truncated=dict(cutoffs),
            truncations=dict(cuts),
            generation=previous.generation,  # the last one swept
            source=list(source.lineage) if source.lineage else previous.source,
            pid=os.getpid(),
            freshness=freshness.to_json(),
        )
        write_progress(settings, store.name, record)

    return write


class _EndOffsets:
    """The change topics' end offsets, asked of Kafka by the driver before each batch."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: Any = None
        self._admin: Any = None
        self.ids: dict[str, str] = {}  # topic -> its id, as the last check found it

    def read(self, topics: dict[str, str]) -> dict[tuple[str, int], int]:
        """The end offset of each partition of `topics` (a deleted topic has none)."""
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(
                **kafka_client_kwargs(self.settings.kafka), enable_auto_commit=False
            )
        parts = [
            TopicPartition(t, p)
            for t in topics
            for p in self._consumer.partitions_for_topic(t) or ()
        ]
        if not parts:
            return {}
        return {(tp.topic, tp.partition): e for tp, e in self._consumer.end_offsets(parts).items()}

    def check_not_rewound(
        self, store: str, topics: dict[str, str], progress: Progress
    ) -> dict[tuple[str, int], int]:
        """Raise LogRewoundError if a topic ends before what `store` has applied of it
        (the topic was deleted and created again: its offsets started over, and what the
        store holds no longer matches the log): its id is not the one the store applied
        records of, a partition the store applied is gone, or a partition ends before
        what the store applied. Returns the topics' end offsets."""
        ends = self.read(topics)
        wanted = progress.applied_of(topics)
        self.ids = self._topic_ids(sorted({t for t, _ in ends}))

        def rewound(topic: str, why: str) -> LogRewoundError:
            return LogRewoundError(
                f"change topic {topic} {why}: the topic was deleted and created again; "
                f"rebuild that store's table from the log with `cdc rebuild --store {store} "
                f"--table {topics[topic]}`"
            )

        for topic, held in sorted(self.ids.items()):
            if progress.topic_ids.get(topic, held) != held:
                raise rewound(
                    topic, f"is not the one the {store} applied records of (its id changed)"
                )
        present = {t for t, _ in ends}
        for (topic, partition), offset in sorted(wanted.items()):
            end = ends.get((topic, partition))
            if topic in present and end is None:
                raise rewound(topic, f"has no partition {partition}, which the {store} applied")
            if end is not None and end <= offset:
                raise rewound(
                    topic,
                    f"partition {partition} ends at offset {end}, before offset {offset} "
                    f"that the {store} has applied",
                )
        return ends

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Each topic's id (KIP-516), as Kafka describes it now."""
        if not topics:
            return {}
        if self._admin is None:
            self._admin = kafka_admin(self.settings.kafka, timeout_ms=30000)
        return {
            t["name"]: str(t["topic_id"])
            for t in self._admin.describe_topics(topics)
            if t.get("topic_id") and not t.get("error_code")
        }


def backlog(ends: dict[tuple[str, int], int], applied: dict[tuple[str, int], int]) -> int:
    """The log's records after what a store has applied (its last offset per partition)."""
    return sum(max(0, end - applied.get(where, -1) - 1) for where, end in ends.items())


def _unheld_as_errors(parsed: Any, tables: dict[str, Table]) -> Any:
    """The warehouse's events, those holding a value it cannot hold (NaN or an infinity
    in a numeric(p,s), a time beyond Spark's types) marked as errors: they go to the
    dead-letter topic for the warehouse alone, never in as NULL."""
    from pyspark.sql import functions as F

    lost = None
    for name, table in sorted(tables.items()):
        names = unheld_columns(table, F.col("after"))
        if not table.columns or names is None:
            continue
        mine = F.col("table") == name
        lost = F.when(mine, names) if lost is None else lost.when(mine, names)
    if lost is None:
        return parsed
    lost = F.coalesce(lost, F.array().cast("array<string>"))
    said = F.concat(
        F.lit("the warehouse cannot hold the value of "),
        F.array_join(lost, ", "),
        F.lit(" (NaN or an infinity in a numeric(p,s), or a time beyond Spark's types)"),
    )
    return parsed.withColumn(
        "error",
        F.when(F.col("error").isNull() & (F.size(lost) > 0), said).otherwise(F.col("error")),
    )


def unavailable_reason(
    exc: BaseException, kind: type[CdcError] = StoreUnavailableError
) -> str | None:
    """The one-line reason when `exc` says a store (`kind`: or PostgreSQL, with
    SourceUnavailableError) does not answer, raised here or in a Python worker and
    carried back by Spark as text; None for any other error."""
    if isinstance(exc, kind):
        return str(exc)
    text = str(exc)
    marker = f"{kind.__name__}: "
    if marker not in text:
        return None
    return text[text.rindex(marker) + len(marker) :].splitlines()[0].strip()


def notify(line: str) -> None:
    """One line for the person running `cdc apply` (a store's state changed)."""
    print(f"cdc apply: {line}", file=sys.stderr, flush=True)


def _wait_for(
    settings: Settings, store: str, why: str, batch_id: int, ping: Callable[[], None]
) -> None:
    """Wait until `ping` passes (the store, or PostgreSQL, answers again), saying so once,
    and showing it in `cdc status` (the progress record's `waiting`) meanwhile."""
    notify(f"{store}: {why}; batch {batch_id} waits (nothing committed or dropped)")
    set_waiting(settings, store, why)
    pause = 1.0
    try:
        while True:
            time.sleep(pause)
            try:
                ping()
                return
            except (StoreUnavailableError, SourceUnavailableError):
                pause = min(pause * 2, 10.0)
            except Exception as exc:  # any other answer: try the batch again
                log.info("%s: ping: %s", store, exc)
                return
    finally:
        set_waiting(settings, store, None)


def run_apply(
    settings: Settings,
    stores: list[str] | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Run the apply job. once: apply what the topics hold now, then return."""
    spark = spark_session(settings, f"cdc-apply-{settings.pipeline.name}")
    tables = captured_tables(settings)
    check_rewrites(settings, tables.values(), notify)  # DDL while the job was down
    selected = stores or list(settings.apply.stores)
    apart = None  # the warehouse, in a process of its own (materializers/apply/warehouse_process)
    if (
        not once
        and settings.apply.warehouse_apart
        and "warehouse" in selected
        and len(selected) > 1
    ):
        selected = [s for s in selected if s != "warehouse"]
        apart = WarehouseProcess(settings)
    if "warehouse" in selected:
        check_views(settings, tables)
    starters: dict[str, Callable[[], Any]] = {}
    for name in selected:
        store = make_store(settings, name, spark)
        _prepare(settings, store, tables)
        starters[name] = functools.partial(_start_store_query, spark, settings, store, once)
    for window in settings.apply.windows if "warehouse" in selected else []:
        starters[f"window-{window.name}"] = functools.partial(
            _start_window_query, spark, settings, window, window_query, tables[window.table], once
        )
    for join in settings.apply.joins if "warehouse" in selected else []:
        if join.kind == "stream_stream":  # a query of its own, with a watermark, as a window's
            starters[f"window-{join.name}"] = functools.partial(
                _start_window_query, spark, settings, join, stream_join_query, tables, once
            )
    late = _LateNotes(settings)
    if late.names:
        late.listen(spark)
    try:
        with _publishing(settings, selected, once):
            _run_queries(settings, starters, apart, late, once, stop)
    finally:
        late.stop(spark)


@contextlib.contextmanager
def _publishing(settings: Settings, selected: list[str], once: bool) -> Iterator[None]:
    """apply.iceberg: the warehouse's tables published as Iceberg tables while the job
    runs (every trigger interval, in a thread of their own), and once more at the end of
    a run `once` (whose failure is the run's)."""
    if not (settings.apply.iceberg and "warehouse" in selected):
        yield
        return
    publisher = IcebergPublisher(warehouse_base(settings), warehouse_root(settings))
    done = threading.Event()

    def publish() -> None:
        while not done.is_set():
            try:
                publisher.publish_all(notify)
            except Exception as exc:  # e.g. the catalog unreachable: said, tried again
                notify(f"iceberg: not published ({failure_line(exc)}); trying again")
            done.wait(max(settings.apply.trigger_interval_s, 1.0))

    thread = None if once else threading.Thread(target=publish, name="iceberg", daemon=True)
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join(60)
    if once:
        publisher.publish_all(notify, strict=True)


def _run_queries(
    settings: Settings,
    starters: dict[str, Callable[[], Any]],
    apart: WarehouseProcess | None,
    late: _LateNotes,
    once: bool,
    stop: threading.Event | None,
) -> None:
    """Start the queries, then (once) wait for them to end, or keep them running until
    `stop`, starting a failed one again."""
    queries = {name: start() for name, start in starters.items()}
    windows = {n[len("window-") :]: q for n, q in queries.items() if n.startswith("window-")}
    if apart is not None:
        apart.start()
        nice = settings.apply.warehouse_nice
        notify(f"warehouse: in a process of its own (pid {apart.pid}, nice {nice})")
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
        late.catch_up(windows)
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
                notify(f"{name}: stopped ({failure_line(error)}); starting it again in {pause} s")
                if stop is not None and stop.wait(pause):
                    return
                if stop is None:
                    time.sleep(pause)
                try:
                    queries[name] = starters[name]()
                except Exception as exc:  # e.g. Kafka not back yet: the next round tries again
                    notify(f"{name}: could not start again ({failure_line(exc)})")
                    continue
                if name.startswith("window-"):
                    windows[name[len("window-") :]] = queries[name]
            if apart is not None:
                _watch_apart(apart, failures, stop)
            late.note_recent(windows)
            # (never a query's awaitTermination here: it raises the query's failure,
            # which the loop above restarts the query for)
            if stop is None:
                time.sleep(1)
            else:
                stop.wait(1)
    finally:
        for query in queries.values():
            query.stop()
        if apart is not None:
            apart.stop()


# what the warehouse's process exits with when starting it again cannot help: a setting,
# an install, or a log or source that went back
_FATAL_EXITS = {e.exit_code: e for e in (ConfigError, NotInstalledError, LogRewoundError)}


def _watch_apart(
    apart: WarehouseProcess, failures: dict[str, int], stop: threading.Event | None
) -> None:
    """Start the warehouse's process again when it has stopped (after a pause that grows
    with its failures), as a failed query is; raise its error when that cannot help."""
    code = apart.exit_code()
    if code is None:
        return
    said = apart.last_said
    if code in _FATAL_EXITS:
        raise _FATAL_EXITS[code](f"the warehouse's apply process stopped: {said}")
    failures["warehouse"] = failures.get("warehouse", 0) + 1
    pause = min(2 ** failures["warehouse"], 60)
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    notify(
        f"warehouse: its process exited ({how}{'; ' + said if said else ''}); "
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

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.readers = {w.name: late_readers(w) for w in settings.apply.windows}
        prefix = f"cdc-{settings.pipeline.name}-"
        self.names = {f"{prefix}window-{w.name}": w.name for w in settings.apply.windows}
        self.names |= {f"{prefix}join-{j.name}": j.name for j in settings.apply.joins}
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}  # window -> the newest batch id of a report noted
        self._listener: Any = None

    def note(self, name: str, reports: list[dict[str, Any]]) -> None:
        with self._lock:
            note_late(self.settings, name, reports, self.readers.get(name, 1))
            for report in reports:
                self._seen[name] = max(self._seen.get(name, -1), int(report["batchId"]))

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
                pass

        self._listener = _Listener()
        spark.streams.addListener(self._listener)

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
                return f"{m[1]}: {m[2]}"[:300]
    return text.splitlines()[0][:300]


def _fatal(exc: BaseException) -> CdcError | None:
    """The error that must stop the apply job (not be retried), from a query's failure."""
    text = str(exc)
    for kind in (SourceRewoundError, LogRewoundError):
        marker = f"{kind.__name__}: "
        if marker in text:
            return kind(text[text.rindex(marker) + len(marker) :].splitlines()[0])
    return None


def check_source_not_rewound(store: str, wal: int, progress: Progress) -> None:
    """Raise SourceRewoundError if the source's WAL is behind a position `store` has
    applied (a change or a TRUNCATE): the database was restored from a backup or
    replaced, and every change it makes now would be refused as older."""
    taken = [progress.commit_lsn or 0]
    taken += [commit for commit, _ in progress.truncated.values()]
    if wal and wal < max(taken):
        raise SourceRewoundError(
            f"PostgreSQL's WAL is at {int_to_lsn(wal)}, behind changes the {store} store "
            f"has applied (up to {int_to_lsn(max(taken))}): the database was restored or "
            "replaced, and its changes would be refused as older. Stop `cdc apply`, run "
            "`cdc drop`, set a new pipeline.topic_prefix (the old topics hold what it "
            "lost), `cdc snapshot`, then `cdc rebuild --store S` for each store"
        )


def check_source_lineage(
    store: str,
    lineage: tuple[str, int | None] | None,
    forks: Callable[[int], dict[int, int]],
    progress: Progress,
) -> None:
    """Raise SourceRewoundError if the source is not the database `store` applied changes
    of (another system identifier), or has moved to a timeline that left the one the
    store applied from before a position the store holds: restored to a point in time,
    or a standby promoted before it had received those changes. `forks(timeline)`: per
    ancestor timeline, where the current one left it (its history file)."""
    if lineage is None or not progress.source:
        return
    (system, timeline), (now_system, now_timeline) = progress.source, lineage
    remedy = (
        "Stop `cdc apply`, run `cdc drop`, set a new pipeline.topic_prefix (the old topics "
        "hold what it lost), `cdc snapshot`, then `cdc rebuild --store S` for each store"
    )
    if system != now_system:
        raise SourceRewoundError(
            f"PostgreSQL is another database cluster (system identifier {now_system}) than "
            f"the one the {store} store applied changes of ({system}): it was replaced. " + remedy
        )
    if now_timeline is None or timeline is None or now_timeline == timeline:
        return
    taken = max([progress.commit_lsn or 0, *(c for c, _ in progress.truncated.values())])
    left = forks(now_timeline).get(timeline)
    if left is None or taken >= left:
        where = f"left it at {int_to_lsn(left)}" if left is not None else "does not descend from it"
        raise SourceRewoundError(
            f"PostgreSQL writes on timeline {now_timeline}, which {where}, and the {store} "
            f"store applied changes of timeline {timeline} up to {int_to_lsn(taken)}: the "
            "database was restored to an earlier point, or a standby was promoted before it "
            "had them, and those changes are gone from it. " + remedy
        )


def _prepare(settings: Settings, store: Store, tables: dict[str, Table]) -> None:
    """The store's indexes, tables...; a store that does not answer yet is waited for."""
    while True:
        try:
            store.prepare(tables.values())
            return
        except StoreUnavailableError as exc:
            _wait_for(settings, store.name, str(exc), -1, store.ping)


def _start_store_query(spark: Any, settings: Settings, store: Store, once: bool) -> Any:
    limit = settings.apply.max_offsets_per_trigger
    if isinstance(store, FrameStore):  # Delta: fewer, larger commits when catching up
        limit = settings.apply.warehouse_max_offsets_per_trigger
    source = (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings))
        # every change topic of the pipeline, also of tables added while it runs
        .option("subscribePattern", change_topic_pattern(settings.pipeline))
        .option("startingOffsets", "earliest")
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
        .option("checkpointLocation", str(checkpoint_dir(settings, store.name)))
        .foreachBatch(_batch_writer(settings, store))
    )
    return _triggered(settings, writer, once).start()


def _start_window_query(
    spark: Any, settings: Settings, view: Any, query: Callable[..., Any], read: Any, once: bool
) -> Any:
    """A window aggregate's or stream-stream join's query (`query`, streams.py)."""
    checkpoint = checkpoint_dir(settings, f"window-{view.name}")
    forget_other_definition(checkpoint, f"{view.model_dump_json()} plan {PLAN}")
    # a pool of its own (the query's thread inherits it from this one)
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", f"window-{view.name}")
    writer = query(spark, settings, view, read, str(checkpoint))
    return _triggered(settings, writer, once, settings.apply.views_trigger_interval_s).start()


def _triggered(settings: Settings, writer: Any, once: bool, every: float | None = None) -> Any:
    if once:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{every or settings.apply.trigger_interval_s} seconds")
