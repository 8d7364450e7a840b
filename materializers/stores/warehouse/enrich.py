"""Stream-table joins (`apply.joins` of kind `stream_table`), under
`<warehouse>/<prefix>/_views/<name>`.

Each row inserted into the stream table after the snapshot (a creation event, op "c")
is an event: it stays in the view when its row is later changed or deleted. It is
enriched with the referenced row as it was when the event committed: of the referenced
key's versions in its history, the one with the greatest position (commit LSN, change
LSN) at or before the event's; NULLs when that version is a delete, or was ended by a
TRUNCATE before the event's commit time, or when there is none. A change of the
referenced row sorts after the events before it, so it never rewrites them.

The view is a function of the two tables' histories, kept after each warehouse batch:
- the batch's creation events are enriched (from the histories as the batch left them)
  and merged on the event's key and position, so a replayed or redelivered insert is
  one event;
- a version of a referenced row that reaches the warehouse after events it precedes
  (its topic read behind the stream's) enriches those events again: the events of its
  key at a later position. In the steady state every new version is newer than every
  enriched event, and the view is not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdc.catalog import Table
from cdc.settings import JoinView
from materializers.log.typed import quoted as q
from materializers.log.typed import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["EVENT_COLUMNS", "enrichment_fields", "refresh_enrichment"]

# after the stream table's columns: the event's commit time and position
EVENT_COLUMNS = ("event_ts", "_cdc_commit_lsn", "_cdc_lsn")


def enrichment_fields(join: JoinView, stream: Table, referenced: Table) -> list[Any]:
    from pyspark.sql import types as T

    fields = [T.StructField(c.name, spark_type(c)) for c in stream.columns]
    event_ts, commit_lsn, lsn = EVENT_COLUMNS
    fields += [
        T.StructField(event_ts, T.TimestampType()),
        T.StructField(commit_lsn, T.LongType()),
        T.StructField(lsn, T.LongType()),
    ]
    fields += [
        T.StructField(join.column_prefix + c, spark_type(referenced.column(c)))
        for c in join.columns
    ]
    return fields


def refresh_enrichment(
    spark: Any,
    root: str,
    join: JoinView,
    tables: dict[str, Table],
    created: DataFrame | None,
    versions: DataFrame | None,
    newest: tuple[int, int] | None,
    everything: bool = False,
) -> tuple[int, int] | None:
    """Enrich the batch's creation events of the stream table (`created`: its columns,
    _cdc_commit_lsn, _cdc_lsn, _cdc_commit_ms), and again the view's events that a
    version of the batch's referenced rows precedes (`versions`: `_cdc_ref` the
    referenced key, _cdc_commit_lsn, _cdc_lsn; work columns are all `_cdc_…`, which no
    column may be named), when one is older than `newest`, the newest event position the view held
    before the batch (None: not known, read from the view); with `everything`, every
    event of the view again (after a TRUNCATE of the referenced table). Returns the
    newest event position the view holds now."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from materializers.stores.warehouse.tables import ensure_delta, view_path

    stream, referenced = tables[join.table], tables[join.references]
    target = ensure_delta(
        spark, view_path(root, join.name), enrichment_fields(join, stream, referenced)
    )
    held = target.toDF()
    if newest is None:
        top = held.agg(F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
        newest = tuple(top["m"]) if top and top["m"] is not None else (0, 0)
    columns = [F.col(q(c.name)) for c in stream.columns]
    parts = []
    if created is not None and not created.isEmpty():  # a batch of updates has none
        parts.append(created.select(*columns, "_cdc_commit_lsn", "_cdc_lsn", "_cdc_commit_ms"))
    if everything:
        parts.append(_held_events(held, columns))
    elif versions is not None:
        first = versions.agg(F.min(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
        if first and first["m"] is not None and tuple(first["m"]) < newest:
            earliest = versions.groupBy("_cdc_ref").agg(
                F.min(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("_cdc_first")
            )
            event = F.struct(F.col("_cdc_commit_lsn"), F.col("_cdc_lsn"))
            parts.append(
                _held_events(
                    held.join(earliest, F.col(q(join.on)) == F.col("_cdc_ref")).where(
                        event > F.col("_cdc_first")
                    ),
                    columns,
                )
            )
    if not parts:
        return newest
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    events = events.dropDuplicates([*stream.key, "_cdc_commit_lsn", "_cdc_lsn"]).localCheckpoint()
    enriched = _as_of(spark, root, join, stream, referenced, events)
    identity = " AND ".join(
        [f"v.{q(k)} <=> s.{q(k)}" for k in stream.key]
        + ["v._cdc_commit_lsn = s._cdc_commit_lsn", "v._cdc_lsn = s._cdc_lsn"]
    )
    carried: dict[str, Any] = {
        q(join.column_prefix + c): f"s.{q(join.column_prefix + c)}" for c in join.columns
    }
    (
        DeltaTable.forPath(spark, view_path(root, join.name))
        .alias("v")
        .merge(enriched.alias("s"), identity)
        .whenMatchedUpdate(set=carried)
        .whenNotMatchedInsertAll()
        .execute()
    )
    top = events.agg(F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
    if top and top["m"] is not None:
        newest = max(newest, tuple(top["m"]))
    return newest


def _held_events(held: DataFrame, columns: list[Any]) -> DataFrame:
    """The view's rows as events to enrich again."""
    from pyspark.sql import functions as F

    return held.select(
        *columns,
        "_cdc_commit_lsn",
        "_cdc_lsn",
        F.unix_millis("event_ts").alias("_cdc_commit_ms"),
    )


def _as_of(
    spark: Any, root: str, join: JoinView, stream: Table, referenced: Table, events: DataFrame
) -> DataFrame:
    """Each event with the referenced row's columns as of its position (module doc)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from materializers.stores.warehouse.tables import history_path

    (key,) = referenced.key
    wanted = events.select(F.col(q(join.on)).alias("_cdc_ref")).distinct()
    by_position = Window.partitionBy(q(key)).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    versions = (
        spark.read.format("delta")
        .load(history_path(root, referenced.qualified))
        .join(wanted, F.col(q(key)) == F.col("_cdc_ref"), "left_semi")
        # the next version's start: a valid_to that is not it is a TRUNCATE's
        .withColumn("_cdc_v_next", F.lead("valid_from").over(by_position))
        .select(
            F.col(q(key)).alias("_cdc_ref"),
            F.col("_cdc_commit_lsn").alias("_cdc_v_commit"),
            F.col("_cdc_lsn").alias("_cdc_v_lsn"),
            F.col("_cdc_op").alias("_cdc_v_op"),
            F.col("valid_to").alias("_cdc_v_to"),
            "_cdc_v_next",
            *[F.col(q(c)).alias(join.column_prefix + c) for c in join.columns],
        )
    )
    at_or_before = (F.col("_cdc_v_commit") < F.col("_cdc_commit_lsn")) | (
        (F.col("_cdc_v_commit") == F.col("_cdc_commit_lsn"))
        & (F.col("_cdc_v_lsn") <= F.col("_cdc_lsn"))
    )
    latest = Window.partitionBy(*[q(k) for k in stream.key], "_cdc_commit_lsn", "_cdc_lsn").orderBy(
        F.col("_cdc_v_commit").desc_nulls_last(), F.col("_cdc_v_lsn").desc_nulls_last()
    )
    event_ts = F.timestamp_millis("_cdc_commit_ms")
    live = (
        F.col("_cdc_v_op").isNotNull()
        & (F.col("_cdc_v_op") != "d")
        & (
            F.col("_cdc_v_to").isNull()
            | F.col("_cdc_v_to").eqNullSafe(F.col("_cdc_v_next"))
            | (F.col("_cdc_v_to") >= event_ts)
        )
    )
    return (
        events.join(versions, (F.col(q(join.on)) == F.col("_cdc_ref")) & at_or_before, "left")
        .withColumn("_cdc_rank", F.row_number().over(latest))
        .where("_cdc_rank = 1")
        .select(
            *[F.col(q(c.name)) for c in stream.columns],
            event_ts.alias("event_ts"),
            "_cdc_commit_lsn",
            "_cdc_lsn",
            *[
                F.when(live, F.col(q(join.column_prefix + c))).alias(join.column_prefix + c)
                for c in join.columns
            ],
        )
    )
