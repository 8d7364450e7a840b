"""Values every column can hold: PostgreSQL's infinities, BC dates, years after 9999,
numeric NaN / ±Infinity, 24:00:00. The snapshot writes for each what Debezium streams for
it, byte for byte; `cdc apply --once` takes them into every store, whose contents are
read back here with readers of our own (redis-py, HTTP GETs, a Spark session of the
test's own)."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import redis
import requests

from cdc.core.errors import ValueDecodeError
from cdc.core.settings import Settings
from cdc.core.topics import ChangeRecord, change_topic, read_topic
from cdc.types.decode import decode_row
from tests.conftest import Capture
from tests.helpers import run_cdc
from tests.logcheck import table_info

pytestmark = pytest.mark.integration

COLUMNS = (
    "c_date date, c_ts timestamp, c_ts3 timestamp(3), c_ts0 timestamp(0), c_tstz timestamptz, "
    "c_tstz3 timestamptz(3), c_tstz0 timestamptz(0), c_num numeric(14,4), c_num_free numeric, "
    "c_real real, c_double double precision, c_time time, c_timetz timetz"
)
NAMES = [c.split()[0] for c in COLUMNS.split(", ")]

INF = ["'infinity'"] * 7
NINF = ["'-infinity'"] * 7
NO_TIME = ["NULL"] * 7
ROWS: dict[int, list[str]] = {
    # numeric(14,4) holds NaN (row 9) but no infinity
    1: [*INF, "NULL", "'NaN'", "'NaN'", "'NaN'", "'24:00:00'", "'24:00:00+00'"],
    2: [*NINF, "NULL", "'Infinity'", "'Infinity'", "'Infinity'", "'00:00:00'", "'00:00:00+00'"],
    3: [*NO_TIME, "NULL", "'-Infinity'", "'-Infinity'", "'-Infinity'", "NULL", "NULL"],
    4: [
        "'0044-03-15 BC'",
        "'0044-03-15 12:34:56.123456 BC'",
        "'0044-03-15 12:34:56.123 BC'",
        "'0044-03-15 12:34:56 BC'",
        "'0044-03-15 12:34:56.123456+00 BC'",
        "'0044-03-15 12:34:56.123+00 BC'",
        "'0044-03-15 12:34:56+00 BC'",
        "12345.6789",
        "3.14159265358979323846",
        "1.5",
        "2.5",
        "'12:34:56.789'",
        "'12:34:56.789+05:30'",
    ],
    5: [
        "'12345-06-07'",
        "'12345-06-07 01:02:03.456789'",
        "'12345-06-07 01:02:03.456'",
        "'12345-06-07 01:02:03'",
        "'12345-06-07 01:02:03.456789+00'",
        "'12345-06-07 01:02:03.456+00'",
        "'12345-06-07 01:02:03+00'",
        *["NULL"] * 6,
    ],
    6: [  # PostgreSQL's first date and timestamp, 1 BC, the first and last AD
        "'4714-11-24 BC'",
        "'4714-11-24 00:00:00 BC'",
        "'0001-12-31 23:59:59.5 BC'",
        "'0001-01-01 00:00:00 BC'",
        "'0001-01-01 00:00:00+00'",
        "'0001-12-31 23:59:59.5+00 BC'",
        "'9999-12-31 23:59:59+00'",
        *["NULL"] * 6,
    ],
    # ordinary values (floats with a fraction: an integral one is 0 in PostgreSQL's JSON,
    # 0.0 in Jackson's, the same number)
    7: ["'2024-02-29'", "'2024-02-29 12:34:56.123456'", "'2024-02-29 12:34:56.123'",
        "'2024-02-29 12:34:56'", "'2024-02-29 12:34:56.123456+00'",
        "'2024-02-29 12:34:56.123+00'", "'2024-02-29 12:34:56+00'",
        "0", "0", "0.5", "2.25", "'00:00:00'", "'00:00:00+00'"],
    9: [*NO_TIME, "'NaN'", *["NULL"] * 5],  # the warehouse's decimal(14,4) cannot hold it
}  # fmt: skip
# PostgreSQL's last date and timestamps: Debezium's MicroTimestamp overflows on the
# timestamp (its seconds saturate, then wrap); the snapshot writes that same number
LAST = {
    8: [
        "'5874897-12-31'",
        "'294276-12-31 23:59:59.999999'",
        "'294276-12-31 23:59:59.999'",
        "'294276-12-31 23:59:59'",
        "'294276-12-31 23:59:59.999999+00'",
        "'294276-12-31 23:59:59.999+00'",
        "'294276-12-31 23:59:59+00'",
        *["NULL"] * 6,
    ]
}

# What the cache holds for each row: PostgreSQL's words for infinities and NaN, ISO 8601
# with astronomical, signed years outside 0001..9999 (no field for NULL).
INF_TEXT = dict.fromkeys(NAMES[:7], "infinity")
CACHE: dict[int, dict[str, str]] = {
    1: {**INF_TEXT, "c_num_free": "NaN", "c_real": "NaN", "c_double": "NaN",
        "c_time": "24:00:00", "c_timetz": "00:00:00+00:00"},
    2: {**{k: "-infinity" for k in INF_TEXT}, "c_num_free": "Infinity", "c_real": "Infinity",
        "c_double": "Infinity", "c_time": "00:00:00", "c_timetz": "00:00:00+00:00"},
    3: {"c_num_free": "-Infinity", "c_real": "-Infinity", "c_double": "-Infinity"},
    4: {"c_date": "-0043-03-15", "c_ts": "-0043-03-15T12:34:56.123456",
        "c_ts3": "-0043-03-15T12:34:56.123000", "c_ts0": "-0043-03-15T12:34:56",
        "c_tstz": "-0043-03-15T12:34:56.123456+00:00",
        "c_tstz3": "-0043-03-15T12:34:56.123000+00:00", "c_tstz0": "-0043-03-15T12:34:56+00:00",
        "c_num": "12345.6789", "c_num_free": "3.14159265358979323846", "c_real": "1.5",
        "c_double": "2.5", "c_time": "12:34:56.789000", "c_timetz": "07:04:56.789000+00:00"},
    5: {"c_date": "+12345-06-07", "c_ts": "+12345-06-07T01:02:03.456789",
        "c_ts3": "+12345-06-07T01:02:03.456000", "c_ts0": "+12345-06-07T01:02:03",
        "c_tstz": "+12345-06-07T01:02:03.456789+00:00",
        "c_tstz3": "+12345-06-07T01:02:03.456000+00:00", "c_tstz0": "+12345-06-07T01:02:03+00:00"},
    6: {"c_date": "-4713-11-24", "c_ts": "-4713-11-24T00:00:00",
        "c_ts3": "0000-12-31T23:59:59.500000", "c_ts0": "0000-01-01T00:00:00",
        "c_tstz": "0001-01-01T00:00:00+00:00", "c_tstz3": "0000-12-31T23:59:59.500000+00:00",
        "c_tstz0": "9999-12-31T23:59:59+00:00"},
    7: {"c_date": "2024-02-29", "c_ts": "2024-02-29T12:34:56.123456",
        "c_ts3": "2024-02-29T12:34:56.123000", "c_ts0": "2024-02-29T12:34:56",
        "c_tstz": "2024-02-29T12:34:56.123456+00:00",
        "c_tstz3": "2024-02-29T12:34:56.123000+00:00", "c_tstz0": "2024-02-29T12:34:56+00:00",
        "c_num": "0.0000", "c_num_free": "0", "c_real": "0.5", "c_double": "2.25",
        "c_time": "00:00:00", "c_timetz": "00:00:00+00:00"},
    9: {"c_num": "NaN"},
}  # fmt: skip
FLOATS = {"c_real", "c_double"}

# The warehouse, read with Spark SQL as numbers and text; from PostgreSQL the same, with
# infinities at the ends of Spark's types (a numeric NaN in a decimal(14,4) is a dead letter).
LONG_MAX, LONG_MIN = 2**63 - 1, -(2**63)
WAREHOUSE = {
    "c_date": ("unix_date(c_date)",
               "CASE WHEN isfinite(c_date) THEN c_date - DATE '1970-01-01' "
               "WHEN c_date = 'infinity' THEN 2147483647 "
               "WHEN c_date = '-infinity' THEN -2147483648 END"),
    **{c: (f"unix_micros(CAST({c} AS TIMESTAMP))",
           f"CASE WHEN isfinite({c}) THEN (EXTRACT(EPOCH FROM {c}) * 1000000)::bigint "
           f"WHEN {c} = 'infinity' THEN {LONG_MAX} WHEN {c} = '-infinity' THEN {LONG_MIN} END")
       for c in ("c_ts", "c_ts3", "c_ts0", "c_tstz", "c_tstz3", "c_tstz0")},
    "c_num": ("CAST(c_num AS STRING)", "c_num::text"),
    "c_num_free": ("c_num_free", "c_num_free::text"),
    "c_real": ("CAST(c_real AS DOUBLE)", "c_real::float8"),
    "c_double": ("c_double", "c_double"),
    "c_time": ("c_time",
               "CASE WHEN c_time = '24:00' THEN '24:00:00.000000' "
               "ELSE to_char(DATE '2000-01-01' + c_time, 'HH24:MI:SS.US') END"),
}  # fmt: skip


def table_sql(rows: dict[int, list[str]]) -> list[str]:
    values = ", ".join(f"({i}, {', '.join(v)})" for i, v in rows.items())
    return [
        f"CREATE TABLE {{name}} (id int PRIMARY KEY, {COLUMNS})",
        f"INSERT INTO {{name}} VALUES {values}",
    ]


def stream_copies(dsn: str, name: str) -> None:
    """The same rows again (id + 100), now through Debezium's streaming."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {name} SELECT id + 100, {', '.join(NAMES)} FROM {name}")


