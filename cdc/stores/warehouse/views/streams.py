"""What the views kept by a streaming query (alone or shared: queries.py) have in
common: window aggregates (windows.py) and stream-stream joins (stream_join.py), each
under `<warehouse>/<prefix>/_views/<name>`.

Each query reads its table's change topic(s) from the start, takes the events it
counts (creations, op "c"; for a join's end, creations and updates matching `when`),
drops an event the connector sent twice (same key and LSN, within the watermark), and
keeps its state (open windows, sessions, unmatched starts) in its checkpoint. An event
whose commit time is older than the newest commit time the query has seen minus the
watermark is too late: Spark drops it and the apply job counts it (`cdc status`).
Memory is bounded by the events within the watermark (sliding windows: and within the
window; joins: and within `within`).

Each micro-batch's results are merged into the Delta table on the view's key, so a
batch run again after a crash writes the same rows once. The table is a function of
the log its checkpoint read: a query that starts afresh (a new pipeline, a lost
checkpoint, another definition) empties it first, and computes it again from the
log's start.

For `cdc verify`, the same events are read from the log with a Kafka consumer of its
own (`logged_changes`). Spark writes what waits for the watermark (a sliding window, a
session, a start without an end) once the watermark has passed its end; the watermark
is the one the query's last committed micro-batch ran with. What falls due within a
millisecond of it may be written or not; anything before must be, anything after must
not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cdc.core.catalog import Table
from cdc.core.settings import Settings
from cdc.core.settings.views import ViewSettings
from cdc.core.spark import kafka_options
from cdc.core.topics import ChangeRecord, change_topic
from cdc.log.checkpoints import Checkpoint
from cdc.log.envelope import event_position, parse_events
from cdc.log.generated_columns import with_generated
from cdc.log.position import Position
from cdc.log.progress import forget_late
from cdc.stores.warehouse.conflicts import retried
from cdc.stores.warehouse.native import NativeWriter
from cdc.stores.warehouse.tables import view_path
from cdc.types.decode import decode_value
from cdc.types.spark_types import json_type, typed_column, widest
from cdc.types.spark_types import quoted as q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "PLAN",
    "LoggedChange",
    "appended_to",
    "definition_of",
    "events",
    "logged_changes",
    "merged_into",
    "start_afresh",
    "total",
    "wide",
]

# the shape of these queries' plans and state: a checkpoint written for another shape
# cannot be read, so a query whose checkpoint has another starts afresh (the number is
# kept with the view's definition beside its checkpoint)
PLAN = 2


def definition_of(view: ViewSettings) -> str:
    """What a streaming view's checkpoint is written for: its settings (every field, the
    defaults too) and the plan's shape."""
    given = view.model_dump(mode="json")
    return f"{json.dumps(given, separators=(',', ':'), ensure_ascii=False)} plan {PLAN}"


def wide(table: Table) -> Table:
    """The table with each column typed as its widest widening (typed.widest): a query
    keeps the types it started with while PostgreSQL may widen a column under it."""
    return replace(table, columns=tuple(widest(c) for c in table.columns))


