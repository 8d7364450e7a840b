"""Derived data in the warehouse: join views and windowed aggregates (`apply.joins`,
`apply.windows`), under `<warehouse>/<prefix>/_views/<name>`.

A join view is refreshed by the warehouse after each micro-batch, for the rows the
batch touched on either side, from the current-state tables it has just written: it
is a function of those tables, so replays and restarts converge with them.

A windowed aggregate is its own Structured Streaming query over the table's change
topic: creations (op "c") per tumbling window of commit time, deduplicated by (key,
LSN) within the watermark (the connector may send an event twice after a crash),
with state in its checkpoint; each micro-batch's updated windows replace theirs in
the Delta table. The table is a function of the log its checkpoint read: a query that
starts afresh (a new pipeline, a lost checkpoint) empties it first, and counts every
window again from the log's start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.catalog import Table
from cdc.errors import ConfigError
from cdc.settings import JoinView, Settings, WindowAggregate
from cdc.spark import kafka_options
from cdc.topics import change_topic
from materializers.events import parse_events
from materializers.generated import with_generated
from materializers.progress import forget_late, last_committed_batch
from materializers.stores.warehouse.enrich import EVENT_COLUMNS
from materializers.stores.warehouse.tables import view_path
from materializers.typed import json_type, spark_type, typed_column
from materializers.typed import quoted as q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_views", "refresh_join", "view_path", "window_query"]


def check_views(settings: Settings, tables: dict[str, Table]) -> None:
    """Every view names captured tables and existing columns; names are unique."""
    apply = settings.apply
    names = [v.name for v in apply.joins] + [w.name for w in apply.windows]
    if len(set(names)) != len(names):
        raise ConfigError(f"view names must be unique: {', '.join(sorted(names))}")

    def table(name: str, view: str) -> Table:
        if name not in tables:
            raise ConfigError(
                f"view {view} reads {name}, which pipeline {settings.pipeline.name} does not "
                f"capture; captured: {', '.join(sorted(tables)) or 'none'}"
            )
        return tables[name]

    def column(t: Table, name: str, view: str) -> None:
        have = [c.name for c in t.columns]
        if name not in have:
            raise ConfigError(
                f"view {view}: {t.qualified} has no column {name}; it has {', '.join(have)}"
            )

    for join in apply.joins:
        left, right = table(join.table, join.name), table(join.references, join.name)
        column(left, join.on, join.name)
        for c in join.columns:
            column(right, c, join.name)
        if len(right.key) != 1:
            raise ConfigError(
                f"view {join.name}: {right.qualified} has a composite key "
                f"({', '.join(right.key)}); a join view needs a single-column key"
            )
        taken = {c.name for c in left.columns}
        if join.kind == "stream_table":
            taken |= set(EVENT_COLUMNS)
        clash = sorted(taken & {join.column_prefix + c for c in join.columns})
        if clash:
            raise ConfigError(
                f"view {join.name}: {', '.join(clash)} is already a column of the view "
                f"(of {left.qualified}, or the event's); give the join another prefix"
            )
    for window in apply.windows:
        t = table(window.table, window.name)
        if window.sum is not None:
            column(t, window.sum, window.name)


def _joined_fields(join: JoinView, left: Table, right: Table) -> list[Any]:
    from pyspark.sql import types as T

    fields = [T.StructField(c.name, spark_type(c)) for c in left.columns]
    fields += [
        T.StructField(join.column_prefix + c, spark_type(right.column(c))) for c in join.columns
    ]
    return fields


def refresh_join(
    spark: Any,
    root: str,
    join: JoinView,
    tables: dict[str, Table],
    touched: dict[str, DataFrame],
) -> None:
    """Recompute the view's rows for the keys `touched` (per table: its key columns) on
    either side; every row when `touched` names neither table's keys (after a TRUNCATE)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from materializers.stores.warehouse.tables import current_path, ensure_delta

    left, right = tables[join.table], tables[join.references]
    live_left = (
        DeltaTable.forPath(spark, current_path(root, left.qualified))
        .toDF()
        .where("NOT _cdc_deleted")
    )
    live_right = (
        DeltaTable.forPath(spark, current_path(root, right.qualified))
        .toDF()
        .where("NOT _cdc_deleted")
    )
    view = ensure_delta(spark, view_path(root, join.name), _joined_fields(join, left, right))
    (ref,) = right.key
    carried = live_right.select(
        F.col(q(ref)).alias("__ref"),
        *[F.col(q(c)).alias(join.column_prefix + c) for c in join.columns],
    )
    key_columns = [F.col(q(k)) for k in left.key]
    parts = []
    if join.table in touched:
        parts.append(touched[join.table].select(*key_columns))
    if join.references in touched:
        changed = touched[join.references].select(F.col(q(ref)).alias("__ref"))
        parts.append(
            live_left.join(changed, F.col(q(join.on)) == F.col("__ref"), "left_semi").select(
                *key_columns
            )
        )
    full = not parts
    if full:
        parts = [view.toDF().select(*key_columns), live_left.select(*key_columns)]
    affected = parts[0]
    for part in parts[1:]:
        affected = affected.unionByName(part)
    affected = affected.distinct()
    joined = (
        live_left.join(affected, [*left.key], "left_semi")
        .join(carried, F.col(q(join.on)) == F.col("__ref"), "left")
        .select(
            *[F.col(q(c.name)) for c in left.columns],
            *[F.col(q(join.column_prefix + c)) for c in join.columns],
            F.lit(True).alias("__present"),
        )
    )
    source = affected.join(joined, [*left.key], "left")
    columns = [c.name for c in left.columns] + [join.column_prefix + c for c in join.columns]
    values = {q(c): f"s.{q(c)}" for c in columns}
    (
        view.alias("v")
        .merge(source.alias("s"), " AND ".join(f"v.{q(k)} <=> s.{q(k)}" for k in left.key))
        .whenMatchedDelete(condition="s.__present IS NULL")
        .whenMatchedUpdate(condition="s.__present", set=values)
        .whenNotMatchedInsert(condition="s.__present", values=values)
        .execute()
    )


