"""Snapshot rows as Debezium change events, built by PostgreSQL itself.

Each captured table gets one SELECT that returns, per row, the message key and
the message value as text:

- the key is byte for byte what Debezium's JsonConverter (schemas disabled)
  writes for the same row: a compact JSON object of the key columns in key
  order, so a row's snapshot event and its later changes share a key and a
  partition, and compaction sees one key;
- the value is a Debezium envelope with `op: "r"`, the after-image encoded as
  the connector encodes each type under the project's settings
  (decimal.handling.mode=string, time.precision.mode=adaptive_time_microseconds,
  interval.handling.mode=string, binary as base64), and a `source` block that
  names the snapshot and its consistent point.

PostgreSQL formats every value in C; Spark only moves the text to Kafka.
"""

from __future__ import annotations

import json

from psycopg import sql

from cdc.capture.masks import masked_value
from cdc.capture.slot import SnapshotPoint
from cdc.core.catalog import Table
from cdc.types.debezium_sql import column_json

__all__ = ["envelope", "event_query", "key_json"]


def _object(table: Table, names: tuple[str, ...]) -> sql.Composable:
    """'{"a":<json>,"b":<json>}' concatenated in SQL (no argument limit, compact like Jackson)."""
    parts: list[sql.Composable] = []
    for i, name in enumerate(names):
        label = ("{" if i == 0 else ",") + json.dumps(name, ensure_ascii=False) + ":"
        parts += [sql.Literal(label), column_json(table.column(name), masked_value(table, name))]
    parts.append(sql.Literal("}"))
    return sql.SQL(" || ").join(parts)


def key_json(table: Table) -> sql.Composable:
    """SQL for a row's key as its change events carry it (Debezium's JSON of the key
    columns): what names it in the stores (a cache key's tail, a document's _id)."""
    return _object(table, table.key)


def source_block(table: Table, point: SnapshotPoint, topic_prefix: str, database: str) -> str:
    position = point.source_position()
    return json.dumps(
        {
            "version": "cdc-snapshot",
            "connector": "postgresql",
            "name": topic_prefix,
            "ts_ms": point.ts_ms,
            "snapshot": "true",
            "db": database,
            "sequence": position["sequence"],
            "ts_us": point.ts_ms * 1000,
            "ts_ns": point.ts_ms * 1_000_000,
            "schema": table.schema,
            "table": table.name,
            "txId": None,
            "lsn": position["lsn"],
            "xmin": None,
        },
        separators=(",", ":"),
    )


def event_query(table: Table) -> sql.Composable:
    """SELECT key, after FROM the table: each row's key and `after` image as Debezium's
    JSON (filter appended by caller). The rest of the envelope is the same for every
    row of a snapshot (envelope()), so it is added on Spark's side rather than built by
    PostgreSQL and carried through JDBC for each row."""
    return sql.SQL("SELECT {key} AS key, {after} AS after FROM {table}").format(
        key=key_json(table),
        after=_object(table, tuple(c.name for c in table.columns)),
        table=sql.Identifier(table.schema, table.name),
    )


def envelope(
    table: Table, point: SnapshotPoint, topic_prefix: str, database: str, now_ms: int
) -> tuple[str, str]:
    """The text before and after the `after` image in each snapshot event's value."""
    head = '{"before":null,"after":'
    tail = (
        f',"source":{source_block(table, point, topic_prefix, database)},'
        f'"transaction":null,"op":"r","ts_ms":{now_ms},"ts_us":{now_ms * 1000},'
        f'"ts_ns":{now_ms * 1_000_000}}}'
    )
    return head, tail
