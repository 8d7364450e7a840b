"""No user column name breaks a command (issue 66, V1): tables whose columns are named
after every name the pipeline's own SQL, Spark frames, Arrow tables and stores use
(aliases such as `l`, `r`, `s`, `t`, `at`; the decoded events' fields `key`, `op`,
`offset`, `partition`, `value`, `topic`, `table`, `error`; helper columns such as
`__rank`, `__ph_<column>`, `__carried_<column>`, `__at`; verify's own `opened`, `live`,
`c0`...) go through the snapshot, `cdc apply --once` into every store (a TOASTed column
left unchanged, so the batch carries placeholders), `cdc query`, `cdc verify` and
`cdc verify --repair`. Every command exits 0 with no traceback, and every store equals
PostgreSQL, read with this test's own readers (tests/stores.py) and psycopg."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import Capture
from tests.helpers import apply_process, run_cdc
from tests.logcheck import poll, wait_until_captured
from tests.stores import cache_hashes, redis_reader, search_documents, warehouse_frame

# every command, each a process of its own with its Spark session (5 minutes on two
# cores): a long form; in CI, the names the stores add are refused
# (test_pipeline_errors.py) and taken (test_names.py)
pytestmark = [pytest.mark.integration, pytest.mark.long]

# every column: its name and PostgreSQL type; the key is (at, key)
COLUMNS = {
    # the key, named like verify's position alias and the decoded events' key
    "at": "date",
    "key": "text",
    # table aliases of the generated SQL (MERGE, verify, history, views)
    **{alias: "int" for alias in ("l", "r", "h", "c", "v", "m", "k", "e")},
    **{alias: "text" for alias in ("s", "t", "a", "b")},
    # the decoded events' fields (cdc/log/envelope.py, cdc/apply/batch.py)
    "op": "text",
    "offset": "bigint",
    "partition": "int",
    "value": "text",
    "topic": "text",
    "table": "text",
    "error": "text",
    "after": "text",
    "seq": "text",
    "seq0": "int",
    "lsn": "bigint",
    "commit_lsn": "bigint",
    "commit_ms": "bigint",
    "cut_ms": "bigint",
    "name": "text",
    "relid": "bigint",
    "size": "int",
    "bucket": "int",
    "n": "int",
    "store": "text",
    "position": "text",
    # a TOASTed column (left unchanged by the updates: its events carry the placeholder)
    # and the warehouse's helper columns, one of them named after it
    "note": "text",
    "__ph_note": "text",
    "__ph_zzz": "text",
    "__carried_note": "text",
    "__rank": "int",
    "__at": "int",
    "__key": "text",
    "__lsn": "bigint",
    "__commit_lsn": "bigint",
    "__ref": "text",
    "__present": "boolean",
    "__amount": "int",
    "__view": "int",
    # verify's and the history's own names (cdc/check/quality.py, history.py)
    "opened": "int",
    "opens": "text",
    "doubled": "int",
    "backwards": "int",
    "per_key": "text",
    "live": "text",
    "one": "int",
    "c0": "int",
    "c1": "int",
    "ms": "bigint",
    "known": "boolean",
    "newest": "text",
    "versions": "text",
    "cuts": "text",
    "capped": "text",
    "started": "text",
    "cut_ts": "text",
    "prev_lsn": "bigint",
    "window": "text",
    "rows": "int",
    "total": "int",
    "first": "text",
    "last": "text",
    "current": "text",
    "history": "text",
    # names that are no plain identifier
    "Mixed Case": "text",
    "dot.ted": "text",
    "sp ace": "int",
    "ra :tio": "int",  # a parameter to SQLAlchemy's text(), as GE's SQL datasource reads
    "pe%r": "int",  # and one to its driver
    "back`tick": "text",
    'quo"te': "text",
}
KEY = ("at", "key")


def _create(columns: dict[str, str], key: tuple[str, ...], name: str) -> str:
    body = ", ".join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(kind)).as_string(None)
        for c, kind in columns.items()
    )
    keys = ", ".join(sql.Identifier(k).as_string(None) for k in key)
    return f"CREATE TABLE {name} ({body}, PRIMARY KEY ({keys}))"


def _value(column: str, kind: str, g: str) -> str:
    """A SQL expression of row number `g` for the column."""
    if column == "at":
        return f"date '2024-01-01' + ({g} % 7)"
    if column == "note":
        return f"repeat(md5({g}::text), 100)"  # 3,200 characters: TOASTed out of line
    return {
        "int": f"{g} * 3 + length({sql.Literal(column).as_string(None)})",
        "bigint": f"{g}::bigint * 1000003",
        "boolean": f"{g} % 2 = 0",
        "text": f"{sql.Literal(column + ' ').as_string(None)} || {g}",
        "date": f"date '2024-01-01' + {g}",
    }[kind]


def _insert(columns: dict[str, str], name: str, first: int, last: int) -> str:
    names = ", ".join(sql.Identifier(c).as_string(None) for c in columns)
    values = ", ".join(_value(c, kind, "g") for c, kind in columns.items())
    return f"INSERT INTO {name} ({names}) SELECT {values} FROM generate_series({first}, {last}) g"


def _plain(value: Any) -> Any:
    """A value from any store or from PostgreSQL as one text."""
    if isinstance(value, dt.date):
        return value.isoformat()[:10]
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


Rows = set[tuple[tuple[str, str], ...]]


def _rows(rows: list[dict[str, Any]]) -> Rows:
    """Rows as comparable sets: each its non-NULL columns as text."""
    return {tuple(sorted((c, _plain(v)) for c, v in row.items() if v is not None)) for row in rows}


def _source(dsn: str, table: str) -> Rows:
    schema, name = table.split(".", 1)
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, name)))
        return _rows(cur.fetchall())


def _cache(settings: Any, table: str) -> Rows:
    """The cache's rows by its documented layout: a column beginning with `_` is the
    field with one more `_`; the other fields beginning with `_` are the cache's own."""
    return _rows(
        [
            {
                (f[1:] if f.startswith("__") else f): v
                for f, v in entry.items()
                if not f.startswith("_") or f.startswith("__")
            }
            for entry in cache_hashes(settings, table).values()
        ]
    )


