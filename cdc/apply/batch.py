"""One store's side of each micro-batch of its query (`foreachBatch`): a `BatchWriter`,
in named steps, each a method of its own:

1. read the source's catalog and WAL position, and note DDL that changed stored values;
2. generated columns: computed by PostgreSQL (the log has none);
3. position guard (guards.py): the log and the source are still the ones the store
   applied from;
4. decode and write: a row store's batch (the cache, the search index) through
   writer.py, on the driver or in Spark's workers; the warehouse's as one Spark frame;
   the batch's TRUNCATEs; poison events to the dead-letter topic (dead_letters.py);
5. sweep: rows from before a new snapshot generation, once it is whole;
6. progress: what the store applied, recorded (cdc/log/progress.py).

A store (or PostgreSQL) that does not answer blocks its own batch: nothing is committed,
nothing goes to the dead-letter topic; the batch is written again once it answers.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

from cdc.apply.dead_letters import DeadLetters
from cdc.apply.guards import (
    EndOffsets,
    backlog,
    check_source_lineage,
    check_source_not_rewound,
)
from cdc.apply.writer import RESULT_DDL, partition_writer, result_schema
from cdc.capture.generation import read_generation
from cdc.capture.rewrites import check_rewrites
from cdc.capture.source import SourceReader
from cdc.capture.timeline import timeline_forks
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.errors import (
    CdcError,
    RelationReusedError,
    SourceUnavailableError,
    StoreUnavailableError,
)
from cdc.core.postgres import ping_source
from cdc.core.say import on_stderr
from cdc.core.settings import Settings
from cdc.core.topics import change_topic
from cdc.log.arrow_events import ArrowBatch, decode_records
from cdc.log.envelope import parse_events
from cdc.log.freshness import RATIO, Freshness
from cdc.log.generated import expressions_dsn, with_generated
from cdc.log.progress import (
    Progress,
    add_cut,
    read_progress,
    set_waiting,
    write_progress,
)
from cdc.stores.base import FrameStore, RowStore, StoreWriter
from cdc.stores.registry import executor_settings, make_row_store
from cdc.types.arrow_types import decodable
from cdc.types.spark_types import may_hold_placeholder, unheld_columns

__all__ = ["BULK_EVENTS", "BatchWriter", "apply_say", "unavailable_reason", "wait_for"]

log = logging.getLogger(__name__)

# a batch is written in bulk (StoreWriter.bulk) when the store is at least this many events
# behind the log at its start: a catch-up, never a steady batch
BULK_EVENTS = 20_000
# the records whose sizes tell a warehouse batch's, when no batch was collected before it
SAMPLE_RECORDS = 200
# a batch whose row images hold fewer characters than this is collected to the driver
# again after one over spark.driver.maxResultSize was not (collect_records)
SMALL_CHARS = 128 * 1024 * 1024


class BatchWriter:
    """One store's batch writer (module doc): called with each micro-batch and its id."""

    def __init__(self, settings: Settings, store: StoreWriter, chunk: int = 5000) -> None:
        self.settings = settings
        self.store = store
        self.chunk = chunk
        self.dead = DeadLetters(settings, store.name)
        self.ends = EndOffsets(settings)
        self.source = SourceReader(settings)
        self.cuts: dict[str, list[list[int]]] = {}  # table -> its TRUNCATEs (Progress.truncations)
        self.topic_ids: dict[str, str] = {}  # topic -> its id, as the batch's guard found it
        # a batch over spark.driver.maxResultSize was collected in vain: Spark decodes the
        # batches after it until one is small again (its row images under SMALL_CHARS)
        self.collect_refused = False
        # the bytes of a Kafka record (key and value), as the last batch collected had
        # them on average: what the next one's collect is judged by (collect_records)
        self.record_bytes: float | None = None

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
        tables, wal = self.source.read()
        self.check_relations(read=False)
        check_rewrites(self.settings, tables.values(), apply_say)
        topics = {change_topic(self.settings.pipeline, t): t for t in [*tables, TRUNCATIONS_TABLE]}
        batch = self.generated_columns(batch, topics, tables)
        progress, behind = self.guard(topics, wal)
        cutoffs = dict(progress.truncated)
        self.cuts.clear()
        self.cuts.update(progress.truncations)
        if isinstance(self.store, RowStore):
            self.write_rows(batch, topics, tables, batch_id, cutoffs, self.mode(behind), started_ms)
        else:
            records = self.collect_records(batch, tables, behind)
            decoded = None
            if records is not None:
                decoded = decode_records(records, topics, tables, self.cuts, started_ms)
                if decoded is None:  # Spark decodes it, from the records collected
                    batch = batch.sparkSession.createDataFrame(records)
            if decoded is not None:
                self.write_decoded(decoded, records, topics, tables, batch_id, cutoffs, started_ms)
            else:
                parsed = self.decode(batch, topics, tables).cache()
                try:
                    self.write_frame(parsed, tables, batch_id, cutoffs, started_ms)
                finally:
                    parsed.unpersist()
        self.sweep_generation(tables)

    def collect_records(self, batch: Any, tables: dict[str, Table], behind: int) -> Any | None:
        """The batch's Kafka records in Arrow, collected once for the warehouse to decode
        on the driver (cdc/log/arrow_events.py), when every captured table's
        types decode there and the batch fits the driver's heap; None: Spark decodes the
        batch, its tasks streaming it.

        What a batch holds is not known before it is read, only how many records it has
        at most (`behind`, the store's backlog, and the trigger's limit). Its bytes are
        judged by the last collected batch's records, or a sample of this one's first
        ones: it is collected if three times those bytes (Spark's tasks copy their rows
        into Arrow batches, the driver then holds them) fit in half of Spark's heap
        (spark.driver_memory). A batch larger than Spark sends its driver
        (spark.driver.maxResultSize) all the same is decoded by Spark too."""
        store = self.store
        if not isinstance(store, FrameStore) or not store.decodes_arrow():
            return None
        if self.collect_refused or not tables:
            return None
        if not all(decodable(t) for t in tables.values()):
            return None
        import pyarrow.compute as pc

        records = batch.select("key", "value", "topic", "partition", "offset")
        most = min(behind, self.settings.apply.warehouse_max_offsets_per_trigger)
        each = self.record_bytes
        if each is None:
            each = self.sampled_bytes(records)
        budget = _heap_bytes(self.settings.spark.driver_memory) / 2
        if most * max(each, 1.0) * 3 > budget:
            log.info(
                "%s: a batch of up to %d records of ~%d bytes: decoded by Spark",
                store.name,
                most,
                each,
            )
            return None
        try:
            collected = records.toArrow()
        except Exception as exc:
            if "maxResultSize" not in str(exc):
                raise
            log.info("%s: a batch over spark.driver.maxResultSize: decoded by Spark", store.name)
            self.collect_refused = True
            return None
        if collected.num_rows:
            held = pc.sum(pc.binary_length(collected.column("value"))).as_py() or 0
            held += pc.sum(pc.binary_length(collected.column("key"))).as_py() or 0
            self.record_bytes = held / collected.num_rows
        return collected

    def check_relations(self, read: bool = True) -> None:
        """Refuse a batch while a captured name belongs to another captured relation
        (two tables swapped: identity.reused), as the source's last read (`read`: a new
        one) found it."""
        if read:
            self.source.read()
        if self.source.reused:
            raise RelationReusedError(
                f"{', '.join(self.source.reused)}: another captured table than the one "
                "captured under this name has it now (tables swapped, or one renamed onto a "
                "dropped one's name), and its changes would land on the other's rows: run "
                "`cdc setup`, which cuts and backfills it"
            )

    def generated_columns(
        self, batch: Any, topics: dict[str, str], tables: dict[str, Table]
    ) -> Any:
        """The batch with each generated column's value computed (generated.py)."""
        return with_generated(batch, expressions_dsn(self.settings), topics, tables)

    def guard(self, topics: dict[str, str], wal: int) -> tuple[Progress, int]:
        """The store's progress, once the source and the log are still the ones it applied
        from (guards.py), and how many records of the log it is behind."""
        name = self.store.name
        progress = read_progress(self.settings, name) or Progress()
        check_source_not_rewound(name, wal, progress)
        forks = functools.partial(timeline_forks, self.settings)
        check_source_lineage(name, self.source.lineage, forks, progress)
        ends = self.ends.check_not_rewound(name, topics, progress)
        self.topic_ids.update(self.ends.ids)
        return progress, backlog(ends, progress.applied_of(topics))

    def mode(self, behind: int) -> str:
        """Where a row store's batch is written (write_rows), by how far behind it is."""
        if behind >= BULK_EVENTS:
            return "bulk"
        return "driver" if behind <= self.settings.apply.driver_batch_events else "workers"

    def decode(self, batch: Any, topics: dict[str, str], tables: dict[str, Table]) -> Any:
        """The batch's events of captured tables, decoded; those holding a value the
        warehouse cannot hold marked as errors (dead letters, never in as NULL)."""
        return _unheld_as_errors(parse_events(batch, topics).where("table IS NOT NULL"), tables)

    def write_frame(
        self,
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

        store = self.store
        assert isinstance(store, FrameStore)
        valid = F.col("error").isNull()
        parts, ages = _partitions(parsed, tables, started_ms)
        if any(p["errors"] for p in parts):
            for row in parsed.where("error IS NOT NULL").toLocalIterator():
                self.dead.send_row(row)
        truncated = any(p["table"] == TRUNCATIONS_TABLE and p["n"] for p in parts)
        cut_ms = self.truncations(parsed, tables, cutoffs, found=truncated)
        data = [p for p in parts if p["table"] != TRUNCATIONS_TABLE]
        summary = _summary(data, parts)
        offsets = {f"{p['topic']}:{p['partition']}": p["offset"] for p in parts}
        present = {p["table"] for p in data if p["n"]}
        started = time.monotonic()
        events = parsed.where(valid & (F.col("table") != TRUNCATIONS_TABLE))
        # an event from before its table's last TRUNCATE is history, not current state
        toasted = {p["table"] for p in data if p["toasted"]}
        sizes: dict[str, int] = {}
        for p in data:
            sizes[p["table"]] = sizes.get(p["table"], 0) + p["size"]
        if sum(sizes.values()) < SMALL_CHARS:
            self.collect_refused = False
        store.write_frame(tables, events.withColumn("cut_ms", cut_ms), present, toasted, sizes)
        self.dead.flush()
        log.info(
            "%s batch %d: %d events in %.1f s",
            store.name,
            batch_id,
            summary["n"],
            time.monotonic() - started,
        )
        self.record(batch_id, summary, offsets, None, cutoffs, ages, started_ms)

    def sampled_bytes(self, records: Any) -> float:
        """The mean bytes (key and value) of the batch's first records, read alone."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
        sample = records.select(size.alias("n")).limit(SAMPLE_RECORDS).toArrow()
        return float(pc.mean(sample.column("n")).as_py() or 0) if sample.num_rows else 0.0

    def write_decoded(
        self,
        decoded: ArrowBatch,
        records: Any,
        topics: dict[str, str],
        tables: dict[str, Table],
        batch_id: int,
        cutoffs: dict[str, tuple[int, int]],
        started_ms: int,
    ) -> None:
        """A batch the warehouse takes decoded in Arrow (collect_records): as write_frame,
        with no poison event, TRUNCATE or TOAST placeholder in it (arrow_events.py). The
        Spark frame of its events is made from the records only if the store needs it
        (a batch run again after a crash reads its keys' versions back)."""
        from pyspark.sql import functions as F

        store = self.store
        assert isinstance(store, FrameStore)
        spark = store.spark  # type: ignore[attr-defined]

        def events() -> Any:
            parsed = self.decode(spark.createDataFrame(records), topics, tables)
            valid = parsed.where(F.col("error").isNull())
            return valid.withColumn("cut_ms", self.truncations(parsed, tables, cutoffs, False))

        started = time.monotonic()
        present = {p["table"] for p in decoded.parts if p["n"]}
        sizes: dict[str, int] = {}
        for p in decoded.parts:
            sizes[p["table"]] = sizes.get(p["table"], 0) + p["size"]
        store.write_frame(tables, events, present, set(), sizes, decoded.tables)
        summary = _summary(decoded.parts, decoded.parts)
        log.info(
            "%s batch %d: %d events in %.1f s (decoded in Arrow)",
            store.name,
            batch_id,
            summary["n"],
            time.monotonic() - started,
        )
        offsets = {f"{p['topic']}:{p['partition']}": p["offset"] for p in decoded.parts}
        self.record(batch_id, summary, offsets, None, cutoffs, decoded.ages, started_ms)

    def write_rows(
        self,
        batch: Any,
        topics: dict[str, str],
        tables: dict[str, Table],
        batch_id: int,
        cutoffs: dict[str, tuple[int, int]],
        mode: str,
        started_ms: int,
    ) -> None:
        """A Python store's batch goes through cdc/apply/writer.py: a small one
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
                cutoffs,
                self.chunk,
                started_ms=started_ms,
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
        self.dead.flush()
        for row in sorted(truncations, key=lambda r: (r["commit_lsn"], r["lsn"])):
            name = self.truncated(row["table"], row["relid"], tables)
            if name is not None:
                at = (row["commit_lsn"], row["lsn"])
                store.truncate(tables[name], at, row["commit_ms"])
                cutoffs[name] = max(at, cutoffs.get(name, (0, 0)))
        log.info("%s batch %d: %s", store.name, batch_id, counts)
        self.record(batch_id, summary, offsets, counts, cutoffs, ages, started_ms)

    def truncations(
        self,
        parsed: Any,
        tables: dict[str, Table],
        cutoffs: dict[str, tuple[int, int]],
        found: bool,
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
                F.get_json_object("after", "$.relid").cast("long").alias("relid"),
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
            name = self.truncated(row["name"], row["relid"], tables)
            if name is not None:
                at = (row["commit_lsn"], row["lsn"])
                self.store.truncate(tables[name], at, row["commit_ms"])
                cutoffs[name] = max(at, cutoffs.get(name, (0, 0)))
                self.cuts[name] = add_cut(self.cuts.get(name, []), at, row["commit_ms"])
        cut_ms = F.lit(None).cast("long")
        for name, table_cuts in self.cuts.items():
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

    def truncated(self, name: str, relid: int | None, tables: dict[str, Table]) -> str | None:
        """The captured table a TRUNCATE recorded under `name` emptied: that name's, or
        under a name the table only passed through (renamed and back in one transaction)
        the one its relation has now; None for a table not captured."""
        if name in tables:
            return name
        now = self.source.relations.get(relid) if relid is not None else None
        now = self.source.renamed.get(now or "", now)  # renamed since setup: its old name
        return now if now in tables else None

    def sweep_generation(self, tables: dict[str, Table]) -> None:
        """Once the store holds a new snapshot generation whole, remove what it still
        holds from before it (cdc/capture/generation.py)."""
        store = self.store
        generation = read_generation(self.settings)
        progress = read_progress(self.settings, store.name) or Progress()
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
        summary: Any,
        offsets: dict[str, int],
        counts: Any,
        cutoffs: dict[str, tuple[int, int]],
        ages: dict[int, int],
        started_ms: int,
    ) -> None:
        """The store's progress record after the batch (cdc/log/progress.py)."""
        settings, name = self.settings, self.store.name
        previous = read_progress(settings, name) or Progress()
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
                    for t, i in self.topic_ids.items()
                    if any(o.startswith(f"{t}:") for o in offsets)
                },
            },
            commit_lsn=max(newest),  # the newest source position the store took
            commit_ms=commit_ms,
            applied_ms=applied_ms,
            last_batch=counts,
            truncated=dict(cutoffs),
            truncations=dict(self.cuts),
            generation=previous.generation,  # the last one swept
            source=list(self.source.lineage) if self.source.lineage else previous.source,
            pid=os.getpid(),
            freshness=freshness.to_json(),
            written_by_spark=(
                self.store.written_by_spark() if isinstance(self.store, FrameStore) else None
            ),
        )
        write_progress(settings, name, record)