def wait_for_events(settings: Settings, name: str, count: int) -> list[ChangeRecord]:
    topic = change_topic(settings.pipeline, f"public.{name}")
    deadline = time.monotonic() + 90
    while True:
        records = read_topic(settings.kafka, topic)
        if len(records) >= count:
            return records
        assert time.monotonic() < deadline, f"{len(records)} of {count} events in {topic}"
        time.sleep(1)


def after_text(record: ChangeRecord) -> tuple[int, str]:
    """The row's id and its `after` image as Debezium's JSON text, without the id."""
    value = (record.value_bytes or b"").decode()
    after = value[value.index('"after":') + len('"after":') : value.index(',"source":')]
    match = re.match(r'\{"id":(\d+),', after)
    assert match, after
    return int(match.group(1)), after[match.end() :]


def test_snapshot_writes_what_debezium_streams(captured: Capture) -> None:
    rows = {**ROWS, **LAST}
    t = captured(*table_sql(rows), prefix="special")  # PostgreSQL's error, before
    table_name, settings, dsn = t.name, t.settings, t.dsn
    stream_copies(dsn, table_name)
    records = wait_for_events(settings, table_name, 2 * len(rows))
    images = {}
    for record in records:
        row, after = after_text(record)
        images[row] = (record.op, after)
    for row in rows:
        snap_op, snapshot = images[row]
        stream_op, streamed = images[row + 100]
        assert (snap_op, stream_op) == ("r", "c")
        assert snapshot == streamed, f"row {row}"

    # every value decodes, but the timestamp Debezium's MicroTimestamp overflowed
    table = table_info(settings, f"public.{table_name}")
    for record in records:
        after = (record.value or {})["after"]
        if after["id"] % 100 not in LAST:
            decode_row(table, after)
            continue
        with pytest.raises(ValueDecodeError) as caught:
            decode_row(table, after)
        assert caught.value.column == "c_ts"
        assert decode_row(table, {**after, "c_ts": None})["c_tstz"] == (
            "+294276-12-31T23:59:59.999999+00:00"
        )


