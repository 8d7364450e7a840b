"""A schema of every kind, end to end: every PostgreSQL 15 type Debezium streams (arrays of
each, domains, enums, ranges, hstore and ltree), TOASTed values of each TOASTable type,
awkward identifiers (mixed case, spaces, a quote, non-ASCII, a column named like the
cache's metadata), generated columns (one over a TOASTed column), a range- and a
list-partitioned table with default partitions and rows moved across partitions, and
a table keyed by each key-able type. Snapshot, then inserts, updates touching and not
touching the TOASTed columns, deletes and primary-key swaps; then every store and the
warehouse history are compared with PostgreSQL.

The stores are read with the tests' own readers (redis-py, OpenSearch over HTTP, Delta
with a Spark session), never with `cdc verify`. Each value a store holds is turned back
into PostgreSQL input text by rules of this test (base64 to hex for bytea, a JSON array
to an array literal, ...) and PostgreSQL itself parses it as the column's type and
prints it: the result must be the source's own text for that column, byte for byte
(`json`, whose text is data, is compared as text)."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import time
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.stores.warehouse.tables import warehouse_root
from tests.conftest import RunningStack
from tests.logcheck import pipeline_for, wait_until_captured
from tests.stores import (
    cache_hashes,
    column_mapped,
    delta_tables,
    readers_differ,
    search_documents,
    with_ends,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]

STORES = ["cache", "search", "warehouse"]
EXTENSIONS = {"hstore", "ltree", "citext"}  # types tested where PostgreSQL has them
TYPES_TABLE = "Zoo Types"
# column -> type; every value below is also given as an array where the type has one
SCALARS = {
    "c_int2": "int2",
    "c_int4": "int4",
    "c_int8": "int8",
    "c_num": "numeric(12,3)",
    "c_numfree": "numeric",
    "c_numneg": "numeric(5,-2)",  # PostgreSQL 15: a negative scale, a scale above the
    "c_numtiny": "numeric(3,5)",  # precision (no Spark decimal holds them)
    "c_real": "real",
    "c_double": "double precision",
    "c_money": "money",
    "c_bool": "boolean",
    "c_text": "text",
    "c_varchar": "varchar(20)",
    "c_char": "char(5)",
    "c_bytea": "bytea",
    "c_uuid": "uuid",
    "c_date": "date",
    "c_time": "time",
    "c_time3": "time(3)",
    "c_timetz": "timetz",
    "c_ts": "timestamp",
    "c_ts3": "timestamp(3)",
    "c_tstz": "timestamptz",
    "c_tstz3": "timestamptz(3)",
    "c_interval": "interval",
    "c_json": "json",
    "c_jsonb": "jsonb",
    "c_xml": "xml",
    "c_inet": "inet",
    "c_cidr": "cidr",
    "c_macaddr": "macaddr",
    "c_bit": "bit(4)",
    "c_varbit": "varbit",
    "c_int4range": "int4range",
    "c_int8range": "int8range",
    "c_numrange": "numrange",
    "c_daterange": "daterange",
    "c_tsrange": "tsrange",
    "c_tstzrange": "tstzrange",
    "c_enum": "{schema}.mood",
    "c_posint": "{schema}.posint",
    "c_label": "{schema}.label",
    "c_etiquette": '{schema}."étiquette"',  # a domain with a non-ASCII name
    "c_hstore": "hstore",
    "c_ltree": "ltree",
    "c_tsvector": "tsvector",
    "c_citext": "citext",
}
# array columns: the element types Debezium streams as arrays
ARRAYS = {
    f"a_{c[2:]}": f"{t}[]"
    for c, t in SCALARS.items()
    if c
    in {
        "c_int2",
        "c_int4",
        "c_int8",
        "c_num",
        "c_real",
        "c_double",
        "c_bool",
        "c_text",
        "c_varchar",
        "c_bytea",
        "c_uuid",
        "c_date",
        "c_tstz",
        "c_jsonb",
        "c_enum",
    }
}
# values of row n (SQL expressions of n)
VALUES = {
    "c_int2": "(n * 7)::int2",
    "c_int4": "n * -100000",
    "c_int8": "n * 10000000000",
    "c_num": "n + 0.125",
    "c_numfree": "n / 7.0",
    "c_numneg": "n * 1234",
    "c_numtiny": "n / 1000.0",
    "c_real": "n + 0.25",
    "c_double": "n / 3.0",
    "c_money": "(n * 12.34)::numeric::money",
    "c_bool": "n % 2 = 0",
    "c_text": "'text ' || n || E' \\u00e9 \"q\" \\\\ ''s'",
    "c_varchar": "'vc' || n",
    "c_char": "'c' || n",
    "c_bytea": "decode(md5(n::text), 'hex')",
    "c_uuid": "md5(n::text)::uuid",
    "c_date": "date '2024-02-28' + n",
    "c_time": "time '12:34:56.123456' + n * interval '1 minute'",
    "c_time3": "time '01:02:03.456'",
    "c_timetz": "timetz '12:34:56.789+05:30'",
    "c_ts": "timestamp '2024-02-29 12:34:56.123456' + n * interval '1 day'",
    "c_ts3": "timestamp '2024-02-29 12:34:56.123'",
    "c_tstz": "timestamptz '2024-02-29 12:34:56.123456+02' + n * interval '1 hour'",
    "c_tstz3": "timestamptz '1999-12-31 23:59:59.999+00'",
    "c_interval": "n * interval '1 year 2 mons 3 days 04:05:06.789'",
    "c_json": """('{"b":' || n || ',  "a" : [1,2], "b": 0.10000000000000000001}')::json""",
    "c_jsonb": """jsonb_build_object('k', n, 'nested', jsonb_build_object('x', 'y'))""",
    "c_xml": "xmlparse(content '<a n=\"' || n || '\">x</a>')",
    "c_inet": "('192.168.0.' || n || '/24')::inet",
    "c_cidr": "('10.' || n || '.0.0/16')::cidr",
    "c_macaddr": "('08:00:2b:01:02:0' || n)::macaddr",
    "c_bit": "B'1010'",
    "c_varbit": "(B'1000000000' || n::bit(3))::varbit",
    "c_int4range": "int4range(n, n + 10)",
    "c_int8range": "int8range(n, NULL)",
    "c_numrange": "numrange(n + 0.5, n + 1.5, '[]')",
    "c_daterange": "daterange(date '2024-01-01', date '2024-01-01' + n)",
    "c_tsrange": "tsrange(timestamp '2024-01-01 10:00', timestamp '2024-01-01 12:00')",
    "c_tstzrange": "tstzrange(timestamptz '2024-01-01 10:00+00', NULL)",
    "c_enum": "(ARRAY['sad', 'ok', 'happy'])[n % 3 + 1]::{schema}.mood",
    "c_posint": "n",
    "c_label": "'label ' || n",
    "c_etiquette": "'é' || n",
    "c_hstore": "hstore(ARRAY['a', 'b b'], ARRAY[n::text, NULL])",
    "c_ltree": "('top.mid' || n)::ltree",
    "c_tsvector": "to_tsvector('simple', 'the quick fox ' || n)",
    "c_citext": "'MiXeD ' || n",
}
ARRAY_VALUES = {
    "a_int2": "ARRAY[1, NULL, n]::int2[]",
    "a_int4": "ARRAY[n, -n]",
    "a_int8": "ARRAY[n * 10000000000]",
    "a_num": "ARRAY[n + 0.5, NULL]::numeric(12,3)[]",
    "a_real": "ARRAY[0.5, n]::real[]",
    "a_double": "ARRAY[n / 3.0]::float8[]",
    "a_bool": "ARRAY[true, false, NULL]",
    "a_text": """ARRAY['a,b', 'q"q', 'NULL', NULL, '', 'x' || n]""",
    "a_varchar": "ARRAY['v' || n]::varchar(20)[]",
    "a_bytea": "ARRAY[decode('00ff' || lpad(n::text, 2, '0'), 'hex')]",
    "a_uuid": "ARRAY[md5(n::text)::uuid]",
    "a_date": "ARRAY[date '2024-02-29' + n]",
    "a_tstz": "ARRAY[timestamptz '2024-02-29 12:00+00' + n * interval '1 second']",
    "a_jsonb": """ARRAY[jsonb_build_object('n', n), '[1, "two"]'::jsonb]""",
    "a_enum": "ARRAY['ok', 'happy']::{schema}.mood[]",
}
# TOASTed columns: values far past the 2 kB threshold, stored out of line
TOASTED = {
    "t_text": ("text", "repeat(md5(n::text), 200)"),
    "t_bytea": ("bytea", "decode(repeat(md5(n::text), 200), 'hex')"),
    "t_json": ("json", '(\'{"z": "\' || repeat(md5(n::text), 200) || \'", "a": 1}\')::json'),
    "t_jsonb": ("jsonb", "jsonb_build_object('k', repeat(md5(n::text), 200))"),
    "t_texts": ("text[]", "ARRAY(SELECT md5((n * 1000 + i)::text) FROM generate_series(1, 150) i)"),
    "t_ints": ("int4[]", "ARRAY(SELECT n * 10000 + i FROM generate_series(1, 1000) i)"),
    "t_label": ("{schema}.label", "repeat('L' || n, 1500)"),
    "t_xml": ("xml", "xmlparse(content '<t>' || repeat(md5(n::text), 200) || '</t>')"),
}
# awkward column names: mixed case, the cache's metadata, non-ASCII, characters Parquet
# refuses, a dot, a backtick and a quote
AWKWARD = {
    "MixedCase": "int4",
    "_lsn": "text",
    "ünï": "text",
    "first name, (x) = {y};": "text",
    "a.b": "int4",
    'tick`s "q"': "text",
}
# a key of each key-able type: (type, key of row n)
KEYS = {
    "int2": "n::int2",
    "int8": "n * 10000000000",
    "numeric(10,2)": "n + 0.5",
    "text": "'key ' || n || ' é \"q\"'",
    "uuid": "md5(n::text)::uuid",
    "date": "date '2024-02-28' + n",
    "time": "time '12:00:00.5' + n * interval '1 second'",
    "timestamp": "timestamp '2024-02-29 12:34:56.123456' + n * interval '1 day'",
    "timestamptz(3)": "timestamptz '2024-02-29 12:34:56.789+02' + n * interval '1 day'",
    "bytea": "decode(md5(n::text), 'hex')",
    "double precision": "n + 0.1",
    "real": "n + 0.25",
    "boolean": "n % 2 = 0",
    "{schema}.mood": "(enum_range(NULL::{schema}.mood))[n % 5 + 1]",
    "inet": "('10.0.0.' || n)::inet",
}


def key_table(number: int) -> str:
    return "key's ünï 0" if number == 0 else f"k{number}"  # a quote, a space, non-ASCII


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def create_schema(conn: psycopg.Connection[Any], schema: str, extensions: set[str]) -> list[str]:
    """The zoo, rows 1..4 in each table; returns its tables' names."""
    s = ident(schema)
    conn.execute(f"CREATE SCHEMA {s}")
    conn.execute(f"CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy', 'meh', 'glad')")
    conn.execute(f"CREATE DOMAIN {s}.posint AS int4 CHECK (VALUE > 0)")
    conn.execute(f"CREATE DOMAIN {s}.label AS text")
    conn.execute(f'CREATE DOMAIN {s}."étiquette" AS varchar(20)')
    scalars = {c: t for c, t in SCALARS.items() if t not in EXTENSIONS - extensions}
    columns = {**scalars, **ARRAYS, **{c: t for c, (t, _) in TOASTED.items()}, **AWKWARD}
    decl = ", ".join(f"{ident(c)} {t.replace('{schema}', s)}" for c, t in columns.items())
    table = f"{s}.{ident(TYPES_TABLE)}"
    conn.execute(
        f"CREATE TABLE {table} (id int PRIMARY KEY, {decl}, "
        "doubled int GENERATED ALWAYS AS (c_int4 * 2) STORED, "
        # over a TOASTed column: an update leaving it alone cannot give the value
        "t_text_len int GENERATED ALWAYS AS (length(t_text) + c_int2) STORED, "
        "ts_day date GENERATED ALWAYS AS ((c_tstz AT TIME ZONE 'UTC')::date) STORED)"
    )
    for column in TOASTED:
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")
    values = {**VALUES, **ARRAY_VALUES, **{c: v for c, (_, v) in TOASTED.items()}}
    values |= {"MixedCase": "n", "_lsn": "'not metadata ' || n", "ünï": "'ü' || n"}
    values |= {"first name, (x) = {y};": "'Ada ' || n", "a.b": "n * 2", 'tick`s "q"': "'t'"}
    names = [c for c in columns]
    row_sql = ", ".join(values[c].replace("{schema}", s) for c in names)
    conn.execute(
        f"INSERT INTO {table} (id, {', '.join(map(ident, names))}) "
        f"SELECT n, {row_sql} FROM generate_series(1, 3) n"
    )
    conn.execute(f"INSERT INTO {table} (id) VALUES (4)")  # every column NULL
    # partitioned: by range with a default partition, and by list with one
    conn.execute(
        f"CREATE TABLE {s}.events (id int, day date, note text, PRIMARY KEY (id, day)) "
        "PARTITION BY RANGE (day)"
    )
    conn.execute(
        f"CREATE TABLE {s}.events_2024 PARTITION OF {s}.events "
        "FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')"
    )
    conn.execute(
        f"CREATE TABLE {s}.events_2025 PARTITION OF {s}.events "
        "FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')"
    )
    conn.execute(f"CREATE TABLE {s}.events_other PARTITION OF {s}.events DEFAULT")
    conn.execute(
        f"INSERT INTO {s}.events SELECT n, date '2023-12-30' + n * 100, 'e' || n "
        "FROM generate_series(1, 4) n"
    )
    conn.execute(
        f'CREATE TABLE {s}."Regions" (region text, id int, v int, PRIMARY KEY (region, id)) '
        "PARTITION BY LIST (region)"
    )
    conn.execute(f"CREATE TABLE {s}.regions_eu PARTITION OF {s}.\"Regions\" FOR VALUES IN ('eu')")
    conn.execute(f"CREATE TABLE {s}.regions_us PARTITION OF {s}.\"Regions\" FOR VALUES IN ('us')")
    conn.execute(f'CREATE TABLE {s}.regions_rest PARTITION OF {s}."Regions" DEFAULT')
    conn.execute(
        f"INSERT INTO {s}.\"Regions\" SELECT (ARRAY['eu', 'us', 'apac', 'eu'])[n], n, n "
        "FROM generate_series(1, 4) n"
    )
    # a table keyed by each key-able type, with v = n to tell its rows apart
    for number, (kind, key) in enumerate(KEYS.items()):
        name = key_table(number)
        conn.execute(
            f"CREATE TABLE {s}.{ident(name)} (k {kind.replace('{schema}', s)} PRIMARY KEY, v int)"
        )
        # rows 1..3 (boolean has two keys only)
        last = 2 if kind == "boolean" else 3
        conn.execute(
            f"INSERT INTO {s}.{ident(name)} SELECT {key.replace('{schema}', s)}, n "
            f"FROM generate_series(1, {last}) n"
        )
    return [
        TYPES_TABLE,
        "events",
        "Regions",
        *[key_table(i) for i in range(len(KEYS))],
    ]


