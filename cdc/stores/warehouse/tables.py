"""The warehouse's Delta tables: where they live and how they are made.

`<warehouse>/<prefix>/<schema>/<table>/current` (one row per key) and `.../history`
(one row per version), `<prefix>` the pipeline's topic prefix: a pipeline's tables are
its own, as its cache keys and search indexes are. They are created with Delta's column
mapping by name and given the columns PostgreSQL adds, or widened where PostgreSQL
widened a type.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from cdc.core.errors import ConfigError, StoreError
from cdc.core.settings import Settings
from cdc.core.topics import folder_problem
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import widens

__all__ = [
    "aligned_rows",
    "append_rows",
    "clear_columns",
    "current_path",
    "dropped_columns",
    "ensure_delta",
    "history_path",
    "is_empty",
    "view_path",
    "warehouse_base",
    "warehouse_root",
]


def warehouse_base(settings: Settings) -> str:
    """The warehouse's folder ([stores.warehouse] path, else data_dir's): every pipeline's."""
    configured = settings.store_section("warehouse").path
    return (configured or str(settings.data_dir / "warehouse")).rstrip("/")


def warehouse_root(settings: Settings) -> str:
    """The pipeline's folder in the warehouse."""
    return f"{warehouse_base(settings)}/{settings.pipeline.topic_prefix}"


@functools.lru_cache(maxsize=4096)  # every batch asks, a name's folder never changes
def _folder(root: str, table: str) -> str:
    """The table's folder in the warehouse; a name that would reach another folder is
    refused (`cdc setup` refuses it first: cdc.core.topics.folder_problem)."""
    problem = folder_problem(table)
    if problem is not None:
        raise ConfigError(
            f"table {table} has no folder in the warehouse: {problem}; rename it, or leave "
            "it out (pipeline.tables, pipeline.exclude_tables) and run `cdc setup`"
        )
    schema, name = table.split(".", 1)
    return f"{root.rstrip('/')}/{schema}/{name}"


def current_path(root: str, table: str) -> str:
    return f"{_folder(root, table)}/current"


def history_path(root: str, table: str) -> str:
    return f"{_folder(root, table)}/history"


def view_path(root: str, name: str) -> str:
    """A join view's, an enrichment's or a window aggregate's Delta table."""
    return f"{root.rstrip('/')}/_views/{name}"


# Delta's column mapping by name: a column is stored under a physical name of its own, so
# any PostgreSQL column name works (spaces, commas, braces, `=`: what Parquet refuses).
# Only a table with such a name gets it: readers other than Spark (delta-rs, so Polars
# and the `deltalake` package) do not all read it (docs/stores.md, "Reading the warehouse").
_COLUMN_MAPPING = {
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "2",
    "delta.minWriterVersion": "5",
}
_NOT_PHYSICAL = re.compile(r"[ ,;{}()\n\t=]")


def dropped_columns(target: Any, fields: list[Any]) -> list[str]:
    """The Delta table's data columns that `fields` no longer have (dropped in
    PostgreSQL, or renamed there)."""
    wanted = {f.name for f in fields}
    return [
        f.name
        for f in target.toDF().schema.fields
        if f.name not in wanted and not f.name.startswith("_cdc")
    ]


def clear_columns(target: Any, columns: list[str]) -> None:
    """Set `columns` to NULL in every row that holds a value in one (no commit when none
    does)."""
    if not columns:
        return
    held = " OR ".join(f"{q(c)} IS NOT NULL" for c in columns)
    if target.toDF().where(held).limit(1).count():
        target.update(condition=held, set={q(c): "NULL" for c in columns})