def _search(settings: Any, table: str) -> Rows:
    return _rows(
        [
            {c: v for c, v in doc.items() if not c.startswith("_cdc_")}
            for doc in search_documents(settings, table).values()
        ]
    )


def _warehouse(settings: Any, table: str) -> Rows:
    return _rows(
        [
            {c: v for c, v in r.asDict().items() if not c.startswith("_cdc_")}
            for r in warehouse_frame(settings, table).collect()
        ]
    )


def _differ(settings: Any, dsn: str, tables: list[str]) -> dict[str, Any]:
    """Per table and store, the rows only PostgreSQL has and those only the store has."""
    found = {}
    for table in tables:
        source = _source(dsn, table)
        for store, read in (("cache", _cache), ("search", _search), ("warehouse", _warehouse)):
            held = read(settings, table)
            if held != source:
                found[f"{table} {store}"] = (sorted(source - held)[:2], sorted(held - source)[:2])
    return found


def _ran(result: Any, what: str) -> None:
    out = result.stdout + result.stderr
    assert "Traceback" not in out, f"{what}: {out[-4000:]}"
    assert result.returncode == 0, f"{what}: exit {result.returncode}: {out[-4000:]}"


def _verified(env: dict[str, str], what: str) -> None:
    """`cdc verify` found every store equal to PostgreSQL, and every expectation held."""
    result = run_cdc("verify", "-o", "json", env=env)
    assert "Traceback" not in result.stdout + result.stderr, f"{what}: {result.stderr[-4000:]}"
    document = json.loads(result.stdout)
    failed = [r for r in document["results"] if r["missing"] or r["extra"] or r["different"]] + [
        e for e in document["expectations"] if not e["ok"]
    ]
    assert not failed and document["ok"], f"{what}: {json.dumps(failed)[:4000]}"
    assert result.returncode == 0, f"{what}: exit {result.returncode}: {result.stderr[-2000:]}"