def change(conn: psycopg.Connection[Any], schema: str) -> None:
    """Inserts, updates touching and not touching TOASTed columns, deletes, key swaps."""
    s = ident(schema)
    table = f"{s}.{ident(TYPES_TABLE)}"
    columns = [
        c
        for c in [*SCALARS, *ARRAYS, *TOASTED]
        if conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
            (table, c),
        ).fetchone()
    ]
    values = {**VALUES, **ARRAY_VALUES, **{c: v for c, (_, v) in TOASTED.items()}}
    row_sql = ", ".join(values[c].replace("{schema}", s) for c in columns)
    conn.execute(
        f"INSERT INTO {table} (id, {', '.join(map(ident, columns))}) "
        f"SELECT n, {row_sql} FROM generate_series(5, 7) n"
    )
    # not touching the TOASTed columns: Debezium sends placeholders for them
    conn.execute(f"UPDATE {table} SET c_int4 = c_int4 + 1, c_text = 'updated' WHERE id IN (1, 5)")
    # touching them
    conn.execute(
        f"UPDATE {table} SET t_text = 'short now', t_jsonb = '{{\"short\": 1}}', "
        "t_ints = ARRAY[1, 2] WHERE id = 2"
    )
    conn.execute(f"DELETE FROM {table} WHERE id = 3")
    # a key swap of rows without TOASTed values (the new key's values are all in the WAL)
    conn.execute(f"UPDATE {table} SET t_text = NULL, t_bytea = NULL, t_json = NULL, "
                 "t_jsonb = NULL, t_texts = NULL, t_ints = NULL, t_label = NULL, t_xml = NULL "
                 "WHERE id IN (6, 7)")  # fmt: skip
    with conn.transaction():
        conn.execute(f"UPDATE {table} SET id = 100 WHERE id = 6")
        conn.execute(f"UPDATE {table} SET id = 6 WHERE id = 7")
        conn.execute(f"UPDATE {table} SET id = 7 WHERE id = 100")
    conn.execute(f"UPDATE {table} SET id = 3 WHERE id = 4")  # a key freed by a delete
    # rows moved across partitions, a new one in a default partition, a delete
    conn.execute(f"UPDATE {s}.events SET day = date '2025-06-01' WHERE id = 1")
    conn.execute(f"UPDATE {s}.events SET day = date '2031-01-01', note = 'moved' WHERE id = 2")
    conn.execute(f"INSERT INTO {s}.events VALUES (9, date '1999-01-01', 'old')")
    conn.execute(f"DELETE FROM {s}.events WHERE id = 3")
    conn.execute(f"UPDATE {s}.\"Regions\" SET region = 'us' WHERE id = 1")
    conn.execute(f"UPDATE {s}.\"Regions\" SET region = 'mars', v = 30 WHERE id = 3")
    conn.execute(f"INSERT INTO {s}.\"Regions\" VALUES ('eu', 9, 9)")
    # key tables: an update, a delete, an insert, a key change
    for number, (kind, key) in enumerate(KEYS.items()):
        name = f"{s}.{ident(key_table(number))}"
        conn.execute(f"UPDATE {name} SET v = v + 100 WHERE v = 1")
        if kind == "boolean":
            conn.execute(f"DELETE FROM {name} WHERE v = 2")
            conn.execute(f"UPDATE {name} SET k = NOT k WHERE v = 101")  # the key freed
            continue
        conn.execute(f"DELETE FROM {name} WHERE v = 2")
        conn.execute(
            f"INSERT INTO {name} SELECT {key.replace('{schema}', s)}, n FROM (SELECT 5 n) x"
        )
        conn.execute(
            f"UPDATE {name} SET k = (SELECT {key.replace('{schema}', s)} FROM (SELECT 14 n) x) "
            "WHERE v = 3"
        )