def events(
    spark: Any,
    settings: Settings,
    table: Table,
    columns: list[str],
    ops: tuple[str, ...],
    watermark: str,
    when: dict[str, list[str]] | None = None,
    unique: bool = True,
) -> DataFrame:
    """The table's change events of `ops`: __key, __commit_lsn, __lsn, commit_ts (the
    watermarked event time), and `columns` typed from the row after the change, as
    `__c_<name>`; with `unique`, each (key, LSN) once within the watermark."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    topic = change_topic(settings.pipeline, table.qualified)
    records = (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "false")
        .option("maxOffsetsPerTrigger", settings.apply.max_offsets_per_trigger)
        .load()
    )
    if any(table.column(c).generated for c in columns):  # not in the log: computed
        records = with_generated(
            records, settings, {topic: table.qualified}, {table.qualified: table}
        )
    typed = [table.column(c) for c in columns]
    after = F.from_json("after", T.StructType([T.StructField(c.name, json_type(c)) for c in typed]))
    matching = F.lit(True)
    for column, values in (when or {}).items():
        matching = matching & F.col(q(f"__c_{column}")).cast("string").isin(*values)
    found = (
        parse_events(records, {topic: table.qualified})
        .where(F.col("op").isin(*ops) & F.col("error").isNull())
        .select(
            F.col("key").alias("__key"),
            F.col("commit_lsn").alias("__commit_lsn"),
            F.col("lsn").alias("__lsn"),
            F.timestamp_millis("commit_ms").alias("commit_ts"),
            *[typed_column(c, after[c.name]).alias(f"__c_{c.name}") for c in typed],
        )
        # every event moves the watermark; only those `when` holds for are kept, so an
        # event that does not is never counted late (the filter names the event time, or
        # Spark's optimizer would push it below the watermark)
        .withWatermark("commit_ts", watermark)
        .where(F.when(matching, F.col("commit_ts")).isNotNull())
    )
    return found.dropDuplicatesWithinWatermark(["__key", "__lsn"]) if unique else found


def start_afresh(spark: Any, settings: Settings, name: str, checkpoint: Checkpoint) -> None:
    """A query without a committed batch computes its table again from the log."""
    from delta.tables import DeltaTable

    from cdc.stores.warehouse.tables import warehouse_root

    if checkpoint.last_committed_batch() is not None:
        return
    forget_late(settings, name)
    path = view_path(warehouse_root(settings), name)
    if DeltaTable.isDeltaTable(spark, path):
        DeltaTable.forPath(spark, path).delete()


def merged_into(
    spark: Any,
    path: str,
    fields: list[Any],
    keys: list[str],
    condition: str | None = None,
    native: NativeWriter | None = None,
) -> Callable[[DataFrame, int], None]:
    """A query's batch writer: each batch MERGEd into the Delta table at `path` on its
    `keys` (`t` the table, `s` the batch), updating a row where `condition` holds
    (written in SQL both Spark and delta-rs read), by delta-rs where `native` can."""
    from pyspark.sql import functions as F

    from cdc.stores.warehouse.native import null_safe_match
    from cdc.stores.warehouse.tables import ensure_delta

    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in keys)
    native_on = null_safe_match([(k, k) for k in keys])

    def write(batch: DataFrame, _: int) -> None:
        target = ensure_delta(spark, path, fields)
        rows = batch.select(*[F.col(q(f.name)).cast(f.dataType) for f in fields])
        clauses: list[Any] = [("update", condition, None), ("insert", None, None)]
        if native is not None and native.merge(path, rows, native_on, clauses):
            return
        retried(
            f"the MERGE into {path}",
            lambda: (
                target.alias("t")
                .merge(rows.alias("s"), on)
                .whenMatchedUpdateAll(condition=condition)
                .whenNotMatchedInsertAll()
                .execute()
            ),
        )

    return write


def appended_to(
    spark: Any,
    path: str,
    fields: list[Any],
    checkpoint: Checkpoint,
    native: NativeWriter | None = None,
) -> Callable[[DataFrame, int], None]:
    """A batch writer for a query in append mode (each row written once, when final):
    each batch appended to the Delta table at `path`, once. Delta keeps the last batch
    id appended per writer (its transaction id, `txnAppId`/`txnVersion`) and skips a
    batch run again after a crash. The writer is the checkpoint's query id, so a query
    started afresh (a new checkpoint, batch ids from 0 again) is another writer. An
    append costs a fifth of a MERGE here (docs/benchmarks.md); delta-rs writes it where
    `native` can."""
    from pyspark.sql import functions as F

    from cdc.stores.warehouse.tables import ensure_delta

    def write(batch: DataFrame, batch_id: int) -> None:
        ensure_delta(spark, path, fields)
        rows = batch.select(*[F.col(q(f.name)).cast(f.dataType) for f in fields])
        writer = f"cdc-view-{checkpoint.query_id()}"
        if native is not None and native.append(path, rows, (writer, batch_id)):
            return
        (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", writer)
            .option("txnVersion", batch_id)
            .save(path)
        )

    return write


@dataclass(frozen=True)
class LoggedChange:
    """A change in the log: its position, commit time (ms) and decoded values."""

    at: Position
    ms: int
    values: dict[str, Any]


def logged_changes(
    records: Iterable[ChangeRecord], table: Table, columns: list[str], ops: tuple[str, ...]
) -> list[LoggedChange]:
    """The changes of `ops` in `records`, each (key, LSN) once (the connector may send
    one twice), with `columns` decoded from the row after the change."""
    seen: set[tuple[bytes | None, Any]] = set()
    out = []
    for record in records:
        value = record.value
        if not value or value.get("op") not in ops:
            continue
        source = value.get("source") or {}
        at = event_position(value["op"], source)
        if at is None or (record.key_bytes, source.get("lsn")) in seen:
            continue
        seen.add((record.key_bytes, source.get("lsn")))
        after = value.get("after") or {}
        decoded = {c: decode_value(table.column(c), after.get(c)) for c in columns}
        out.append(LoggedChange(at, int(source["ts_ms"]), decoded))
    return out


def total(values: list[Any]) -> Any:
    """The sum of the values that are not NULL (NULL: none is), as a float."""
    present = [v for v in values if v is not None]
    return float(sum(present[1:], present[0])) if present else None
