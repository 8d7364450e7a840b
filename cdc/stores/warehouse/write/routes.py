"""How a micro-batch reaches the warehouse's tables: one route per batch, chosen by
`route()` and said in the apply job's log, the store's progress record and `cdc metrics`
(`cdc_store_batches_total{route=...}`).

- `arrow`: the batch's Kafka records are collected to the driver, decoded in Arrow
  (_arrow_events.py) and committed by delta-rs, table by table. The fastest on
  one machine; chosen when delta-rs writes, every captured table's types decode in
  Arrow and the batch fits half the driver's heap.
- `spark-decoded`: Spark decodes the batch (cdc/log/envelope.py) and tells what it
  holds; a table whose events are small and hold no TOAST placeholder is collected and
  committed by delta-rs, the others are written by Spark's jobs (store.py).
- `spark`: Spark decodes and writes every table on the executors, nothing collected
  ([stores.warehouse] writer = "spark", or a remote path: s3a://, hdfs://, which
  delta-rs does not write here).

A route that cannot go on falls back to the next, never to nothing: a collect over
spark.driver.maxResultSize, or records Arrow does not decode, are decoded by Spark; the
route taken is the one said. Poison events go to the dead-letter topic, TRUNCATEs are
applied in position order, and what was written is returned as a BatchOutcome
(cdc/stores/base.py) for the job's progress record."""

from __future__ import annotations

import logging
import math
import time
from enum import StrEnum
from typing import Any, Protocol

from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.log.envelope import parse_events
from cdc.log.freshness import RATIO
from cdc.log.progress import add_cut
from cdc.stores.base import BatchContext, BatchOutcome
from cdc.stores.warehouse.write._arrow_events import ArrowBatch, decode_records, decodes
from cdc.types.spark_types import may_hold_placeholder, unheld_columns

__all__ = ["Route", "WarehouseBatches", "route"]

log = logging.getLogger(__name__)

# the records whose sizes tell a batch's, when no batch was collected before it
SAMPLE_RECORDS = 200
# a batch whose row images hold fewer characters than this is collected to the driver
# again after one over spark.driver.maxResultSize was not (collect_records)
SMALL_CHARS = 128 * 1024 * 1024


class Route(StrEnum):
    """The ways a batch reaches the warehouse (module doc)."""

    ARROW = "arrow"
    SPARK_DECODED = "spark-decoded"
    SPARK = "spark"


def route(
    *,
    native: bool,
    tables: list[Table],
    collect_refused: bool,
    most_records: int,
    record_bytes: float,
    heap_bytes: int,
) -> tuple[Route, str]:
    """The route of a batch, and why: `native` (delta-rs writes), the captured `tables`,
    whether the last collect was refused, the most records the batch can hold, the bytes
    of one as the last batch (or a sample) had them, and the driver's heap. A batch is
    collected if three times its bytes (Spark's tasks copy their rows into Arrow batches,
    the driver then holds them) fit in half of the heap."""
    if not native:
        return Route.SPARK, "[stores.warehouse] writer is spark, or its path is remote"
    if not tables:
        return Route.SPARK_DECODED, "no captured table yet"
    if collect_refused:
        return Route.SPARK_DECODED, "the last collect was over spark.driver.maxResultSize"
    if not all(decodes(t) for t in tables):
        return Route.SPARK_DECODED, "a captured table has a type Arrow does not decode"
    if most_records * max(record_bytes, 1.0) * 3 > heap_bytes / 2:
        return (
            Route.SPARK_DECODED,
            f"up to {most_records} records of ~{int(record_bytes)} bytes: over half the heap",
        )
    return Route.ARROW, "collected and decoded in Arrow"


class _Tables(Protocol):
    """What of the store (store.py: WarehouseStore) a batch's route uses."""

    spark: Any
    native: Any  # its delta-rs writer (native.py)
    local: bool  # the warehouse is on this machine's filesystem (delta-rs writes it)

    def write_frame(
        self,
        tables: dict[str, Table],
        events: Any,
        present: set[str],
        toasted: set[str] | None = None,
        sizes: dict[str, int] | None = None,
        decoded: dict[str, Any] | None = None,
    ) -> None: ...

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None: ...

    def written_by_spark(self) -> dict[str, str]: ...


