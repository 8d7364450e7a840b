"""Derived data kept by Structured Streaming queries of their own over the change
topics, with a watermark on commit time: window aggregates (`apply.windows`) and
stream-stream joins (`apply.joins` of kind `stream_stream`), each under
`<warehouse>/<prefix>/_views/<name>`.

Each query reads its table's change topic(s) from the start, takes the events it
counts (creations, op "c"; for a join's end, creations and updates matching `when`),
drops an event the connector sent twice (same key and LSN, within the watermark), and
keeps its state (open windows, sessions, unmatched starts) in its checkpoint. An event
whose commit time is older than the newest commit time the query has seen minus the
watermark is too late: Spark drops it and the apply job counts it (`cdc status`).
Memory is bounded by the events within the watermark (sliding windows: and within the
window; joins: and within `within`).

Each micro-batch's results are merged into the Delta table on the window's key (the
join's start), so a batch run again after a crash writes the same rows once. The table
is a function of the log its checkpoint read: a query that starts afresh (a new
pipeline, a lost checkpoint) empties it first, and computes it again from the log's
start.

- tumbling and hopping windows are written as they fill (update mode);
- sliding windows (one per distinct commit time of a creation, the `window` up to it)
  and sessions are written once the watermark has passed their end (append mode:
  Spark has no update mode for session windows, SPARK-36463); a sliding window's by
  `window` more (its aggregation follows a join, whose watermark is `window` behind);
- a join's start is written when its end arrives (the earliest end wins, whatever
  order the batches brought them in), or without an end once the watermark has passed
  `within` after it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.catalog import Table
from cdc.errors import ConfigError
from cdc.settings import JoinView, Settings, WindowAggregate
from cdc.spark import kafka_options
from cdc.topics import change_topic
from materializers.log.events import parse_events
from materializers.log.generated import expressions_dsn, with_generated
from materializers.log.progress import forget_late, last_committed_batch
from materializers.log.typed import json_type, spark_type, typed_column, widest
from materializers.log.typed import quoted as q
from materializers.stores.warehouse.tables import view_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["JOIN_COLUMNS", "PLAN", "late_readers", "stream_join_query", "window_query"]

# the shape of these queries' plans and state: a checkpoint written for another shape
# cannot be read, so a query whose checkpoint has another starts afresh (the number is
# kept with the view's definition beside its checkpoint)
PLAN = 2

# a stream-stream join's columns after the start's key and before the end's carried ones
JOIN_COLUMNS = ("start_ts", "end_ts", "elapsed_s")


def late_readers(window: WindowAggregate) -> int:
    """How many of the query's readers drop each late event: a sliding window reads its
    topic twice (the windows' ends and their members), each reader dropping it."""
    return 2 if window.kind == "sliding" else 1


def _wide(table: Table) -> Table:
    """The table with each column typed as its widest widening (typed.widest): a query
    keeps the types it started with while PostgreSQL may widen a column under it."""
    return replace(table, columns=tuple(widest(c) for c in table.columns))


def _events(
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
            records, expressions_dsn(settings), {topic: table.qualified}, {table.qualified: table}
        )
    typed = [table.column(c) for c in columns]
    after = F.from_json("after", T.StructType([T.StructField(c.name, json_type(c)) for c in typed]))
    matching = F.lit(True)
    for column, values in (when or {}).items():
        matching = matching & F.col(q(f"__c_{column}")).cast("string").isin(*values)
    events = (
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
    return events.dropDuplicatesWithinWatermark(["__key", "__lsn"]) if unique else events


def _start_afresh(spark: Any, settings: Settings, name: str, checkpoint: str) -> None:
    """A query without a committed batch computes its table again from the log."""
    from delta.tables import DeltaTable

    from materializers.stores.warehouse.tables import warehouse_root

    if last_committed_batch(Path(checkpoint)) is not None:
        return
    forget_late(settings, name)
    path = view_path(warehouse_root(settings), name)
    if DeltaTable.isDeltaTable(spark, path):
        DeltaTable.forPath(spark, path).delete()


def window_query(
    spark: Any, settings: Settings, window: WindowAggregate, table: Table, checkpoint: str
) -> Any:
    """The streaming query keeping `window`, ready for a trigger and start()."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from materializers.stores.warehouse.tables import ensure_delta, warehouse_root

    table = _wide(table)
    read = [c for c in (window.sum, window.group_by) if c is not None]
    amount_type: Any = T.DecimalType(38, 2)
    if window.sum is not None:
        amount_type = spark_type(table.column(window.sum))
        if isinstance(amount_type, T.DecimalType):  # room for the sum
            amount_type = T.DecimalType(38, amount_type.scale)

    def created(unique: bool = True) -> DataFrame:
        events = _events(spark, settings, table, read, ("c",), window.watermark, unique=unique)
        amount = F.col(q(f"__c_{window.sum}")) if window.sum else F.lit(None)
        return events.withColumn("__amount", amount.cast(amount_type))

    measures = [F.count("*").alias("rows"), F.sum("__amount").alias("total")]
    fields = []
    if window.kind == "session":
        group = (
            [F.col(q(f"__c_{window.group_by}")).alias(window.group_by)] if window.group_by else []
        )
        if window.group_by:
            fields.append(T.StructField(window.group_by, spark_type(table.column(window.group_by))))
        counts = (
            created()
            .groupBy(F.session_window("commit_ts", window.gap or ""), *group)
            .agg(*measures)
        )
        counts = counts.select(
            *([q(window.group_by)] if window.group_by else []),
            F.col("session_window.start").alias("window_start"),
            F.col("session_window.end").alias("window_end"),
            "rows",
            "total",
        )
        mode = "append"
    elif window.kind == "sliding":
        # one window per distinct creation time, joined with the creations of the window up
        # to it (a join needs an equality: every row has the same __all)
        ends = (
            created()
            .select(F.col("commit_ts").alias("window_end"), F.lit(0).alias("__all"))
            .dropDuplicatesWithinWatermark(["window_end"])
        )
        members = created().select(
            F.col("commit_ts").alias("__member_ts"), "__amount", F.lit(0).alias("__member_all")
        )
        size = f"INTERVAL {window.window}"
        counts = (
            ends.join(
                members,
                F.expr(
                    f"__all = __member_all AND __member_ts >= window_end - {size} "
                    "AND __member_ts <= window_end"
                ),
            )
            .groupBy("window_end")
            .agg(*measures)
            .select(
                F.expr(f"window_end - {size}").alias("window_start"),
                "window_end",
                "rows",
                "total",
            )
        )
        mode = "append"
    else:
        # each (creation, window) pair once: a creation too late for its older windows
        # still counts in those the watermark has not passed (and late counts per pair)
        windows = F.window("commit_ts", window.window, window.slide or window.window)
        counts = (
            created(unique=False)
            .withColumn("window", windows)
            .dropDuplicates(["__key", "__lsn", "window"])
            .groupBy("window")
            .agg(*measures)
            .select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "rows",
                "total",
            )
        )
        mode = "update"
    fields += [
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("rows", T.LongType()),
        T.StructField("total", amount_type),
    ]
    path = view_path(warehouse_root(settings), window.name)
    _start_afresh(spark, settings, window.name, checkpoint)
    on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in window.key)

    def write(batch: DataFrame, _: int) -> None:
        target = ensure_delta(spark, path, fields)
        (
            target.alias("t")
            .merge(batch.alias("s"), on)
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    return (
        counts.writeStream.queryName(f"cdc-{settings.pipeline.name}-window-{window.name}")
        .outputMode(mode)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(write)
    )


def join_fields(join: JoinView, start: Table, end: Table) -> list[Any]:
    """A stream-stream join's table: the start's key, its commit time and position, the
    end's commit time, the seconds between, the end's carried columns and position."""
    from pyspark.sql import types as T

    start_ts, end_ts, elapsed = JOIN_COLUMNS
    return [
        *[T.StructField(k, spark_type(start.column(k))) for k in start.key],
        T.StructField(start_ts, T.TimestampType()),
        T.StructField("_cdc_commit_lsn", T.LongType()),
        T.StructField("_cdc_lsn", T.LongType()),
        T.StructField(end_ts, T.TimestampType()),
        T.StructField(elapsed, T.DoubleType()),
        *[T.StructField(join.column_prefix + c, spark_type(end.column(c))) for c in join.columns],
        T.StructField("_cdc_end_commit_lsn", T.LongType()),
        T.StructField("_cdc_end_lsn", T.LongType()),
    ]


def stream_join_query(
    spark: Any, settings: Settings, join: JoinView, tables: dict[str, Table], checkpoint: str
) -> Any:
    """The streaming query keeping a stream-stream join, ready for a trigger and start()."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from materializers.stores.warehouse.tables import ensure_delta, warehouse_root

    start, end = _wide(tables[join.table]), _wide(tables[join.references])
    if len(start.key) != 1:
        raise ConfigError(
            f"join {join.name}: {start.qualified} has a composite key "
            f"({', '.join(start.key)}); a stream_stream join needs a single-column key"
        )
    (key,) = start.key
    starts = _events(spark, settings, start, [key], ("c",), join.watermark).select(
        F.col(q(f"__c_{key}")).alias("__start_key"),
        F.col("commit_ts").alias("start_ts"),
        F.col("__commit_lsn").alias("__start_commit"),
        F.col("__lsn").alias("__start_lsn"),
    )
    wanted = sorted({join.on, *join.when, *join.columns})
    ends = _events(spark, settings, end, wanted, ("c", "u"), join.watermark, join.when).select(
        F.col(q(f"__c_{join.on}")).alias("__end_link"),
        F.col("commit_ts").alias("end_ts"),
        F.col("__commit_lsn").alias("__end_commit"),
        F.col("__lsn").alias("__end_lsn"),
        *[F.col(q(f"__c_{c}")).alias(f"__carried_{c}") for c in join.columns],
    )
    after_start = F.expr(
        f"__end_link = __start_key AND end_ts >= start_ts "
        f"AND end_ts <= start_ts + INTERVAL {join.within} "
        "AND (__end_commit > __start_commit "
        "OR (__end_commit = __start_commit AND __end_lsn > __start_lsn))"
    )
    joined = starts.join(ends, after_start, "leftOuter")
    fields = join_fields(join, start, end)
    names = [f.name for f in fields]
    path = view_path(warehouse_root(settings), join.name)
    _start_afresh(spark, settings, join.name, checkpoint)
    start_ts, end_ts, _ = JOIN_COLUMNS
    end_position = F.struct(F.col("_cdc_end_commit_lsn"), F.col("_cdc_end_lsn"))
    first = Window.partitionBy(F.col(q(key)), "_cdc_commit_lsn", "_cdc_lsn").orderBy(
        end_position.asc_nulls_last()
    )

    def write(batch: DataFrame, _: int) -> None:
        target = ensure_delta(spark, path, fields)
        rows = (
            batch.select(
                F.col("__start_key").alias(key),
                start_ts,
                F.col("__start_commit").alias("_cdc_commit_lsn"),
                F.col("__start_lsn").alias("_cdc_lsn"),
                end_ts,
                (F.unix_micros(end_ts) - F.unix_micros(start_ts)).cast("double") / 1e6,
                *[F.col(q(f"__carried_{c}")) for c in join.columns],
                F.col("__end_commit").alias("_cdc_end_commit_lsn"),
                F.col("__end_lsn").alias("_cdc_end_lsn"),
            )
            .toDF(*names)
            .withColumn("__rank", F.row_number().over(first))
            .where("__rank = 1")
            .drop("__rank")
        )
        identity = (
            f"t.{q(key)} <=> s.{q(key)} AND t._cdc_commit_lsn = s._cdc_commit_lsn "
            "AND t._cdc_lsn = s._cdc_lsn"
        )
        earlier = (
            "s._cdc_end_commit_lsn IS NOT NULL AND (t._cdc_end_commit_lsn IS NULL "
            "OR struct(s._cdc_end_commit_lsn, s._cdc_end_lsn) "
            "< struct(t._cdc_end_commit_lsn, t._cdc_end_lsn))"
        )
        (
            target.alias("t")
            .merge(rows.alias("s"), identity)
            .whenMatchedUpdateAll(condition=earlier)
            .whenNotMatchedInsertAll()
            .execute()
        )

    return (
        joined.writeStream.queryName(f"cdc-{settings.pipeline.name}-join-{join.name}")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(write)
    )
