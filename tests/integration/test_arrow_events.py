"""The warehouse's batch decoded in Arrow on the driver (stores/warehouse/write/_arrow_events.py)
equals what Spark decodes from the same Kafka records (events.py, typed.py, the store's
`_decode_batch`), column by column and type by type, for every type the Arrow path takes
and their special values; and a batch it cannot decode exactly is left to Spark."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.core.catalog import TRUNCATIONS_TABLE, Column, Table
from cdc.log.envelope import parse_events
from cdc.stores.warehouse.store import WarehouseStore
from cdc.stores.warehouse.write._arrow_events import decode_records, decodes
from cdc.stores.warehouse.write.routes import cut_column, partitions, unheld_as_errors
from cdc.types.arrow_types import decodable
from cdc.types.decode import DATE_INFINITY, MICROS_INFINITY, MILLIS_INFINITY
from tests.conftest import RunningStack

pytestmark = pytest.mark.integration

PLACEHOLDER = "__debezium_unavailable_value"
SEQ = '["1","2"]'  # a change's sequence: commit LSN 1, LSN 2


def column(name: str, kind: str, base: str, category: str = "X", **kw: Any) -> Column:
    array = kind.endswith("[]")
    return Column(name, kind, base, category, array, kw.get("precision"), name == "id")


TABLE = Table(
    "public",
    "zoo",
    (
        column("id", "bigint", "int8"),
        column("code", "text", "text"),
        column("i2", "smallint", "int2"),
        column("i4", "integer", "int4"),
        column("o", "oid", "oid"),
        column("f8", "double precision", "float8"),
        column("b", "boolean", "bool"),
        column("v", "character varying(9)", "varchar"),
        column("c", "character(3)", "bpchar"),
        column("u", "uuid", "uuid"),
        column("j", "jsonb", "jsonb"),
        column("n", "numeric(12,2)", "numeric"),
        column("nu", "numeric", "numeric"),
        column("m", "money", "money"),
        column("d", "date", "date"),
        column("ts", "timestamp without time zone", "timestamp"),
        column("ts3", "timestamp(3) without time zone", "timestamp", precision=3),
        column("tz", "timestamp with time zone", "timestamptz"),
        column("iv", "interval", "interval"),
        column("e", "mood", "mood", "E"),
        column("tags", "text[]", "text"),
        column("nums", "integer[]", "int4"),
        column("flags", "boolean[]", "bool"),
    ),
    ("id", "code"),
    PLACEHOLDER,
    1,
    1,
)
TOPIC = "p.public.zoo"
TOPICS = {TOPIC: TABLE.qualified, "p.cdc.truncations": TRUNCATIONS_TABLE}

ROWS: list[dict[str, Any]] = [
    {
        "id": 1,
        "code": "a",
        "i2": -32768,
        "i4": 2147483647,
        "o": 4294967295,
        "f8": 0.1,
        "b": True,
        "v": "héllo😀",
        "c": "ab ",
        "u": "0e37df36-f698-11e6-8dd4-cb9ced3df976",
        "j": '{"a": [1, 2]}',
        "n": "1234567890.12",
        "nu": "3.14159265358979323846264338327950288419716939937510",
        "m": "12.34",
        "d": 19000,
        "ts": 1_700_000_000_123_456,
        "ts3": 1_700_000_000_123,
        "tz": "2023-11-14T22:13:20.123456Z",
        "iv": "P1Y2M3DT4H5M6.5S",
        "e": "happy",
        "tags": ["a", None, "ü"],
        "nums": [1, -2, None],
        "flags": [True],
    },
    {
        "id": -9223372036854775808,
        "code": "",
        "i2": None,
        "o": 0,
        "f8": -1.5e300,
        "b": False,
        "nu": "NAN",
        "m": "-0.01",
        "d": DATE_INFINITY[0],
        "ts": MICROS_INFINITY[1],
        "ts3": MILLIS_INFINITY[0],
        "tz": "infinity",
        "n": "-0.5",
        "tags": [],
        "nums": [],
    },
    {
        "id": 3,
        "code": "z",
        "f8": float("nan"),
        "d": DATE_INFINITY[1],
        "ts": MICROS_INFINITY[0],
        "ts3": MILLIS_INFINITY[1],
        "tz": "-infinity",
        "nu": "POSITIVE_INFINITY",
        "n": "7",
    },
    {"id": 4, "code": "q", "d": -719162, "ts": -62135596800000000, "tz": "0001-01-01T00:00:00Z"},
]


def envelope(row: dict[str, Any] | None, op: str, sequence: str | None, **source: Any) -> bytes:
    return json.dumps(
        {
            "before": None,
            "after": row,
            "op": op,
            "ts_ms": 5,
            "source": {"ts_ms": source.pop("ts_ms", 1000), "sequence": sequence, **source},
        }
    ).encode()


def record(
    row: dict[str, Any], value: bytes | None, offset: int, partition: int = 0
) -> dict[str, Any]:
    key = json.dumps({"id": row["id"], "code": row["code"]}).encode()
    return {"key": key, "value": value, "topic": TOPIC, "partition": partition, "offset": offset}


def records_of(items: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(items, schema)


def batch() -> pa.Table:
    items = []
    for at, row in enumerate(ROWS):  # the initial snapshot: no sequence, the slot's LSN
        items.append(record(row, envelope(row, "r", None, lsn=500, snapshot="true"), at))
    items.append(  # a backfill row: incremental, a sequence with no commit
        record(ROWS[0], envelope(ROWS[0], "r", '[null,"700"]', snapshot="incremental"), 10)
    )
    changed = {**ROWS[0], "i4": 7, "v": None}
    items.append(record(changed, envelope(changed, "u", '["800","820"]', lsn=820, ts_ms=2000), 11))
    items.append(record(ROWS[1], envelope(None, "d", '["800","830"]', lsn=830, ts_ms=2000), 12))
    items.append(record(ROWS[1], None, 13))  # its tombstone
    items.append(  # delivered again, on another partition
        record(changed, envelope(changed, "u", '["800","820"]', lsn=820, ts_ms=2000), 0, 1)
    )
    created = envelope(ROWS[2], "c", '["900","910"]', lsn=910, ts_ms=3000)
    items.append(record(ROWS[2], created, 1, 1))
    return records_of(items)


def plain(table: pa.Table) -> list[dict[str, Any]]:
    """The rows, comparable with ==: dates and times as their numbers (Python's cannot
    hold PostgreSQL's infinities), NaN as a word."""
    columns = []
    for values in table.columns:
        if pa.types.is_date32(values.type):
            values = values.cast(pa.int32())
        elif pa.types.is_timestamp(values.type):
            values = values.cast(pa.int64())
        columns.append(values)
    rows = pa.Table.from_arrays(columns, names=table.column_names).to_pylist()
    return [
        {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
        for r in rows
    ]


def spark_decoded(
    spark: Any, store: WarehouseStore, records: pa.Table, cuts: dict[str, list[list[int]]]
) -> tuple[pa.Table, list[dict[str, Any]], dict[int, int]]:
    """What the Spark path decodes of the records: the store's table, and `partitions`."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(records)
    parsed = unheld_as_errors(
        parse_events(frame, TOPICS).where("table IS NOT NULL"), {TABLE.qualified: TABLE}
    ).cache()
    cut_ms = cut_column(cuts)
    events = parsed.where(F.col("error").isNull()).withColumn("cut_ms", cut_ms)
    table = store._decode_batch(events, {TABLE.qualified: TABLE})[TABLE.qualified]
    parts, ages = partitions(parsed, {TABLE.qualified: TABLE}, 10_000)
    return table, parts, ages


@pytest.mark.parametrize("tombstone", [True, False])
def test_a_batch_decoded_in_arrow_equals_sparks(
    stack: RunningStack, tmp_path: Path, tombstone: bool
) -> None:
    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-arrow-events")
    store = WarehouseStore(spark, str(tmp_path / "warehouse"))
    records = batch()
    if not tombstone:
        records = records.filter(pa.compute.is_valid(records.column("value")))
    cuts = {TABLE.qualified: [[800, 825, 1999], [900, 900, 2999]]}
    expected, parts, ages = spark_decoded(spark, store, records, cuts)
    assert decodable(TABLE.columns) and decodes(TABLE)
    decoded = decode_records(records, TOPICS, {TABLE.qualified: TABLE}, cuts, 10_000)
    assert decoded is not None
    found = decoded.tables[TABLE.qualified]
    assert found.column_names == expected.column_names
    assert [f.type for f in found.schema] == [f.type for f in expected.schema]
    assert plain(found) == plain(expected)
    # what the batch reports, but for the size (bytes of the records here)
    unsized = sorted(
        ({k: v for k, v in p.items() if k != "size"} for p in parts),
        key=lambda p: p["partition"],
    )
    assert unsized == sorted(
        ({k: v for k, v in p.items() if k != "size"} for p in decoded.parts),
        key=lambda p: p["partition"],
    )
    assert decoded.ages == ages


@pytest.mark.parametrize(
    "why, value",
    [
        ("not a change event", b"not json"),
        ("no position", json.dumps({"op": "u", "after": None, "source": {}}).encode()),
        ("NaN in a numeric(p,s)", envelope({**ROWS[0], "n": "NAN"}, "u", SEQ, lsn=2)),
        ("a timestamp beyond", envelope({**ROWS[0], "ts": -(2**62)}, "u", SEQ, lsn=2)),
        ("a TOAST placeholder", envelope({**ROWS[0], "v": PLACEHOLDER}, "u", SEQ, lsn=2)),
        ("an array's placeholder", envelope({**ROWS[0], "tags": [PLACEHOLDER]}, "u", SEQ, lsn=2)),
        (
            "an array of its codes",
            envelope({**ROWS[0], "nums": list(PLACEHOLDER.encode())}, "u", SEQ, lsn=2),
        ),
        ("an array of arrays", envelope({**ROWS[0], "nums": [[1], [2]]}, "u", SEQ, lsn=2)),
        ("a value of another type", envelope({**ROWS[0], "i4": "7"}, "u", SEQ, lsn=2)),
        (
            "a year after 9999",
            envelope({**ROWS[0], "tz": "+10000-01-01T00:00:00Z"}, "u", SEQ, lsn=2),
        ),
    ],
)
def test_what_arrow_cannot_decode_exactly_is_left_to_spark(why: str, value: bytes) -> None:
    records = records_of([record(ROWS[0], value, 0)])
    assert decode_records(records, TOPICS, {TABLE.qualified: TABLE}, {}, 0) is None, why


def test_a_truncate_or_a_type_arrow_does_not_take_is_left_to_spark() -> None:
    truncate = record(ROWS[0], envelope({"table_name": "public.zoo"}, "c", SEQ, lsn=2), 0)
    records = records_of([{**truncate, "topic": "p.cdc.truncations"}])
    assert decode_records(records, TOPICS, {TABLE.qualified: TABLE}, {}, 0) is None
    with_bytes = Table(
        "public", "zoo", (*TABLE.columns, column("raw", "bytea", "bytea")), TABLE.key, "d", 1, 1
    )
    assert not decodable(with_bytes.columns) and not decodes(with_bytes)
    records = records_of([record(ROWS[0], envelope(ROWS[0], "u", SEQ, lsn=2), 0)])
    assert decode_records(records, TOPICS, {TABLE.qualified: with_bytes}, {}, 0) is None