# ---- the comparison ------------------------------------------------------------------------


def pg_columns(conn: psycopg.Connection[Any], qualified: str) -> list[tuple[str, str, str, str]]:
    """(name, format_type, base type name, element type name or '') per captured column."""
    return conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), bt.typname, "
        "coalesce(et.typname, '') FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END "
        "LEFT JOIN pg_type et ON et.oid = bt.typelem AND bt.typcategory = 'A' "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (qualified,),
    ).fetchall()


def _quoted(element: str | None) -> str:
    if element is None:
        return "NULL"
    return '"' + element.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(store: str, base: str, element: str, value: Any) -> str | None:
    """A store's value as PostgreSQL input text for its column (base: the type's name
    after domains; element: an array's element type, else '')."""
    if value is None:
        return None
    if element:
        items = json.loads(value) if isinstance(value, str) else value
        return "{" + ",".join(_quoted(literal(store, element, "", e)) for e in items) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, dt.datetime):
        if base == "timestamptz":  # Spark hands a timestamp over in local time
            return value.astimezone(dt.UTC).isoformat()
        return value.isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if store == "search" and base in ("json", "jsonb") and isinstance(value, dict):
        value = value.get("_value", value)  # a flat_object holds a non-object so (docs/stores.md)
    if isinstance(value, (dict, list)):  # OpenSearch's flat_object, an hstore's map
        value = json.dumps(value)
    if base == "bytea" and store != "warehouse":  # base64 in the cache and the index
        return "\\x" + base64.b64decode(value).hex()
    if base == "hstore":
        pairs = json.loads(value).items()
        return ", ".join(f"{_quoted(k)}=>{_quoted(v)}" for k, v in pairs)
    if base == "interval" and value.startswith("{"):
        parts = json.loads(value)
        return f"{parts['months']} mons {parts['days']} days {parts['microseconds']} microseconds"
    return str(value)


