"""A Debezium change record decoded: its envelope (op, the row image, the commit time)
and its position in the source (`event_position`: the write rule's order is
cdc/log/position.py), in the three engines that read the change topics, side by side
so that they stay one decoder:

- plain Python (`parse_value`), in the cache's and the search index's workers
  (cdc/apply/row_batches.py);
- Spark SQL (`parse_events`), for the warehouse's Spark path and the streaming views;
- Arrow (`SOURCE_ARROW`, `arrow_positions`), for the warehouse's batch decoded on the
  driver (cdc/stores/warehouse/write/_arrow_events.py).

A tombstone (no value) is a delete with no position. What is not a change event is said
so (`NOT_A_CHANGE_EVENT`), and goes to the dead letters."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdc.log.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "ENVELOPE_DDL",
    "NOT_A_CHANGE_EVENT",
    "SOURCE_ARROW",
    "arrow_positions",
    "event_position",
    "parse_events",
    "parse_value",
]

NOT_A_CHANGE_EVENT = "not a change event"
_OPS = ("c", "u", "d", "r")
_LONG = (-(2**63), 2**63 - 1)


def event_position(op: str, source: Mapping[str, Any]) -> Position | None:
    """A change event's position from its `source` block (None: no position in it).

    Debezium's incremental-snapshot (backfill) rows carry no `lsn`, only their sequence."""
    lsn = source.get("lsn")
    sequence = source.get("sequence")
    commit = change = None
    if sequence:
        try:
            commit, change = orjson.loads(sequence)[:2]
        except (orjson.JSONDecodeError, TypeError, ValueError):
            commit = change = None
    if change is None:
        change = lsn
    if change is None:
        return None
    if commit is None:
        if op == "r":  # an initial snapshot row: at its consistent point, before the stream
            return (int(change), 0)
        return (int(change), int(change))  # a connector started without an offset (not by cdc)
    if op == "r" and source.get("snapshot") == "incremental":
        # a backfill row: read before its window's closing watermark committed (`commit`),
        # so before any change of a later transaction, whose commit_lsn is at least that
        # even when its change's own LSN is lower (it began before the watermark)
        return (int(commit), 0)
    return (int(commit), int(change))


def parse_value(
    value: bytes | str | None,
) -> tuple[str, dict[str, Any] | None, int | None, Any]:
    """A Kafka value as (op, after, commit_ms, position). A tombstone (no value) is a
    delete with no position. Raises ValueError for what is not a Debezium change event."""
    if value is None:
        return "d", None, None, None
    try:
        envelope = orjson.loads(value)
        op = envelope["op"]
        source = envelope.get("source") or {}
        after = envelope.get("after")
        position = event_position(op, source)
        commit_ms = source.get("ts_ms")
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError):
        raise ValueError(NOT_A_CHANGE_EVENT) from None
    if not isinstance(op, str) or not (after is None or isinstance(after, dict)):
        raise ValueError(NOT_A_CHANGE_EVENT)
    if position is None:  # a change event always has a position in the source
        raise ValueError(NOT_A_CHANGE_EVENT)
    if op not in _OPS:
        raise ValueError(f"{NOT_A_CHANGE_EVENT}: op {op[:20]!r} is not one of c, u, d, r")
    if op != "d" and after is None:
        raise ValueError(f"{NOT_A_CHANGE_EVENT}: op {op!r} without an after image")
    if not all(map(_is_long, position)):
        raise ValueError(f"{NOT_A_CHANGE_EVENT}: its source position is not two longs")
    if commit_ms is not None and not _is_long(commit_ms):
        raise ValueError(f"{NOT_A_CHANGE_EVENT}: source.ts_ms is not a time in ms")
    return op, (None if op == "d" else after), commit_ms, position


def _is_long(value: Any) -> bool:
    """Whether `value` is an integer a Kafka record's (and Arrow's) long holds."""
    return isinstance(value, int) and not isinstance(value, bool) and _LONG[0] <= value <= _LONG[1]


# The envelope fields the stores need; `after` stays JSON text, decoded per table.
ENVELOPE_DDL = (
    "op STRING, after STRING, ts_ms BIGINT, "
    "source STRUCT<ts_ms: BIGINT, lsn: BIGINT, sequence: STRING, snapshot: STRING, "
    "`schema`: STRING, `table`: STRING>"
)


