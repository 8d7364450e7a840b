"""One store's side of each micro-batch of its query (`foreachBatch`): a `BatchWriter`,
in named steps, each a method of its own:

1. read the source's catalog and WAL position, and note DDL that changed stored values;
2. generated columns: computed by PostgreSQL (the log has none);
3. position guard (guards.py): the log and the source are still the ones the store
   applied from;
   Records the snapshot wrote into the store itself are left out (the store holds them:
   cdc/capture/snapshot/held.py); while a snapshot writes the store, its batch waits;
4. decode and write: a row store's batch (the cache, the search index) through
   row_batches.py, on the driver or in Spark's workers; a frame store's (the warehouse)
   whole, by `FrameStore.write_batch`, which chooses its own route; either way the
   batch's TRUNCATEs, and poison events to the dead-letter topic (dead_letters.py),
   and a BatchOutcome (cdc/stores/base.py) back;
5. sweep: rows from before a new snapshot generation, once it is whole;
6. progress: what the store applied, recorded (cdc/log/progress.py).

A store (or PostgreSQL) that does not answer blocks its own batch: nothing is committed,
nothing goes to the dead-letter topic; the batch is written again once it answers.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from cdc.apply.dead_letters import DeadLetters
from cdc.apply.guards import (
    EndOffsets,
    check_source_lineage,
    check_source_not_rewound,
)
from cdc.apply.row_batches import RESULT_DDL, partition_writer, result_schema
from cdc.capture.rewrites import Rewrite
from cdc.capture.snapshot.held import read_held, snapshot_writes
from cdc.capture.source_view import SourceBatch, SourceView
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.errors import (
    CdcError,
    RelationReusedError,
    SourceUnavailableError,
    StoreBusyError,
    StoreUnavailableError,
    carried_message,
)
from cdc.core.postgres_client import ping_source
from cdc.core.say import on_stderr
from cdc.core.settings import Settings
from cdc.core.spark import execution_profile
from cdc.core.topics import change_topic
from cdc.log.freshness import add_freshness
from cdc.log.generated_columns import with_generated
from cdc.log.progress import Progress, read_progress, set_waiting, write_progress
from cdc.stores.base import BatchContext, BatchOutcome, FrameStore, RowStore, StoreWriter
from cdc.stores.registry import executor_settings, make_row_store

__all__ = ["BULK_EVENTS", "BatchWriter", "apply_say", "unavailable_reason", "wait_for"]

log = logging.getLogger(__name__)

# a batch is written in bulk (StoreWriter.bulk) when the store is at least this many events
# behind the log at its start: a catch-up, never a steady batch
BULK_EVENTS = 20_000


class BatchWriter:
    """One store's batch writer (module doc): called with each micro-batch and its id."""

    def __init__(
        self,
        settings: Settings,
        store: StoreWriter,
        chunk: int = 5000,
        rewritten: Callable[[list[Rewrite]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.chunk = chunk
        self.dead = DeadLetters(settings, store.name)
        self.ends = EndOffsets(settings)
        self.profile, _ = execution_profile(settings)  # local or cluster (apply.profile)
        self.source = SourceView(settings)  # every read of the source side, one door
        self.seen: SourceBatch | None = None  # what the batch read of it, at its start
        # where the tables DDL rewrote go: intents the job acts on (job.py); a batch
        # never starts a backfill itself
        self.rewritten = rewritten or (lambda found: None)
        # table -> its TRUNCATEs with their commit times (Progress.truncations)
        self.truncate_log: dict[str, list[list[int]]] = {}
        self.topic_ids: dict[str, str] = {}  # topic -> its id, as the batch's guard found it
        self._topics: tuple[tuple[str, ...], dict[str, str]] = ((), {})  # self.topics()

    def __call__(self, batch: Any, batch_id: int) -> None:
        """Write the batch, waiting for the store (or PostgreSQL) while it does not answer."""
        name = self.store.name
        # each store's queries run in a scheduler pool of their own (FAIR between pools)
        batch.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", name)
        waited = False
        while True:
            try:
                self.write_once(batch, batch_id)
            except RelationReusedError as exc:
                # applied, its changes would land on the other relation's rows
                wait_for(self.settings, name, str(exc), batch_id, self.check_relations)
                waited = True
                continue
            except StoreBusyError as exc:  # the snapshot writes the store itself
                wait_for(self.settings, name, str(exc), batch_id, self.check_snapshot)
                waited = True
                continue
            except Exception as exc:
                why = unavailable_reason(exc)
                if why is not None:
                    wait_for(self.settings, name, why, batch_id, self.store.ping)
                elif (source := unavailable_reason(exc, SourceUnavailableError)) is not None:
                    # the catalog is read every batch, generated columns computed in the
                    # Python workers: each waits for PostgreSQL likewise
                    ping = functools.partial(ping_source, self.settings)
                    wait_for(self.settings, name, source, batch_id, ping)
                else:
                    raise
                waited = True
                continue
            if waited:
                apply_say(f"{name}: answers again; batch {batch_id} written")
            return

    def write_once(self, batch: Any, batch_id: int) -> None:
        """The steps of one batch (module doc), once."""
        started_ms = int(time.time() * 1000)  # events' ages are counted from here
        self.seen = seen = self.source.read_batch()
        tables, wal = seen.tables, seen.wal
        self.check_relations(read=False)
        if seen.rewrites:
            self.rewritten(seen.rewrites)
        topics = self.topics(tables)
        batch = with_generated(batch, self.settings, topics, tables)
        progress, behind = self.guard(topics, wal)
        batch, held = self.without_held(batch, progress)
        last_truncate = dict(progress.truncated)
        self.truncate_log.clear()
        self.truncate_log.update(progress.truncations)
        if isinstance(self.store, RowStore):
            mode = self.mode(behind)
            outcome = self.write_rows(
                batch, topics, tables, batch_id, last_truncate, mode, started_ms
            )
        else:
            assert isinstance(self.store, FrameStore)
            ctx = BatchContext(
                batch_id=batch_id,
                started_ms=started_ms,
                topics=topics,
                tables=tables,
                behind=behind,
                last_truncate=last_truncate,
                truncate_log=self.truncate_log,
                emptied_by=functools.partial(self.emptied_by, tables=tables),
                dead_letter=self.dead.send_row,
            )
            outcome = self.store.write_batch(batch, ctx)
            self.dead.flush()
        for where, offset in held.items():  # applied: the store holds them
            outcome.offsets[where] = max(offset, outcome.offsets.get(where, -1))
        record = self.record(batch_id, outcome, last_truncate, started_ms, progress)
        self.sweep_generation(tables, record)

    def check_snapshot(self) -> None:
        """StoreBusyError while a snapshot writes the store itself (capture/snapshot/held.py)."""
        if snapshot_writes(self.settings, self.store.name):
            raise StoreBusyError(
                "`cdc snapshot` writes its rows into it itself; its batches wait until that ends"
            )

    def without_held(self, batch: Any, progress: Progress) -> tuple[Any, dict[str, int]]:
        """The batch without the records the snapshot wrote into the store itself, and
        the last offset of those, per "topic:partition" (applied: the store holds them).
        Waits (StoreBusyError) while a snapshot writes the store. Once the store has
        applied past what it holds so, nothing is read here but a small file."""
        from pyspark.sql import functions as F

        held = read_held(self.settings, self.store.name)
        if held is None or (held.ends and held.covers(progress.applied)):
            return batch, {}
        self.check_snapshot()
        if not held.ends:
            return batch, {}
        below = F.lit(False)
        for where, end in sorted(held.ends.items()):
            topic, _, part = where.rpartition(":")
            below = below | (
                (F.col("topic") == topic)
                & (F.col("partition") == int(part))
                & (F.col("offset") < end)
            )
        found = (
            batch.where(below)
            .groupBy("topic", "partition")
            .agg(F.max("offset").alias("offset"))
            .collect()
        )
        if not found:
            return batch, {}
        log.info(
            "%s: records the snapshot wrote into it skipped in %d partition(s)",
            self.store.name,
            len(found),
        )
        return batch.where(~below), {f"{r['topic']}:{r['partition']}": r["offset"] for r in found}

    def check_relations(self, read: bool = True) -> None:
        """Refuse a batch while a captured name belongs to another captured relation
        (two tables swapped: identity.reused), as the source's last read (`read`: a new
        one) found it."""
        if read or self.seen is None:
            self.seen = self.source.read_batch()
        if self.seen.reused:
            raise RelationReusedError(
                f"{', '.join(self.seen.reused)}: another captured table than the one "
                "captured under this name has it now (tables swapped, or one renamed onto a "
                "dropped one's name), and its changes would land on the other's rows: run "
                "`cdc setup`, which cuts and backfills it"
            )

    def topics(self, tables: dict[str, Table]) -> dict[str, str]:
        """Each change topic of the batch (the captured tables' and the TRUNCATEs') and
        its table's name; made again only when the captured tables change."""
        names = (*tables, TRUNCATIONS_TABLE)
        if self._topics[0] != names:
            self._topics = (names, {change_topic(self.settings.pipeline, t): t for t in names})
        return self._topics[1]

    def guard(self, topics: dict[str, str], wal: int) -> tuple[Progress, int]:
        """The store's progress, once the source and the log are still the ones it applied
        from (guards.py), and how many records of the log it is behind."""
        name = self.store.name
        progress = read_progress(self.settings, name) or Progress()
        check_source_not_rewound(name, wal, progress)
        lineage = self.seen.lineage if self.seen else None
        check_source_lineage(name, lineage, self.source.forks, progress)
        behind = self.ends.check_not_rewound(name, topics, progress)
        self.topic_ids.update(self.ends.ids)
        return progress, behind

    def mode(self, behind: int) -> str:
        """Where a row store's batch is written (write_rows), by how far behind it is; the
        cluster profile (apply.profile) never writes one through the driver."""
        if behind >= BULK_EVENTS:
            return "bulk"
        if self.profile == "cluster":
            return "workers"
        return "driver" if behind <= self.settings.apply.driver_batch_events else "workers"

    def write_rows(
        self,
        batch: Any,
        topics: dict[str, str],
        tables: dict[str, Table],
        batch_id: int,
        last_truncate: dict[str, tuple[int, int]],
        mode: str,
        started_ms: int,
    ) -> BatchOutcome:
        """A Python store's batch goes through cdc/apply/row_batches.py: a small one
        (`mode` "driver") here, collected in partition order and written through the
        driver's own connection, as cheap as a micro-batch gets (no Python worker, no
        connection per task, no per-task imports: bench/results/streaming.jsonl); a
        larger one ("workers", or "bulk": a catch-up, StoreWriter.bulk) by Spark's Python
        workers, partition by partition. Either way the driver gets the counts, the dead
        letters and the batch's TRUNCATEs. A TRUNCATE is applied after the batch's
        writes: it empties what was written before its LSN, which is what applying it
        first and leaving out the older events would have left."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        store = self.store
        mapping = F.create_map(*[x for t, n in topics.items() for x in (F.lit(t), F.lit(n))])
        frame = batch.select(
            mapping[F.col("topic")].alias("table"),
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
        ).where("table IS NOT NULL")
        topic_of = functools.partial(change_topic, self.settings.pipeline)
        counts = {"written": 0, "stale": 0}
        outcome = BatchOutcome(counts=counts, route=mode)
        offsets = outcome.offsets
        truncations = []
        results: list[Any]
        if mode == "driver":
            assert isinstance(store, RowStore)
            here = partition_writer(
                lambda: store,
                tables,
                topic_of,
                TRUNCATIONS_TABLE,
                last_truncate,
                self.chunk,
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
                    make_row_store, executor_settings(self.settings, store.name), store.name
                ),
                tables,
                topic_of,
                TRUNCATIONS_TABLE,
                last_truncate,
                self.chunk,
                started_ms=started_ms,
            )
            tasks = self.settings.apply.row_store_tasks
            if tasks:  # more writers than partitions: a key's events in one task, in order
                frame = frame.repartition(tasks, "table", "key").sortWithinPartitions(
                    "topic", "partition", "offset"
                )
            if mode == "bulk":  # a batch of a backlog: written for throughput (StoreWriter.bulk)
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
                self.dead.send_row(row)
                outcome.dead += 1
                continue
            if row["kind"] == "truncate":
                truncations.append(row)
                continue
            outcome.commit_lsn = max(row["commit_lsn"] or 0, outcome.commit_lsn)
            where = f"{row['topic']}:{row['partition']}"
            offsets[where] = max(row["offset"], offsets.get(where, -1))
            outcome.n += row["n"] or 0
            if row["commit_ms"] is not None:
                outcome.commit_ms = max(row["commit_ms"], outcome.commit_ms or 0)
            counts["written"] += row["written"] or 0
            counts["stale"] += row["stale"] or 0
        self.dead.flush()
        for row in sorted(truncations, key=lambda r: (r["commit_lsn"], r["lsn"])):
            name = self.emptied_by(row["table"], row["relid"], tables=tables)
            if name is not None:
                at = (row["commit_lsn"], row["lsn"])
                store.truncate(tables[name], at, row["commit_ms"])
                last_truncate[name] = max(at, last_truncate.get(name, (0, 0)))
        outcome.ages = ages
        log.info("%s batch %d: %s (%s)", store.name, batch_id, counts, mode)
        return outcome

    def emptied_by(self, name: str, relid: int | None, *, tables: dict[str, Table]) -> str | None:
        """The captured table a TRUNCATE recorded under `name` emptied: that name's, or
        under a name the table only passed through (renamed and back in one transaction)
        the one its relation has now; None for a table not captured."""
        if name in tables:
            return name
        seen = self.seen or self.source.read_batch()
        now = seen.relations.get(relid) if relid is not None else None
        now = seen.renamed.get(now or "", now)  # renamed since setup: its old name
        return now if now in tables else None

    def sweep_generation(self, tables: dict[str, Table], progress: Progress) -> None:
        """Once the store holds a new snapshot generation whole, remove what it still
        holds from before it (cdc/capture/generation.py); `progress`: its record after
        the batch."""
        store = self.store
        generation = self.seen.generation if self.seen else self.source.generation()
        if generation is None or progress.generation >= generation.lsn:
            return
        if generation.previous is None:  # the first: nothing from before it to remove
            return
        if not generation.applied_by(progress.applied):
            return
        for table in tables.values():
            store.truncate(table, (generation.lsn, 0), generation.ts_ms)
        progress.generation = generation.lsn
        write_progress(self.settings, store.name, progress)
        log.info("%s: generation %d whole; rows from before it removed", store.name, generation.lsn)

    def record(
        self,
        batch_id: int,
        outcome: BatchOutcome,
        last_truncate: dict[str, tuple[int, int]],
        started_ms: int,
        previous: Progress,
    ) -> Progress:
        """The store's progress record after the batch (cdc/log/progress.py), from
        `previous`, the one its guard read; returned as written."""
        settings, name = self.settings, self.store.name
        applied_ms = int(time.time() * 1000)
        commit_ms = outcome.commit_ms if outcome.n else previous.commit_ms
        newest = [outcome.commit_lsn, previous.commit_lsn]
        newest += [commit for commit, _ in last_truncate.values()]
        offsets = outcome.offsets
        routes = dict(previous.routes)
        routes[outcome.route] = routes.get(outcome.route, 0) + 1
        record = Progress(
            batch=batch_id,
            applied={**previous.applied, **offsets},
            # the id of each topic the store has applied records of
            topic_ids={
                **previous.topic_ids,
                **{
                    t: i
                    for t, i in self.topic_ids.items()
                    if any(o.startswith(f"{t}:") for o in offsets)
                },
            },
            commit_lsn=max(newest),  # the newest source position the store took
            commit_ms=commit_ms,
            applied_ms=applied_ms,
            last_batch=outcome.counts,
            truncated=dict(last_truncate),
            truncations=dict(self.truncate_log),
            generation=previous.generation,  # the last one swept
            source=list(self.seen.lineage) if self.seen and self.seen.lineage else previous.source,
            pid=os.getpid(),
            freshness=add_freshness(
                previous.freshness,
                outcome.ages,
                applied_ms - started_ms,
                applied_ms,
                settings.apply.freshness_window_s,
            ),
            written_by_spark=outcome.written_by_spark,
            route=outcome.route,
            routes=routes,
        )
        write_progress(settings, name, record)
        return record


def unavailable_reason(
    exc: BaseException, kind: type[CdcError] = StoreUnavailableError
) -> str | None:
    """The one-line reason when `exc` says a store (`kind`: or PostgreSQL, with
    SourceUnavailableError) does not answer, raised here or in a Python worker and
    carried back by Spark as text; None for any other error."""
    return carried_message(exc, kind)


# the lines for the person running `cdc apply` (a store's state changed)
apply_say = on_stderr("cdc apply")


def wait_for(
    settings: Settings, store: str, why: str, batch_id: int, ping: Callable[[], None]
) -> None:
    """Wait until `ping` passes (the store, or PostgreSQL, answers again), saying so once,
    and showing it in `cdc status` (the progress record's `waiting`) meanwhile."""
    apply_say(f"{store}: {why}; batch {batch_id} waits (nothing committed or dropped)")
    set_waiting(settings, store, why)
    pause = 1.0
    try:
        while True:
            time.sleep(pause)
            try:
                ping()
                return
            except (StoreUnavailableError, SourceUnavailableError, RelationReusedError):
                pause = min(pause * 2, 10.0)
            except Exception as exc:  # any other answer: try the batch again
                log.info("%s: ping: %s", store, exc)
                return
    finally:
        set_waiting(settings, store, None)
