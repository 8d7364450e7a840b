"""The current state's MERGE: the typed key of each change (`key_image`), and the
clauses that apply a batch's changes by the write rule (`current_clauses`, its condition
`older_sql` from cdc/log/position.py), written by Spark or by delta-rs (each quoting
names its own way)."""

from __future__ import annotations

from typing import Any

from cdc.core.catalog import Table
from cdc.log.position import ORDER, older_sql
from cdc.types.spark_types import PLACEHOLDER_FLAG, typed_image

__all__ = ["POSITION", "current_clauses", "current_values", "key_image"]

# the write rule (cdc/log/position.py): the target row `t` is older than the source
# row `s`'s change
POSITION = [f"_cdc_{name}" for name in ORDER]
_OLDER = older_sql([f"t.{c}" for c in POSITION], [f"s.{c}" for c in POSITION])
# what the decoded events carry beside the table's columns, each as `_cdc_<name>`


def key_image(table: Table) -> list[Any]:
    """The columns decoding an event's key (its JSON text) into the key's typed columns,
    as `_cdc_k_<column>`: a key column's value comes from the event's key."""
    from pyspark.sql import functions as F

    only_key = table.__class__(
        table.schema,
        table.name,
        tuple(table.column(k) for k in table.key),
        table.key,
        table.replica_identity,
        0,
        0,
    )
    return typed_image(only_key, F.col("key"), prefix="_cdc_k_", placeholders=False)


def current_values(
    table: Table, placeholders: set[str], quote: Any
) -> tuple[dict[str, str], dict[str, str]]:
    """The current state's columns (quoted by `quote`, Spark's or delta-rs's) and the
    expression of each over the MERGE's source `s` and target `t`: (on an update, on an
    insert or append)."""
    meta = {
        "_cdc_commit_lsn": "s._cdc_commit_lsn",
        "_cdc_lsn": "s._cdc_lsn",
        "_cdc_offset": "s._cdc_offset",
        "_cdc_partition": "s._cdc_partition",
        "_cdc_commit_ts": "s._cdc_commit_ts",
    }
    updated, inserted = {}, {}
    for column in table.columns:
        c = column.name
        if c in table.key:
            updated[c] = inserted[c] = f"s.{quote('_cdc_k_' + c)}"
        elif PLACEHOLDER_FLAG + c in placeholders:  # an unchanged TOASTed value: the stored one
            flag = f"s.{quote(PLACEHOLDER_FLAG + c)}"
            updated[c] = f"CASE WHEN {flag} THEN t.{quote(c)} ELSE s.{quote(c)} END"
            inserted[c] = f"CASE WHEN {flag} THEN NULL ELSE s.{quote(c)} END"
        else:
            updated[c] = inserted[c] = f"s.{quote(c)}"
    return (
        {quote(c): v for c, v in updated.items()} | meta,
        {quote(c): v for c, v in inserted.items()} | meta,
    )


def current_clauses(
    table: Table, placeholders: set[str], quote: Any
) -> list[tuple[str, str | None, dict[str, str] | None]]:
    """The current state's MERGE clauses, in order: a tombstone deletes what an earlier
    record of its partition wrote; a change from a newer position deletes or updates;
    a live change of a key the table lacks is inserted."""
    updated, inserted = current_values(table, placeholders, quote)
    return [
        (
            "delete",
            "s._cdc_commit_lsn IS NULL AND "
            "t._cdc_partition = s._cdc_partition AND t._cdc_offset < s._cdc_offset",
            None,
        ),
        ("delete", f"s._cdc_commit_lsn IS NOT NULL AND s._cdc_op = 'd' AND {_OLDER}", None),
        ("update", f"s._cdc_commit_lsn IS NOT NULL AND {_OLDER}", updated),
        ("insert", "s._cdc_commit_lsn IS NOT NULL AND s._cdc_op <> 'd'", inserted),
    ]
