"""Change-event values back to PostgreSQL input text (cdc/types/postgres_text.py): for each
type and its edge values, the value as the log encodes it (the snapshot's encoding,
which test_log_values holds equal to Debezium's), converted, cast back by PostgreSQL,
is the value the source holds."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from cdc.types.debezium_sql import column_json
from cdc.types.postgres_text import postgres_text
from tests.conftest import RunningStack
from tests.logcheck import table_info

pytestmark = pytest.mark.integration

# column type -> values (SQL), edge values included
CASES: dict[str, list[str]] = {
    "int2": ["-32768", "7"],
    "int8": ["-9223372036854775808"],
    "numeric(14,4)": ["12345.6789", "'NaN'", "-0.0001"],
    "numeric": ["3.141592653589793238462643383279", "'Infinity'", "'-Infinity'"],
    "real": ["1.5", "0.1", "'NaN'", "'-Infinity'", "3.4e38"],
    "float8": ["2.718281828459045", "'Infinity'", "1e-300"],
    "money": ["12.34", "-0.01"],
    "bool": ["true", "false"],
    "text": [r"E'a \"q\" \\ ''s\nline é'", "''"],
    "char(5)": ["'ab'"],
    "bytea": [r"'\x00ff10'::bytea", "''::bytea"],
    "uuid": ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"],
    "date": ["'2024-02-29'", "'infinity'", "'-infinity'", "'0044-03-15 BC'", "'12345-06-07'"],
    "time": ["'23:59:59.999999'", "'24:00:00'", "'00:00'"],
    "time(3)": ["'01:02:03.456'"],
    "timetz": ["'12:34:56.789+05:30'", "'00:00-01'"],
    "timestamp": ["'2024-02-29 12:34:56.123456'", "'infinity'", "'0044-03-15 12:34:56.5 BC'"],
    "timestamp(3)": ["'2024-02-29 12:34:56.789'", "'12345-01-01 00:00:00'"],
    "timestamptz": ["'2024-02-29 12:34:56.123456+05:30'", "'-infinity'", "'0100-01-01 BC'"],
    "timestamptz(3)": ["'1999-12-31 23:59:59.999+00'"],
    "interval": ["'1 year 2 mons 3 days 04:05:06.78'", "'-1 day 01:00'", "'0'"],
    "json": [""" '{"b": 1,  "a" : [1,2], "b": 0.10000000000000000001}' """, "'\"s\"'"],
    "jsonb": [""" '{"b": 1, "a": {"c": null}}' """, "'[1, \"two\"]'"],
    "xml": ["'<a n=\"1\">x &amp; y</a>'"],
    "inet": ["'192.168.0.1/24'", "'::1'"],
    "cidr": ["'10.1.0.0/16'"],
    "macaddr": ["'08:00:2b:01:02:03'"],
    "bit(12)": ["B'000000000101'"],
    "bit(1)": ["B'1'"],
    "varbit": ["B'1011'"],
    "int4range": ["int4range(1, 10)", "'empty'::int4range"],
    "tstzrange": ["tstzrange('2024-01-01 10:00+00', NULL)"],
    "tsvector": ["to_tsvector('simple', 'the quick fox')"],
    "int4[]": ["'{1,NULL,3}'", "'{}'"],
    "text[]": [r"""ARRAY['a,b', 'q"q', 'NULL', NULL, '', 'back\slash']"""],
    "numeric(12,3)[]": ["ARRAY[0.5, NULL]"],
    "bytea[]": [r"ARRAY['\x00ff'::bytea]"],
    "date[]": ["ARRAY['2024-02-29'::date, 'infinity']"],
    "timestamptz[]": ["ARRAY['2024-02-29 12:00+00'::timestamptz]"],
    "jsonb[]": [""" ARRAY['{"n": 1}'::jsonb, '[1, "two"]'] """],
    "bool[]": ["ARRAY[true, NULL]"],
    "float8[]": ["ARRAY[0.5, 'NaN']"],
}


def _same(type_: str) -> str:
    """SQL comparing a value cast from text (%s) with the column's value (c)."""
    if type_.startswith(("json", "xml")):  # no equality: the text is the value
        return f"(%s::{type_})::text IS NOT DISTINCT FROM c::text"
    if type_ == "timetz":  # the log holds it in UTC (docs/guarantees.md, per type)
        return "%s::timetz IS NOT DISTINCT FROM (c AT TIME ZONE 'UTC')"
    return f"%s::{type_} IS NOT DISTINCT FROM c"


def test_values_of_the_log_read_back_as_the_source_values(stack: RunningStack) -> None:
    dsn = stack.settings.postgres.dsn()
    name = "pgtext_" + uuid.uuid4().hex[:8]
    failures: list[Any] = []
    checked = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS hstore")
        CASES["hstore"] = ["""hstore(ARRAY['a', 'b "b"', 'c'], ARRAY['1', NULL, 'x=>y'])"""]
        try:
            for number, (type_, values) in enumerate(CASES.items()):
                table = f"{name}_{number}"
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, c {type_})")
                rows = ", ".join(f"({i}, {v})" for i, v in enumerate([*values, "NULL"]))
                conn.execute(f"INSERT INTO {table} VALUES {rows}")
                column = table_info(stack.settings, f"public.{table}").column("c")
                encoded = conn.execute(
                    sql.SQL("SELECT id, {} FROM {} ORDER BY id").format(
                        column_json(column), sql.Identifier(table)
                    )
                ).fetchall()
                for id_, text in encoded:
                    raw = orjson.loads(text)
                    converted = postgres_text(column, raw)
                    try:
                        same = conn.execute(
                            f"SELECT {_same(type_)} FROM {table} WHERE id = %s", (converted, id_)
                        ).fetchone()
                    except psycopg.DataError as exc:
                        same = (False,)
                        converted = f"{converted} ({str(exc).splitlines()[0]})"
                    checked += 1
                    if not (same and same[0]):
                        failures.append((type_, raw, converted))
        finally:
            for number in range(len(CASES)):
                conn.execute(f"DROP TABLE IF EXISTS {name}_{number}")
    assert checked > 100
    assert not failures, failures