def parse_events(records: DataFrame, topic_tables: dict[str, str]) -> DataFrame:
    """Kafka records -> one row per change event.

    Columns: table, topic, partition, offset, key (the key's JSON text), op (c, u, d, r,
    t; "d" for a tombstone), after (JSON text, null for deletes), commit_ms, the position
    (commit_lsn, lsn) as `event_position` reads one (null for a tombstone), and
    `error` for a value that is not a Debezium envelope.
    """
    from pyspark.sql import functions as F

    mapping = F.create_map(
        *[x for t, name in topic_tables.items() for x in (F.lit(t), F.lit(name))]
    )
    value = F.col("value").cast("string")
    envelope = F.from_json(value, ENVELOPE_DDL, {"mode": "PERMISSIVE"})
    return (
        records.select(
            mapping[F.col("topic")].alias("table"),
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            value.alias("value"),
            envelope.alias("e"),
        )
        .withColumn("seq", F.from_json(F.col("e.source.sequence"), "array<string>"))
        .withColumn("seq0", F.col("seq")[0].cast("long"))
        # a backfill (incremental snapshot) row has no source.lsn, only its sequence
        .withColumn("lsn", F.coalesce(F.col("e.source.lsn"), F.col("seq")[1].cast("long")))
        .select(
            "table",
            "topic",
            "partition",
            "offset",
            "key",
            F.when(F.col("value").isNull(), F.lit("d")).otherwise(F.col("e.op")).alias("op"),
            F.col("e.after").alias("after"),
            F.col("e.source.ts_ms").alias("commit_ms"),
            F.when(F.col("seq0").isNotNull(), F.col("seq0"))
            .otherwise(F.col("lsn"))
            .alias("commit_lsn"),
            # an initial snapshot row, and a backfill row: before their commit's stream
            F.when(F.col("seq0").isNull() & (F.col("e.op") == "r") & F.col("lsn").isNotNull(), 0)
            .when((F.col("e.op") == "r") & (F.col("e.source.snapshot") == "incremental"), 0)
            .otherwise(F.col("lsn"))
            .alias("lsn"),
            F.when(
                F.col("value").isNotNull() & (F.col("e.op").isNull() | F.col("lsn").isNull()),
                F.lit("not a change event"),
            ).alias("error"),
            "value",
        )
    )


SOURCE_ARROW = pa.struct(
    [
        ("ts_ms", pa.int64()),
        ("lsn", pa.int64()),
        ("sequence", pa.string()),
        ("snapshot", pa.string()),
    ]
)
_SEQUENCE = re.compile(r'^\[(?:null|"(?P<commit>\d+)"),\s*(?:null|"(?P<lsn>\d+)")\]$')


def _as_long(digits: pa.Array) -> pa.Array:
    """A sequence's number (its digits; "" for null) as a long."""
    return pc.cast(
        pc.if_else(pc.equal(digits, ""), pa.scalar(None, pa.string()), digits), pa.int64()
    )


def arrow_positions(op: pa.Array, source: pa.StructArray) -> tuple[pa.Array, pa.Array] | None:
    """(commit_lsn, lsn) of each event as `event_position` reads one; None when one has
    no position (not a change event) or a sequence not as Debezium writes it."""
    _, lsn, sequence, snapshot = source.flatten()
    found = pc.extract_regex(pc.fill_null(sequence, "[null,null]"), _SEQUENCE.pattern)
    if pc.any(pc.is_null(found)).as_py():
        return None
    seq0, seq1 = (_as_long(f) for f in found.flatten())
    lsn = pc.coalesce(lsn, seq1)
    if pc.any(pc.or_(pc.is_null(op), pc.is_null(lsn))).as_py():
        return None
    commit_lsn = pc.if_else(pc.is_valid(seq0), seq0, lsn)
    read = pc.equal(op, "r")
    # an initial snapshot row, and a backfill row: before their commit's stream
    initial = pc.and_(pc.is_null(seq0), read)
    incremental = pc.and_(read, pc.equal(pc.fill_null(snapshot, ""), "incremental"))
    return commit_lsn, pc.if_else(pc.or_(initial, incremental), pa.scalar(0, pa.int64()), lsn)