def as_postgres_prints(conn: psycopg.Connection[Any], type_: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        row = conn.execute(
            sql.SQL("SELECT %s::{}::text").format(sql.SQL(type_)), (text,)
        ).fetchone()
    except psycopg.Error as exc:
        return f"<not a {type_}: {str(exc).splitlines()[0]}>"
    return row[0] if row else None


def source_texts(
    conn: psycopg.Connection[Any], qualified: str, match: str
) -> dict[int, dict[str, str | None]]:
    columns = pg_columns(conn, qualified)
    # a timetz reaches every store in UTC, as Debezium sends it (docs/guarantees.md, per type)
    select = ", ".join(
        f"({ident(c)} AT TIME ZONE 'UTC')::text" if base == "timetz" else f"{ident(c)}::text"
        for c, _, base, _ in columns
    )
    rows = conn.execute(f"SELECT {ident(match)}, {select} FROM {qualified}").fetchall()
    return {r[0]: dict(zip([c for c, *_ in columns], r[1:], strict=True)) for r in rows}


def store_texts(
    conn: psycopg.Connection[Any],
    store: str,
    qualified: str,
    rows: list[dict[str, Any]],
    match: str,
) -> dict[int, dict[str, str | None]]:
    """A store's rows as PostgreSQL prints them."""
    found = {}
    for row in rows:
        texts = {}
        for name, type_, base, element in pg_columns(conn, qualified):
            value = row.get(name)
            if base == "json" and store == "search" and value is not None:
                # the index keeps JSON as an object: its text (key order, spaces) is gone
                if isinstance(value, dict):
                    value = value.get("_value", value)
                texts[name] = as_postgres_prints(conn, "jsonb", json.dumps(value))
            elif base == "json" and value is not None:
                texts[name] = value  # the text is data
            else:
                texts[name] = as_postgres_prints(conn, type_, literal(store, base, element, value))
        key = row.get(match)
        found[int(key) if key is not None else -1] = texts
    return found


def source_for(conn: psycopg.Connection[Any], qualified: str, match: str, store: str) -> Any:
    """The source's rows as the store is compared: json as jsonb for the index."""
    rows = source_texts(conn, qualified, match)
    if store == "search":
        json_columns = [c for c, _, base, _ in pg_columns(conn, qualified) if base == "json"]
        for row in rows.values():
            for column in json_columns:  # parsed: numbers as doubles (docs/stores.md)
                text = row[column]
                parsed = None if text is None else json.dumps(json.loads(text))
                row[column] = as_postgres_prints(conn, "jsonb", parsed)
    return rows


def cache_rows(settings: Any, table: str) -> list[dict[str, Any]]:
    """The cache's live rows; a column `_x` is the field `__x` (docs/stores.md)."""
    return [
        {f[1:]: v for f, v in entry.items() if f.startswith("__")}
        | {f: v for f, v in entry.items() if not f.startswith("_")}
        for entry in cache_hashes(settings, table).values()
    ]


def search_rows(settings: Any, table: str) -> list[dict[str, Any]]:
    return [
        {c: v for c, v in source.items() if not c.startswith("_cdc_")}
        for source in search_documents(settings, table).values()
    ]


def delta(settings: Any, table: str, part: str) -> Any:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None  # the apply job's session, still open in this process
    schema, name = table.split(".", 1)
    return spark.read.format("delta").load(f"{warehouse_root(settings)}/{schema}/{name}/{part}")


def warehouse_rows(settings: Any, table: str) -> list[dict[str, Any]]:
    return [
        {c: v for c, v in r.asDict().items() if not c.startswith("_cdc_")}
        for r in delta(settings, table, "current").collect()  # its rows are the live ones
    ]


def history_problems(settings: Any, table: str, key: list[str], live: int) -> list[str]:
    """Per key: one open version at most, the newest one (the ends as the test derives
    them: tests/stores.py, with_ends); live keys are those whose newest version is not a
    delete, and each equals the current row (one per key)."""
    rows = warehouse_rows(settings, table)
    current = {tuple(_hashable(r[k]) for k in key): r for r in rows}
    problems = []
    if len(rows) != len(current):
        problems.append(f"{table}: {len(rows)} current rows of {len(current)} keys")
    written = [
        {c: _hashable(v) if c in key else v for c, v in r.asDict().items()}
        for r in delta(settings, table, "history").collect()
    ]
    versions: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in with_ends(written, key):  # sorted by key, then position
        versions.setdefault(tuple(row[k] for k in key), []).append(row)
    live_keys = 0
    for k, chain in versions.items():
        newest = chain[-1]
        open_ = [v for v in chain if v["valid_to"] is None]
        if newest["_cdc_op"] == "d":
            if k in current:
                problems.append(f"{table} {k}: deleted in the history, live in current")
            continue
        live_keys += 1
        if open_ != [newest]:
            problems.append(f"{table} {k}: {len(open_)} open versions, not the newest alone")
        values = {c: v for c, v in newest.items() if not c.startswith("_cdc_")}
        values = {c: v for c, v in values.items() if c not in ("valid_from", "valid_to")}
        if k not in current or values != current[k]:
            problems.append(f"{table} {k}: the open version differs from the current row")
    if live_keys != live:
        problems.append(f"{table}: {live_keys} live keys in the history, {live} in PostgreSQL")
    return problems


def _hashable(value: Any) -> Any:
    return bytes(value) if isinstance(value, bytearray) else value


def test_the_schema_zoo_reaches_every_store_exactly(stack: RunningStack) -> None:
    schema = "zoo_" + uuid.uuid4().hex[:8]
    settings = pipeline_for(stack.settings, [f"{schema}.*"])
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        available = {r[0] for r in conn.execute("SELECT name FROM pg_available_extensions")}
        extensions = EXTENSIONS & available
        for extension in extensions:
            conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
        tables = create_schema(conn, schema, extensions)
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        with psycopg.connect(dsn, autocommit=True) as conn:
            change(conn, schema)
            conn.execute("SET TimeZone = 'UTC'")
        wait_until_captured(settings)
        time.sleep(2)
        run_apply(settings, STORES, once=True)

        differences: list[str] = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            for name in tables:
                qualified = f"{schema}.{name}"
                match = "v" if name.startswith(("k", "key")) else "id"
                readers = {
                    "cache": cache_rows(settings, qualified),
                    "search": search_rows(settings, qualified),
                    "warehouse": warehouse_rows(settings, qualified),
                }
                for store, rows in readers.items():
                    source = source_for(conn, f"{ident(schema)}.{ident(name)}", match, store)
                    held = store_texts(conn, store, f"{ident(schema)}.{ident(name)}", rows, match)
                    if sorted(held) != sorted(source):
                        differences.append(
                            f"{store} {name}: rows {sorted(held)} ≠ {sorted(source)}"
                        )
                        continue
                    for k, columns in source.items():
                        for column, text in columns.items():
                            if held[k][column] != text:
                                differences.append(
                                    f"{store} {name} {match}={k} {column}: "
                                    f"{str(held[k][column])[:90]!r} ≠ {str(text)[:90]!r}"
                                )
                key = [
                    r[0]
                    for r in conn.execute(
                        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                        "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY a.attnum",
                        (f"{ident(schema)}.{ident(name)}",),
                    ).fetchall()
                ]
                live = len(source_texts(conn, f"{ident(schema)}.{ident(name)}", match))
                differences += history_problems(settings, qualified, key, live)
        # delta-rs reads each table Parquet's names can hold as Spark does (docs/stores.md,
        # "Reading the warehouse"); only a table with a column it cannot is mapped
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        for path in delta_tables(warehouse_root(settings)):
            if column_mapped(path):
                continue
            differences += readers_differ(spark, path)
        assert not differences, "\n".join(differences[:60])
    finally:
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