def ensure_delta(
    spark: Any,
    path: str,
    fields: list[Any],
    properties: dict[str, str] | None = None,
) -> Any:
    """The Delta table at `path`, created with `fields` and `properties`, or given the
    ones it lacks."""
    from delta.tables import DeltaTable
    from pyspark.sql import types as T

    if not DeltaTable.isDeltaTable(spark, path):
        if "://" not in path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        builder = DeltaTable.createIfNotExists(spark).location(path)
        if any(_NOT_PHYSICAL.search(f.name) for f in fields):
            for key, value in _COLUMN_MAPPING.items():
                builder = builder.property(key, value)
        for key, value in (properties or {}).items():
            builder = builder.property(key, value)
        builder = builder.addColumns(T.StructType(fields))
        builder.execute()
    target = DeltaTable.forPath(spark, path)
    if properties:
        detail: Any = target.detail().first()
        held = detail["properties"] or {}
        differ = {k: v for k, v in properties.items() if held.get(k) != v}
        if differ:  # a key PostgreSQL changed
            settings = ", ".join(f"'{k}' = '{_literal(v)}'" for k, v in differ.items())
            spark.sql(f"ALTER TABLE delta.{q(path)} SET TBLPROPERTIES ({settings})")
    have = {f.name: f.dataType for f in target.toDF().schema.fields}
    added = [f for f in fields if f.name not in have]
    if any(_NOT_PHYSICAL.search(f.name) for f in added):
        # a column added in PostgreSQL with a name Parquet cannot hold: mapping from now on
        settings = ", ".join(f"'{k}' = '{v}'" for k, v in _COLUMN_MAPPING.items())
        spark.sql(f"ALTER TABLE delta.{q(path)} SET TBLPROPERTIES ({settings})")
    if added:  # a column added in PostgreSQL
        columns = ", ".join(f"{q(f.name)} {f.dataType.simpleString()}" for f in added)
        spark.sql(f"ALTER TABLE delta.{q(path)} ADD COLUMNS ({columns})")
    changed = [f for f in fields if f.name in have and have[f.name] != f.dataType]
    refused = [f for f in changed if not widens(have[f.name], f.dataType)]
    if refused:
        f = refused[0]
        raise StoreError(
            f"column {f.name} changed from {have[f.name].simpleString()} to "
            f"{f.dataType.simpleString()}, which is not a widening the warehouse takes in "
            f"place; rebuild {path} from the log (`cdc rebuild --store warehouse`)"
        )
    if changed:  # a column whose type PostgreSQL widened: the table written anew
        rewrite(spark, path, {f.name: f.dataType for f in changed})
    if added or changed:
        target = DeltaTable.forPath(spark, path)
    return target


def rewrite(spark: Any, path: str, types: dict[str, Any]) -> None:
    """The Delta table at `path` written anew (one overwrite, a Delta version of its own:
    time travel still reads what was before) with the columns `types` cast to their new
    types. No Delta table feature is needed for it, so every reader that read the table
    reads it after (Delta's type widening would add a reader feature delta-rs refuses)."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    columns = [
        F.col(q(c)).cast(types[c]).alias(c) if c in types else F.col(q(c)) for c in frame.columns
    ]
    (
        frame.select(*columns)
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(path)
    )


def _literal(text: str) -> str:
    """`text` inside a Spark SQL string literal ('…')."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def is_empty(target: Any) -> bool:
    """No data file in the Delta table's latest version: new, or every row deleted."""
    return int(target.detail().first()["numFiles"]) == 0


def aligned_rows(target: Any, rows: Any, nulls: bool = False) -> Any:
    """`rows` (a frame with the table's column names) as the Delta table `target` holds
    them: each column in the table's order and type. With `nulls`, a column `rows` lacks
    is NULL."""
    from pyspark.sql import functions as F

    return rows.select(
        *[
            F.col(q(f.name)).cast(f.dataType)
            if f.name in rows.columns or not nulls
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in target.toDF().schema.fields
        ]
    )


def append_rows(target: Any, path: str, rows: Any, nulls: bool = False) -> None:
    """Append `rows` to the Delta table at `path` (`target` its handle), aligned to it
    (aligned_rows): what a MERGE that matched nothing writes, in a plain write (a MERGE
    costs seconds here whatever its size)."""
    aligned_rows(target, rows, nulls).write.format("delta").mode("append").save(path)