def _heap_bytes(heap: str) -> int:
    """A JVM heap setting ("512m", "2g") in bytes."""
    return int(heap[:-1]) * (1024**3 if heap[-1] in "gG" else 1024**2)


def _summary(data: list[dict[str, Any]], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """What the progress record keeps of a batch: its events (`data`: the partitions of
    the tables' topics), their newest commit time and (of every topic, `parts`) position."""
    commits = [p["commit_ms"] for p in data if p["commit_ms"] is not None]
    return {
        "n": sum(p["n"] for p in data),
        "commit_ms": max(commits, default=None),
        "commit_lsn": max((p["commit_lsn"] or 0 for p in parts), default=0),
    }


def _partitions(
    parsed: Any, tables: dict[str, Table], started_ms: int
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """What a frame batch holds, in one Spark job: per (table, topic, partition) its
    last offset, events, newest commit time and position, poison events and events that
    may hold a TOAST placeholder; and the changes (not the snapshot's or a backfill's
    reads) per fine age bucket (cdc/log/freshness.py)."""
    from pyspark.sql import functions as F

    valid = F.col("error").isNull()
    placeholders = {t.placeholder for t in tables.values()}
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
            # the newest source position taken: Debezium's sequence[0] is the commit
            # before the event's transaction, so its own position counts too
            F.max(F.when(valid, F.greatest("commit_lsn", "lsn"))).alias("commit_lsn"),
            F.count("error").alias("errors"),
            F.sum(F.when(valid, F.length("after"))).alias("size"),
            F.count(F.when(valid & may_hold_placeholder(F.col("after"), placeholders), 1)).alias(
                "toasted"
            ),
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
                "size": 0,
                "toasted": 0,
            },
        )
        part["offset"] = max(part["offset"], g["offset"])
        part["n"] += g["n"]
        part["errors"] += g["errors"]
        part["size"] += g["size"] or 0
        part["toasted"] += g["toasted"]
        for newest in ("commit_ms", "commit_lsn"):
            if g[newest] is not None:
                part[newest] = max(part[newest] or g[newest], g[newest])
    return list(merged.values()), ages


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
