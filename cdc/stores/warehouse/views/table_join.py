"""Table-table joins (`apply.joins` of kind `table`), under
`<warehouse>/<prefix>/_views/<name>`: each row of a table with the columns of the row
one of its columns references, as they are now.

A join view is refreshed by the warehouse after each micro-batch, for the rows the
batch touched on either side, from the current-state tables it has just written: it
is a function of those tables, so replays and restarts converge with them. `cdc
verify` compares it with the same join computed by PostgreSQL.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc.core.catalog import Table
from cdc.core.settings.views import TableJoin
from cdc.stores.base import Verifier
from cdc.stores.warehouse.conflicts import retried
from cdc.stores.warehouse.native import NativeWriter, null_safe_match
from cdc.stores.warehouse.native import datafusion_quoted as dq
from cdc.stores.warehouse.steps import Keep, Kept, as_frame
from cdc.stores.warehouse.tables import view_path
from cdc.stores.warehouse.views.base import ReferencingJoin
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["TableJoinView", "refresh_join", "refresh_join_arrow"]

log = logging.getLogger(__name__)


class TableJoinView(ReferencingJoin):
    """A table-table join (TableJoin), refreshed after each warehouse batch."""

    settings: TableJoin

    @property
    def verified_as(self) -> str:
        return "join view equals PostgreSQL's join"

    def verify(self, by: Verifier) -> Any:
        return by.against_source(self)

    def keeps(self) -> dict[str, set[Keep]]:
        return {self.settings.table: {"keys"}, self.settings.references: {"keys"}}

    def refresh(
        self,
        spark: Any,
        root: str,
        tables: dict[str, Table],
        kept: dict[str, Kept],
        truncated: set[str],
        native: NativeWriter | None = None,
    ) -> None:
        """Its rows for the keys the batch touched on either side, or all its rows after
        a TRUNCATE (or a reset) of either."""
        sides = set(self.sides)
        touched = {t for t in sides if t in kept and kept[t].keys is not None}
        if not sides & (touched | truncated) or not sides <= set(tables):
            return
        keys = {} if sides & truncated else {t: kept[t].keys for t in touched}
        # the batch was shaped on the driver: its keys are Arrow, and so is the join
        shaped = bool(keys) and all(isinstance(k, pa.Table) for k in keys.values())
        if (
            shaped
            and native is not None
            and refresh_join_arrow(root, self.settings, tables, keys, native)
        ):
            return
        frames = {t: as_frame(spark, k) for t, k in keys.items()}
        refresh_join(spark, root, self.settings, tables, frames, native)


def _joined_fields(join: TableJoin, left: Table, right: Table) -> list[Any]:
    from pyspark.sql import types as T

    fields = [T.StructField(c.name, spark_type(c)) for c in left.columns]
    fields += [
        T.StructField(join.column_prefix + c, spark_type(right.column(c))) for c in join.columns
    ]
    return fields


def refresh_join_arrow(
    root: str,
    join: TableJoin,
    tables: dict[str, Table],
    touched: dict[str, Any],
    native: NativeWriter,
) -> bool:
    """`refresh_join` for the keys `touched` (per table: an Arrow table of its key
    columns; at least one) without Spark: the current states read by delta-rs, joined in
    Arrow, one delta-rs MERGE. False, having written nothing, where it cannot (a table
    delta-rs does not read, a type Arrow's join or filters do not take): the caller
    refreshes with Spark."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from cdc.stores.warehouse.tables import current_path

    left, right = tables[join.table], tables[join.references]
    (ref,) = right.key
    live_left = native.dataset(current_path(root, left.qualified))
    live_right = native.dataset(current_path(root, right.qualified))
    view = view_path(root, join.name)
    held = native.dataset(view)
    columns = [c.name for c in left.columns] + join.carried
    # a view not made yet, or without a column it now has: Spark makes or widens it
    if (
        live_left is None
        or live_right is None
        or held is None
        or set(columns) - set(held.schema.names)
    ):
        return False
    key = list(left.key)
    try:
        types = live_left.schema
        parts = []
        if join.table in touched:
            keys = touched[join.table].select(key)
            parts.append(keys.cast(pa.schema([types.field(k) for k in key])))
        if join.references in touched:
            refs = pc.cast(touched[join.references].column(ref), types.field(join.on).type)
            parts.append(live_left.to_table(columns=key, filter=ds.field(join.on).isin(refs)))
        affected = pa.concat_tables(parts).group_by(key, use_threads=False).aggregate([])
        first = affected.column(key[0])
        candidates = live_left.to_table(filter=ds.field(key[0]).isin(first.drop_null()))
        rows = candidates.join(affected, keys=key, join_type="left semi")
        wanted = pc.unique(rows.column(join.on).drop_null())
        wanted = pc.cast(wanted, live_right.schema.field(ref).type)
        carried = live_right.to_table(
            columns=[ref, *join.columns], filter=ds.field(ref).isin(wanted)
        )
        carried = carried.rename_columns(
            ["_cdc_ref", *[join.column_prefix + c for c in join.columns]]
        )
        rows = rows.select([c.name for c in left.columns])
        joined = rows.join(carried, keys=join.on, right_keys="_cdc_ref", join_type="left outer")
        joined = joined.append_column("_cdc_present", pa.array([True] * joined.num_rows))
        source = affected.join(joined, keys=key, join_type="left outer")
    except (pa.ArrowException, ValueError, TypeError) as exc:
        log.info("join view %s: refreshed by Spark (%s)", join.name, exc)
        return False
    values = {dq(c): f"s.{dq(c)}" for c in columns}
    clauses: list[Any] = [
        ("delete", "s._cdc_present IS NULL", None),
        ("update", "s._cdc_present", values),
        ("insert", "s._cdc_present", values),
    ]
    return native.merge(view, source, null_safe_match([(k, k) for k in key]), clauses)


def refresh_join(
    spark: Any,
    root: str,
    join: TableJoin,
    tables: dict[str, Table],
    touched: dict[str, DataFrame],
    native: NativeWriter | None = None,
) -> None:
    """Recompute the view's rows for the keys `touched` (per table: its key columns) on
    either side; every row when `touched` names neither table's keys (after a TRUNCATE).
    One MERGE, by delta-rs where `native` can."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from cdc.stores.warehouse.tables import current_path, ensure_delta

    left, right = tables[join.table], tables[join.references]
    live_left = DeltaTable.forPath(spark, current_path(root, left.qualified)).toDF()
    live_right = DeltaTable.forPath(spark, current_path(root, right.qualified)).toDF()
    view = ensure_delta(spark, view_path(root, join.name), _joined_fields(join, left, right))
    (ref,) = right.key
    carried = live_right.select(
        F.col(q(ref)).alias("_cdc_ref"),
        *[F.col(q(c)).alias(join.column_prefix + c) for c in join.columns],
    )
    key_columns = [F.col(q(k)) for k in left.key]
    parts = []
    if join.table in touched:
        parts.append(touched[join.table].select(*key_columns))
    if join.references in touched:
        changed = touched[join.references].select(F.col(q(ref)).alias("_cdc_ref"))
        parts.append(
            live_left.join(changed, F.col(q(join.on)) == F.col("_cdc_ref"), "left_semi").select(
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
        .join(carried, F.col(q(join.on)) == F.col("_cdc_ref"), "left")
        .select(
            *[F.col(q(c.name)) for c in left.columns],
            *[F.col(q(join.column_prefix + c)) for c in join.columns],
            F.lit(True).alias("_cdc_present"),
        )
    )
    source = affected.join(joined, [*left.key], "left")
    columns = [c.name for c in left.columns] + join.carried
    if native is not None and not full:  # all its rows: Spark's tasks stream them
        values = {dq(c): f"s.{dq(c)}" for c in columns}
        clauses: list[Any] = [
            ("delete", "s._cdc_present IS NULL", None),
            ("update", "s._cdc_present", values),
            ("insert", "s._cdc_present", values),
        ]
        on = null_safe_match([(k, k) for k in left.key])
        if native.merge(view_path(root, join.name), source, on, clauses):
            return
    values = {q(c): f"s.{q(c)}" for c in columns}
    retried(
        f"the MERGE into the view {join.name}",
        lambda: (
            view.alias("v")
            .merge(source.alias("s"), " AND ".join(f"v.{q(k)} <=> s.{q(k)}" for k in left.key))
            .whenMatchedDelete(condition="s._cdc_present IS NULL")
            .whenMatchedUpdate(condition="s._cdc_present", set=values)
            .whenNotMatchedInsert(condition="s._cdc_present", values=values)
            .execute()
        ),
    )
