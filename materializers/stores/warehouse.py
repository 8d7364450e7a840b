"""Delta Lake: per source table, the current state kept by MERGE with a position guard.

`<warehouse>/<schema>/<table>/current` holds one row per key ever seen: the
columns typed from the PostgreSQL catalog, plus `_cdc_offset`, `_cdc_partition`,
`_cdc_lsn`, `_cdc_commit_ts` and `_cdc_deleted`. A delete keeps the row as a deleted
marker (`_cdc_deleted = true`, columns as they were) with its position, so a stale
write is refused for ever; readers see live rows through the `<table>` view
(`WHERE NOT _cdc_deleted`). A MERGE updates a row only from a newer position; an
unchanged TOASTed value keeps the stored column.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cdc.catalog import Table
from materializers.stores.base import Event, Store, WriteResult
from materializers.typed import spark_type, typed_image

__all__ = ["WarehouseStore", "current_path"]

META = ["_cdc_offset", "_cdc_partition", "_cdc_lsn", "_cdc_commit_ts", "_cdc_deleted"]


def current_path(root: str, table: str) -> str:
    schema, name = table.split(".", 1)
    return f"{root.rstrip('/')}/{schema}/{name}/current"


class WarehouseStore(Store):
    name = "warehouse"
    spark_native = True

    def __init__(self, spark: Any, root: str) -> None:
        self.spark = spark
        self.root = root

    def prepare(self, tables: Iterable[Table]) -> None:
        for table in tables:
            self._ensure(table)

    def _ensure(self, table: Table) -> Any:
        from delta.tables import DeltaTable
        from pyspark.sql import types as T

        path = current_path(self.root, table.qualified)
        fields = [T.StructField(c.name, spark_type(c)) for c in table.columns]
        fields += [
            T.StructField("_cdc_offset", T.LongType()),
            T.StructField("_cdc_partition", T.IntegerType()),
            T.StructField("_cdc_lsn", T.LongType()),
            T.StructField("_cdc_commit_ts", T.TimestampType()),
            T.StructField("_cdc_deleted", T.BooleanType()),
        ]
        if not DeltaTable.isDeltaTable(self.spark, path):
            if not path.startswith(("s3", "gs", "abfs", "hdfs")):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            DeltaTable.createIfNotExists(self.spark).location(path).addColumns(
                T.StructType(fields)
            ).execute()
        target = DeltaTable.forPath(self.spark, path)
        have = set(target.toDF().columns)
        added = [f for f in fields if f.name not in have]
        if added:  # a column added in PostgreSQL
            columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in added)
            self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
            target = DeltaTable.forPath(self.spark, path)
        return target

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        raise NotImplementedError("the warehouse writes Spark frames: use write_frame")

    def write_frame(self, tables: dict[str, Table], events: Any) -> None:
        """MERGE each key's last event of the batch into its table's current state.

        A TOAST placeholder in the last event is filled from the key's latest earlier
        event in the batch that carried the value (if none did, the stored value stays).
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        present = {r["table"] for r in events.select("table").distinct().collect()}
        for name in sorted(present & set(tables)):
            table = tables[name]
            target = self._ensure(table)
            rows = events.where(F.col("table") == name)
            key_image = typed_image(
                table.__class__(
                    table.schema,
                    table.name,
                    tuple(table.column(k) for k in table.key),
                    table.key,
                    table.replica_identity,
                    0,
                    0,
                ),
                F.col("key"),
                prefix="k_",
            )
            decoded = rows.select(
                "key",
                "op",
                "offset",
                "partition",
                "lsn",
                "commit_ms",
                *key_image,
                *typed_image(table, F.col("after")),
            )
            placeholders = {c for c in decoded.columns if c.startswith("__ph_")}
            by_key = Window.partitionBy("key").orderBy("offset")
            history = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            types = {c.name: spark_type(c) for c in table.columns}
            for flag in placeholders:
                c = flag[len("__ph_") :]
                # the key's latest known value of c in the batch up to this event: a real
                # value is known, a placeholder tells nothing, a delete forgets
                value = F.when(
                    F.col("op") == "d",
                    F.struct(F.lit(None).cast(types[c]).alias("v"), F.lit(False).alias("known")),
                ).when(
                    ~F.col(flag), F.struct(F.col(f"`{c}`").alias("v"), F.lit(True).alias("known"))
                )
                decoded = decoded.withColumn(
                    f"__carried_{c}", F.last(value, ignorenulls=True).over(history)
                )
            newest = Window.partitionBy("key").orderBy(F.col("offset").desc())
            source = decoded.withColumn("__rank", F.row_number().over(newest)).where("__rank = 1")
            for flag in placeholders:
                c = flag[len("__ph_") :]
                known = F.coalesce(F.col(f"__carried_{c}.known"), F.lit(False))
                source = source.withColumn(
                    c, F.when(known, F.col(f"__carried_{c}.v")).otherwise(F.col(f"`{c}`"))
                ).withColumn(flag, F.col(flag) & ~known)
            condition = " AND ".join(f"t.`{k}` <=> s.`k_{k}`" for k in table.key)
            meta = {
                "_cdc_offset": "s.offset",
                "_cdc_partition": "s.partition",
                "_cdc_lsn": "s.lsn",
                "_cdc_commit_ts": "timestamp_millis(s.commit_ms)",
            }
            values = {}
            for column in table.columns:
                c = column.name
                if column.name in table.key:
                    values[c] = f"s.`k_{c}`"
                elif f"__ph_{c}" in placeholders:
                    values[c] = f"CASE WHEN s.`__ph_{c}` THEN t.`{c}` ELSE s.`{c}` END"
                else:
                    values[c] = f"s.`{c}`"
            insert = {
                c: (
                    v
                    if not v.startswith("CASE")
                    else f"CASE WHEN s.`__ph_{c}` THEN NULL ELSE s.`{c}` END"
                )
                for c, v in values.items()
            }
            (
                target.alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedUpdate(
                    condition="s.offset > t._cdc_offset AND s.op = 'd'",
                    set={**meta, "_cdc_deleted": "true"},
                )
                .whenMatchedUpdate(
                    condition="s.offset > t._cdc_offset",
                    set={
                        **{f"`{c}`": v for c, v in values.items()},
                        **meta,
                        "_cdc_deleted": "false",
                    },
                )
                .whenNotMatchedInsert(
                    values={
                        **{
                            f"`{c}`": (
                                v
                                if c in table.key
                                else f"CASE WHEN s.op = 'd' THEN NULL ELSE {v} END"
                            )
                            for c, v in insert.items()
                        },
                        **meta,
                        "_cdc_deleted": "s.op = 'd'",
                    }
                )
                .execute()
            )