class WarehouseBatches:
    """The warehouse's side of each micro-batch (module doc): what it keeps from one
    batch to the next is how large a record was, and whether a collect was refused."""

    def __init__(self, store: _Tables, max_records: int, heap: str) -> None:
        self.store = store
        self.max_records = max_records
        self.heap_bytes = _heap_bytes(heap)
        # a batch over spark.driver.maxResultSize was collected in vain: Spark decodes the
        # batches after it until one is small again (its row images under SMALL_CHARS)
        self.collect_refused = False
        # the bytes of a Kafka record (key and value), as the last batch collected had
        # them on average: what the next one's collect is judged by
        self.record_bytes: float | None = None

    def write(self, raw: Any, ctx: BatchContext) -> BatchOutcome:
        """Write the batch by its route (module doc)."""
        records = self.collect_records(raw, ctx)
        if records is not None:
            decoded = decode_records(
                records, ctx.topics, ctx.tables, ctx.truncate_log, ctx.started_ms
            )
            if decoded is not None:
                return self.write_decoded(decoded, records, ctx)
            log.info("warehouse: records Arrow does not decode: decoded by Spark")
            raw = raw.sparkSession.createDataFrame(records)
        parsed = self.decode(raw, ctx.topics, ctx.tables).cache()
        try:
            spark_only = not (self.store.native.enabled and self.store.local)
            return self.write_frame(parsed, ctx, Route.SPARK if spark_only else Route.SPARK_DECODED)
        finally:
            parsed.unpersist()

    def collect_records(self, raw: Any, ctx: BatchContext) -> Any | None:
        """The batch's Kafka records in Arrow, collected once to be decoded on the driver,
        when its route is `arrow`; None: Spark decodes the batch, its tasks streaming it.
        What a batch holds is not known before it is read, only how many records it has
        at most (the store's backlog, and the trigger's limit); its bytes are judged by
        the last collected batch's records, or a sample of this one's first ones. A batch
        larger than Spark sends its driver (spark.driver.maxResultSize) all the same is
        decoded by Spark too."""
        import pyarrow.compute as pc

        tables = list(ctx.tables.values())
        most = ctx.records if ctx.records is not None else min(ctx.behind, self.max_records)
        records = raw.select("key", "value", "topic", "partition", "offset")
        chosen, why = route(
            native=self.store.native.enabled and self.store.local,
            tables=tables,
            collect_refused=self.collect_refused,
            most_records=most,
            record_bytes=self.record_bytes if self.record_bytes is not None else 0.0,
            heap_bytes=self.heap_bytes,
        )
        if chosen is Route.ARROW and self.record_bytes is None:  # judged by a sample
            chosen, why = route(
                native=True,
                tables=tables,
                collect_refused=False,
                most_records=most,
                record_bytes=self.sampled_bytes(records),
                heap_bytes=self.heap_bytes,
            )
        if chosen is not Route.ARROW:
            log.info("warehouse batch %d: route %s (%s)", ctx.batch_id, chosen, why)
            return None
        try:
            collected = records.toArrow()
        except Exception as exc:
            if "maxResultSize" not in str(exc):
                raise
            log.info("warehouse: a batch over spark.driver.maxResultSize: decoded by Spark")
            self.collect_refused = True
            return None
        if collected.num_rows:
            held = pc.sum(pc.binary_length(collected.column("value"))).as_py() or 0
            held += pc.sum(pc.binary_length(collected.column("key"))).as_py() or 0
            self.record_bytes = held / collected.num_rows
        return collected

    def sampled_bytes(self, records: Any) -> float:
        """The mean bytes (key and value) of the batch's first records, read alone."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
        sample = records.select(size.alias("n")).limit(SAMPLE_RECORDS).toArrow()
        return float(pc.mean(sample.column("n")).as_py() or 0) if sample.num_rows else 0.0

    def decode(self, raw: Any, topics: dict[str, str], tables: dict[str, Table]) -> Any:
        """The batch's events of captured tables, decoded by Spark; those holding a value
        the warehouse cannot hold marked as errors (dead letters, never in as NULL)."""
        return unheld_as_errors(parse_events(raw, topics).where("table IS NOT NULL"), tables)

    def write_frame(self, parsed: Any, ctx: BatchContext, taken: Route) -> BatchOutcome:
        """A batch Spark decoded (`parsed`). One job tells what it holds (per topic
        partition: last offset, events, newest commit time, poison events); the
        dead-letter and TRUNCATE jobs run only when the batch has some, as each Spark job
        costs a few hundred ms on a small machine."""
        from pyspark.sql import functions as F

        tables = ctx.tables
        parts, ages = partitions(parsed, tables, ctx.started_ms)
        dead = 0
        if any(p["errors"] for p in parts):
            for row in parsed.where("error IS NOT NULL").toLocalIterator():
                ctx.dead_letter(row)
                dead += 1
        truncated = any(p["table"] == TRUNCATIONS_TABLE and p["n"] for p in parts)
        cut_ms = self.truncations(parsed, ctx, found=truncated)
        data = [p for p in parts if p["table"] != TRUNCATIONS_TABLE]
        present = {p["table"] for p in data if p["n"]}
        started = time.monotonic()
        events = parsed.where(F.col("error").isNull() & (F.col("table") != TRUNCATIONS_TABLE))
        # an event from before its table's last TRUNCATE is history, not current state
        toasted = {p["table"] for p in data if p["toasted"]}
        sizes: dict[str, int] = {}
        for p in data:
            sizes[p["table"]] = sizes.get(p["table"], 0) + p["size"]
        if sum(sizes.values()) < SMALL_CHARS:
            self.collect_refused = False
        self.store.write_frame(tables, events.withColumn("cut_ms", cut_ms), present, toasted, sizes)
        outcome = _outcome(data, parts, ages, taken)
        outcome.dead = dead
        self._said(ctx, outcome, time.monotonic() - started)
        return outcome

    def write_decoded(self, decoded: ArrowBatch, records: Any, ctx: BatchContext) -> BatchOutcome:
        """A batch decoded in Arrow (route `arrow`): as write_frame, with no poison event,
        TRUNCATE or TOAST placeholder in it (_arrow_events.py). The Spark frame of its
        events is made from the records only if the store needs it (a batch run again
        after a crash reads its keys' versions back)."""
        from pyspark.sql import functions as F

        spark = self.store.spark

        def events() -> Any:
            parsed = self.decode(spark.createDataFrame(records), ctx.topics, ctx.tables)
            valid = parsed.where(F.col("error").isNull())
            return valid.withColumn("cut_ms", self.truncations(parsed, ctx, False))

        started = time.monotonic()
        present = {p["table"] for p in decoded.parts if p["n"]}
        sizes: dict[str, int] = {}
        for p in decoded.parts:
            sizes[p["table"]] = sizes.get(p["table"], 0) + p["size"]
        self.store.write_frame(ctx.tables, events, present, set(), sizes, decoded.tables)
        outcome = _outcome(decoded.parts, decoded.parts, decoded.ages, Route.ARROW)
        self._said(ctx, outcome, time.monotonic() - started)
        return outcome

    def _said(self, ctx: BatchContext, outcome: BatchOutcome, seconds: float) -> None:
        outcome.written_by_spark = self.store.written_by_spark()
        log.info(
            "warehouse batch %d: %d events in %.1f s (route %s)",
            ctx.batch_id,
            outcome.n,
            seconds,
            outcome.route,
        )

    def truncations(self, parsed: Any, ctx: BatchContext, found: bool) -> Any:
        """Apply the batch's TRUNCATEs (rows of cdc.truncations; `found`: the batch has
        some) to the store, in position order, adding them to `ctx.last_truncate` (and to
        `ctx.truncate_log`, with their commit times). Returns, per event, the commit time of the
        first TRUNCATE after it (NULL for the events after their table's last TRUNCATE).
        The cut-offs are kept in the progress file, so an event from before a TRUNCATE
        that comes in a later batch (another topic, read further behind) is known as
        such."""
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
            name = ctx.emptied_by(row["name"], row["relid"])
            if name is not None:
                at = (row["commit_lsn"], row["lsn"])
                self.store.truncate(ctx.tables[name], at, row["commit_ms"])
                ctx.last_truncate[name] = max(at, ctx.last_truncate.get(name, (0, 0)))
                ctx.truncate_log[name] = add_cut(
                    ctx.truncate_log.get(name, []), at, row["commit_ms"]
                )
        return cut_column(ctx.truncate_log)


def cut_column(cuts: dict[str, list[list[int]]]) -> Any:
    """Per event, the commit time of the first of its table's TRUNCATEs (`cuts`) after
    it; tombstones (no position) follow their delete event, which the cut-off judges."""
    from pyspark.sql import functions as F

    cut_ms = F.lit(None).cast("long")
    for name, table_cuts in cuts.items():
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


def _heap_bytes(heap: str) -> int:
    """A JVM heap setting ("512m", "2g") in bytes."""
    return int(heap[:-1]) * (1024**3 if heap[-1] in "gG" else 1024**2)


def _outcome(
    data: list[dict[str, Any]], parts: list[dict[str, Any]], ages: dict[int, int], taken: Route
) -> BatchOutcome:
    """What the progress record keeps of a batch: its events (`data`: the partitions of
    the tables' topics), their newest commit time and (of every topic, `parts`) position
    and last offset."""
    commits = [p["commit_ms"] for p in data if p["commit_ms"] is not None]
    return BatchOutcome(
        n=sum(p["n"] for p in data),
        commit_ms=max(commits, default=None),
        commit_lsn=max((p["commit_lsn"] or 0 for p in parts), default=0),
        offsets={f"{p['topic']}:{p['partition']}": p["offset"] for p in parts},
        ages=ages,
        route=str(taken),
    )


def partitions(
    parsed: Any, tables: dict[str, Table], started_ms: int
) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """What a Spark-decoded batch holds, in one Spark job: per (table, topic, partition)
    its last offset, events, newest commit time and position, poison events and events
    that may hold a TOAST placeholder; and the changes (not the snapshot's or a
    backfill's reads) per fine age bucket (cdc/log/freshness.py)."""
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


def unheld_as_errors(parsed: Any, tables: dict[str, Table]) -> Any:
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