def test_columns_named_like_the_pipelines_own_names_pass_every_command(
    captured: Capture,
) -> None:
    events = {"id": "int", "kind": "text", "at": "date", "note": "text"}
    t = captured(
        _create(COLUMNS, KEY, "{name}"),
        # TOASTed out of line whatever its length: an unchanged one is a placeholder
        "ALTER TABLE {name} ALTER note SET STORAGE EXTERNAL",
        _insert(COLUMNS, "{name}", 1, 40),
        # the review's table: a column `at` in the key of a partitioned table
        "CREATE TABLE {name}_events (id int, kind text, at date, note text, "
        "PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
        "CREATE TABLE {name}_events_2024 PARTITION OF {name}_events "
        "FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
        "CREATE TABLE {name}_events_2025 PARTITION OF {name}_events "
        "FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
        _insert(events, "{name}_events", 1, 30),
        prefix="colnames",
        tables=("public.{name}", "public.{name}_events"),
    )
    name, settings, dsn, env = t.name, t.settings, t.dsn, t.env
    tables = [t.table, f"{t.table}_events"]
    ident = sql.Identifier

    def change(round_: int) -> None:
        """Updates that leave `note` unchanged (placeholders), inserts, deletes; a row of
        the partitioned table moved to another partition."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET l = l + 1, {} = {} || '+', {} = -{}, op = 'u' "
                    "WHERE r % 10 IN (1, 4)"
                ).format(
                    ident(name),
                    ident("__ph_note"),
                    ident("__ph_note"),
                    ident("__rank"),
                    ident("__rank"),
                )
            )
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE r % 10 = {}").format(ident(name), 7 - round_)
            )
            conn.execute(_insert(COLUMNS, name, 36 + 5 * round_, 40 + 5 * round_))
            conn.execute(
                f"UPDATE {name}_events SET kind = 'k' || id, at = at + 400 "
                f"WHERE id BETWEEN {3 * round_ + 1} AND {3 * round_ + 3}"
            )
            conn.execute(f"DELETE FROM {name}_events WHERE id = {9 + round_}")

    change(1)
    wait_until_captured(settings)
    _ran(run_cdc("apply", "--once", env=env), "cdc apply --once")
    assert not _differ(settings, dsn, tables)

    # again, now that every store holds the keys: MERGEs, placeholders filled from them
    change(2)
    wait_until_captured(settings)
    _ran(run_cdc("apply", "--once", env=env), "cdc apply --once, again")
    assert not _differ(settings, dsn, tables)

    # cdc query reads the columns by their names
    names = ["at", "key", "l", "__rank", "__ph_note", "offset", "table", "Mixed Case", "dot.ted"]
    quoted = ", ".join("`" + c.replace("`", "``") + "`" for c in names)
    queried = run_cdc(
        "query", f"SELECT {quoted} FROM {name} ORDER BY `at`, `key`", "-o", "json", env=env
    )
    _ran(queried, "cdc query")
    listed = ", ".join(sql.Identifier(c).as_string(None) for c in names)
    with psycopg.connect(dsn) as conn:
        expected = conn.execute(f"SELECT {listed} FROM {name} ORDER BY at, key").fetchall()
    assert [tuple(_plain(v) for v in r.values()) for r in json.loads(queried.stdout)] == [
        tuple(_plain(v) for v in r) for r in expected
    ]
    history = run_cdc("query", f"SELECT count(*) AS n FROM {name}_history", "-o", "json", env=env)
    _ran(history, "cdc query of the history")

    _verified(env, "cdc verify")

    # drift behind the pipeline's back: a row's hash gone from Redis, and a document's
    # field changed in OpenSearch; `cdc verify --repair` (beside a running apply) mends it
    client = redis_reader(settings)
    prefix = f"{settings.pipeline.topic_prefix}:{t.table}:"
    hashes = sorted(client.scan_iter(match=prefix + "*"))
    client.delete(hashes[0])
    client.hset(hashes[1], "l", "-1")
    with apply_process(env, ["cache", "search", "warehouse"]):
        repaired = run_cdc("verify", "--repair", "--timeout", "300", env=env)
        _ran(repaired, "cdc verify --repair")
        poll(lambda: not _differ(settings, dsn, tables), 120, "every store to equal PostgreSQL")
    _verified(env, "cdc verify after the repair")