def window_query(
    spark: Any, settings: Settings, window: WindowAggregate, table: Table, checkpoint: str
) -> Any:
    """The streaming query keeping `window`, ready for a trigger and start()."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializers.stores.warehouse.tables import ensure_delta, warehouse_root

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
    # a generated column summed: computed as for the stores
    records = with_generated(
        records, settings.postgres.dsn(), {topic: table.qualified}, {table.qualified: table}
    )
    if window.sum is not None:
        column = table.column(window.sum)
        raw = F.from_json("after", T.StructType([T.StructField(column.name, json_type(column))]))
        amount = typed_column(column, raw[column.name])
        amount_type = spark_type(column)
        if isinstance(amount_type, T.DecimalType):  # room for the sum
            amount_type = T.DecimalType(38, amount_type.scale)
    else:
        amount, amount_type = F.lit(None), T.DecimalType(38, 2)
    created = (
        parse_events(records, {topic: table.qualified})
        .where("op = 'c'")
        .select(
            "key",
            "lsn",
            F.timestamp_millis("commit_ms").alias("commit_ts"),
            amount.cast(amount_type).alias("amount"),
        )
        .withWatermark("commit_ts", window.watermark)
        .dropDuplicatesWithinWatermark(["key", "lsn"])
    )
    windows = (
        F.window("commit_ts", window.window, window.slide)
        if window.slide
        else F.window("commit_ts", window.window)
    )
    counts = created.groupBy(windows).agg(
        F.count("*").alias("rows"), F.sum("amount").alias("total")
    )
    path = view_path(warehouse_root(settings), window.name)
    if last_committed_batch(Path(checkpoint)) is None:  # what another query counted goes
        forget_late(settings, window.name)
        if DeltaTable.isDeltaTable(spark, path):
            DeltaTable.forPath(spark, path).delete()
    fields = [
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("rows", T.LongType()),
        T.StructField("total", amount_type),
    ]

    def write(batch: DataFrame, _: int) -> None:
        target = ensure_delta(spark, path, fields)
        updated = batch.select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "rows",
            "total",
        )
        (
            target.alias("t")
            .merge(updated.alias("s"), "t.window_start = s.window_start")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    return (
        counts.writeStream.queryName(f"cdc-{settings.pipeline.name}-window-{window.name}")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(write)
    )