def test_every_store_holds_the_special_values(captured: Capture) -> None:
    t = captured(*table_sql(ROWS), prefix="special")
    table_name, settings, dsn, env = t.name, t.settings, t.dsn, t.env
    pipe = settings.pipeline
    stream_copies(dsn, table_name)  # each row once from the snapshot, once streamed
    wait_for_events(settings, table_name, 2 * len(ROWS))
    ids = [*ROWS, *(i + 100 for i in ROWS)]

    result = run_cdc("apply", "--once", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    dead: dict[str, set[int]] = {}
    errors = []
    for record in read_topic(settings.kafka, f"{pipe.topic_prefix}.dlq"):
        letter = record.value or {}
        dead.setdefault(letter["store"], set()).add(json.loads(letter["key"])["id"])
        errors.append(letter["error"])
    # the cache holds every row; the warehouse every row but those with numeric NaN
    # in its decimal(14,4) column (rows 9 and 109), which are dead letters for it alone
    assert set(dead) <= {"search", "warehouse"}, errors
    assert dead.get("warehouse") == {9, 109}, errors
    assert all("c_num" in e for e in errors if "warehouse cannot hold" in e), errors

    # the cache: one hash per row, PostgreSQL's text
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    for row in ids:
        entry = client.hgetall(f'{pipe.topic_prefix}:public.{table_name}:{{"id":{row}}}')
        held = {k: v for k, v in entry.items() if not k.startswith("_")}
        assert held == {"id": str(row), **CACHE[row % 100]}, f"cache, row {row}"

    # the warehouse: the exact values, infinities at the ends of Spark's types
    assert_warehouse(settings, table_name, [i for i in ids if i % 100 != 9])

    # search: the same text as the cache, floats as numbers
    index = f"{pipe.topic_prefix}.public.{table_name}".lower()
    refused = dead.get("search", set())
    for row in ids:
        doc_id = quote(f'{{"id":{row}}}', safe="")
        reply = requests.get(f"{settings.opensearch.url}/{index}/_doc/{doc_id}", timeout=30)
        assert reply.status_code == 200, f"search, row {row}: {reply.text[:300]}"
        source = {k: v for k, v in reply.json()["_source"].items() if not k.startswith("_")}
        expected = {  # a float NaN or ±Infinity is its word (JSON has no such number)
            name: (float(text) if name in FLOATS and text[-1].isdigit() else text)
            for name, text in CACHE[row % 100].items()
        }
        held = {k: v for k, v in source.items() if v is not None}
        assert held == {"id": row, **expected}, f"search, row {row}"
    # OpenSearch's date and numeric fields are ignore_malformed: a document holding
    # infinity or NaN is kept, the value in _source (not indexed as a date/number)
    assert not refused, errors


def assert_warehouse(settings: Settings, table: str, ids: list[int]) -> None:
    from cdc.core.spark import spark_session
    from cdc.stores.warehouse.tables import warehouse_root

    spark = spark_session(settings, "test")
    path = f"{warehouse_root(settings).rstrip('/')}/public/{table}/current"
    frame = spark.read.format("delta").load(path)  # its rows are the live ones
    got = {
        r["id"]: {c: r[c] for c in WAREHOUSE}
        for r in frame.selectExpr(
            "id", *(f"{e} AS {c}" for c, (e, _) in WAREHOUSE.items())
        ).collect()
    }
    with psycopg.connect(settings.postgres.dsn()) as conn:
        select = ", ".join(f"{sql} AS {c}" for c, (_, sql) in WAREHOUSE.items())
        cursor = conn.execute(f"SELECT id, {select} FROM {table}")
        names = [d.name for d in cursor.description or []][1:]
        expected = {r[0]: dict(zip(names, r[1:], strict=True)) for r in cursor.fetchall()}
    assert sorted(got) == sorted(ids)
    expected = {row: expected[row] for row in ids}

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
            return math.isnan(b)
        return bool(a == b)

    for row in ids:
        differ = {
            c: (got[row][c], expected[row][c])
            for c in WAREHOUSE
            if not same(got[row][c], expected[row][c])
        }
        assert not differ, f"warehouse, row {row}: {differ}"
