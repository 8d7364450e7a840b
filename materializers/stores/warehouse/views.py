"""Derived data in the warehouse (`apply.joins`, `apply.windows`), under
`<warehouse>/<prefix>/_views/<name>`: the settings' check, and the table-table joins.

A join view is refreshed by the warehouse after each micro-batch, for the rows the
batch touched on either side, from the current-state tables it has just written: it
is a function of those tables, so replays and restarts converge with them. Stream-table
joins are in enrich.py; window aggregates and stream-stream joins, queries of their
own with a watermark, in streams.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdc.catalog import Table
from cdc.errors import ConfigError
from cdc.settings import JoinView, Settings
from materializers.log.typed import quoted as q
from materializers.log.typed import spark_type
from materializers.stores.warehouse.enrich import EVENT_COLUMNS
from materializers.stores.warehouse.streams import JOIN_COLUMNS
from materializers.stores.warehouse.tables import view_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_views", "refresh_join", "view_path"]


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
        carried = {join.column_prefix + c for c in join.columns}
        for c in [*join.columns, *join.when]:
            column(right, c, join.name)
        if join.kind == "stream_stream":
            column(right, join.on, join.name)
            if len(left.key) != 1:
                raise ConfigError(
                    f"view {join.name}: {left.qualified} has a composite key "
                    f"({', '.join(left.key)}); a stream_stream join needs a single-column key"
                )
            taken = {*left.key, *JOIN_COLUMNS}
        else:
            column(left, join.on, join.name)
            if len(right.key) != 1:
                raise ConfigError(
                    f"view {join.name}: {right.qualified} has a composite key "
                    f"({', '.join(right.key)}); a join view needs a single-column key"
                )
            taken = {c.name for c in left.columns}
            if join.kind == "stream_table":
                taken |= set(EVENT_COLUMNS)
        added = set(JOIN_COLUMNS if join.kind == "stream_stream" else EVENT_COLUMNS)
        kept = set(left.key) if join.kind == "stream_stream" else {c.name for c in left.columns}
        if join.kind != "table" and kept & added:
            raise ConfigError(
                f"view {join.name}: {left.qualified}'s column {sorted(kept & added)[0]} is "
                "named like one the view adds to every row; rename the column"
            )
        clash = sorted(taken & carried)
        if clash:
            raise ConfigError(
                f"view {join.name}: {', '.join(clash)} is already a column of the view "
                f"(of {left.qualified}, or the event's); give the join another prefix"
            )
    for window in apply.windows:
        t = table(window.table, window.name)
        for read in (window.sum, window.group_by):
            if read is not None:
                column(t, read, window.name)
        if window.group_by in ("window_start", "window_end", "rows", "total"):
            raise ConfigError(
                f"view {window.name}: group_by {window.group_by} is a column the window "
                "has already; sessions cannot be grouped by a column of that name"
            )


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
