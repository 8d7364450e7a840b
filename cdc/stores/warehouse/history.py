"""The warehouse's history (SCD type 2): every change becomes one version of its key, once,
appended to `<warehouse>/<prefix>/<schema>/<table>/history`; a TRUNCATE is one row too.

The table is append-only: a batch adds its new versions in one plain Delta append, and
nothing already written is ever rewritten. A version row holds the table's columns as
the change left them (a delete: none), `_cdc_op` (c, u, r, d), where it sits in the
source (`_cdc_commit_lsn`, `_cdc_lsn`), where it sat in Kafka (`_cdc_partition`,
`_cdc_offset`) and its commit time `_cdc_commit_ts`. A TRUNCATE (or the sweep of an older
snapshot generation) is a row of `_cdc_op = 't'` with its position and commit time and
no key.

A version's end is derived when the history is read (`derived_history`, and the SQL that
`history_sql` gives other engines): a version is valid from its commit time (no later
than any version after it: a backfill's row is stamped when it was read, and placed at
the commit it had last seen) until the next version of its key begins, or the first
TRUNCATE after it, whichever comes first; the newest version of a key is open (NULL)
unless a TRUNCATE ended it. A delete is a version with no values.
"""

from __future__ import annotations

import json
from typing import Any

from cdc.core.catalog import Table
from cdc.types.spark_types import PLACEHOLDER_FLAG
from cdc.types.spark_types import quoted as q

__all__ = [
    "HISTORY_META",
    "KEY_PROPERTY",
    "TRUNCATE_OP",
    "derived_history",
    "history_key",
    "history_sql",
    "version_rows",
]

KEY_PROPERTY = "cdc.key"  # the history's Delta property: its key columns, as a JSON list
TRUNCATE_OP = "t"  # a TRUNCATE's row (no key): every version before it ends there at the latest
# the history's own columns, after the table's
HISTORY_META = (
    "_cdc_op",
    "_cdc_offset",
    "_cdc_partition",
    "_cdc_lsn",
    "_cdc_commit_ts",
    "_cdc_commit_lsn",
)


def version_rows(table: Table, changes: Any, placeholders: set[str], stored: Any) -> Any:
    """The history rows of a batch's new changes (`changes`: decoded events with a
    position, each (key, position) once).

    An unchanged TOASTed value (`placeholders`: the flag columns, each PLACEHOLDER_FLAG
    and its column's name) is taken from the key's previous change in the batch that
    carried it, else from `stored`: the current state as it was before the batch (None
    when it holds no row)."""
    from pyspark.sql import functions as F

    if placeholders and stored is not None:
        on = [F.col(q(f"_cdc_k_{k}")).eqNullSafe(F.col(q(f"_cdc_cur_{k}"))) for k in table.key]
        changes = changes.join(stored, on, "left")
    columns = []
    for column in table.columns:
        c = column.name
        if c in table.key:
            columns.append(F.col(q(f"_cdc_k_{c}")).alias(c))
            continue
        value = F.col(q(c))
        if PLACEHOLDER_FLAG + c in placeholders:
            known = F.coalesce(F.col(q(f"_cdc_carried_{c}") + ".known"), F.lit(False))
            held = F.col(q(f"_cdc_cur_{c}")) if stored is not None else F.lit(None)
            value = (
                F.when(~F.col(q(PLACEHOLDER_FLAG + c)), value)
                .when(known, F.col(q(f"_cdc_carried_{c}") + ".v"))
                .otherwise(held)
            )
        columns.append(F.when(F.col("_cdc_op") == "d", None).otherwise(value).alias(c))
    return changes.select(
        *columns,
        "_cdc_op",
        "_cdc_offset",
        "_cdc_partition",
        "_cdc_lsn",
        F.timestamp_millis("_cdc_commit_ms").alias("_cdc_commit_ts"),
        "_cdc_commit_lsn",
    )


def history_sql(relation: str, key: list[str], names: list[str], quote: str = "`") -> str:
    """The SQL that reads the history `relation` as versions with their ends
    (`valid_from`, `valid_to`), in SQL that Spark, DuckDB and PostgreSQL all run: `key`
    the table's key columns (the Delta table's property `cdc.key`), `names` its columns
    (the history's own, `_cdc_*`, left out), `quote` the engine's identifier quote."""

    def name(column: str) -> str:
        return quote + column.replace(quote, quote * 2) + quote

    columns = ", ".join(name(c) for c in names)
    key_list = ", ".join(name(k) for k in key)
    by_key = f"PARTITION BY {key_list} ORDER BY _cdc_commit_lsn, _cdc_lsn"
    return f"""WITH versions AS (
  SELECT * FROM {relation} WHERE _cdc_op <> '{TRUNCATE_OP}'
), cuts AS (
  SELECT _cdc_commit_lsn AS cut_commit, _cdc_lsn AS cut_lsn, _cdc_commit_ts AS cut_ts,
    LAG(_cdc_commit_lsn) OVER (ORDER BY _cdc_commit_lsn, _cdc_lsn) AS prev_commit,
    LAG(_cdc_lsn) OVER (ORDER BY _cdc_commit_lsn, _cdc_lsn) AS prev_lsn
  FROM {relation} WHERE _cdc_op = '{TRUNCATE_OP}'
), capped AS (
  -- the first TRUNCATE after each version: the one after it whose previous one is not
  SELECT v.*, c.cut_ts AS _cdc_cap FROM versions v LEFT JOIN cuts c
    ON (v._cdc_commit_lsn < c.cut_commit
        OR (v._cdc_commit_lsn = c.cut_commit AND v._cdc_lsn < c.cut_lsn))
   AND (c.prev_commit IS NULL OR v._cdc_commit_lsn > c.prev_commit
        OR (v._cdc_commit_lsn = c.prev_commit AND v._cdc_lsn >= c.prev_lsn))
), started AS (
  SELECT *, LEAST(MIN(_cdc_commit_ts) OVER ({by_key}
    ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING), _cdc_cap) AS valid_from
  FROM capped
)
SELECT {columns}, _cdc_op, _cdc_offset, _cdc_partition, _cdc_lsn, valid_from,
  LEAST(LEAD(valid_from) OVER ({by_key}), _cdc_cap) AS valid_to, _cdc_commit_lsn
FROM started"""


def derived_history(spark: Any, frame: Any, key: list[str]) -> Any:
    """The history `frame` (a Delta table's rows, as written; `key`: its key columns) as
    versions with their ends (module doc): the SQL of history_sql, run by Spark."""
    names = [c for c in frame.columns if not c.startswith("_cdc_")]
    relation = f"cdc_history_{id(frame):x}"
    frame.createOrReplaceTempView(relation)
    try:  # analysed here: the frame no longer needs the view's name
        return spark.sql(history_sql(relation, key, names))
    finally:
        spark.catalog.dropTempView(relation)


def history_key(spark: Any, path: str) -> list[str]:
    """The key columns of the history at `path` (its Delta property KEY_PROPERTY)."""
    from delta.tables import DeltaTable

    detail: Any = DeltaTable.forPath(spark, path).detail().first()
    properties = detail["properties"] or {}
    return list(json.loads(properties.get(KEY_PROPERTY, "[]")))
