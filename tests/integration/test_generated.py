"""Generated columns reach every store: PostgreSQL 15 publishes no value for them, so the
apply job computes them from each event's values (cdc/log/generated_columns.py).

The stores are read with the test's own readers and compared with PostgreSQL's stored
values after a snapshot, inserts, updates of the inputs, an update that leaves a
TOASTed input unchanged (its placeholder), a delete and a backfill (which failed in
Debezium before: its `SELECT *` returned the generated columns its schema lacks). The
warehouse's history holds each version's own generated value: computed from the event,
never read later."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.check.verify import verify
from cdc.stores.warehouse.tables import history_path, warehouse_root
from tests import stores
from tests.conftest import Capture
from tests.logcheck import table_info, wait_until_captured

pytestmark = [pytest.mark.integration, pytest.mark.pg_matrix]

GENERATED = {
    "doubled": "int GENERATED ALWAYS AS (a * 2) STORED",
    "shout": "text GENERATED ALWAYS AS (upper(label) || '!') STORED",
    "day": "date GENERATED ALWAYS AS ((at AT TIME ZONE 'UTC')::date) STORED",
    "big_len": "int GENERATED ALWAYS AS (length(big) + a) STORED",
    "first_tag": "text GENERATED ALWAYS AS (tags[1]) STORED",
    "price": "numeric(10,2) GENERATED ALWAYS AS (amount * 1.5) STORED",
    "kind": "text GENERATED ALWAYS AS (doc ->> 'kind') STORED",
    "constant": "int GENERATED ALWAYS AS (7) STORED",
}
STORES = ["cache", "search", "warehouse"]


def _texts(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, str | None]]:
    def text(value: Any) -> str | None:
        if value is None:
            return None
        if hasattr(value, "isoformat"):
            return value.isoformat()
        return str(value)

    return {int(k): {c: text(row.get(c)) for c in GENERATED} for k, row in rows.items()}


def _source(conn: psycopg.Connection[Any], name: str) -> dict[Any, dict[str, str | None]]:
    select = ", ".join(f"{c}::text" for c in GENERATED)
    rows = conn.execute(f"SELECT id, {select} FROM {name}").fetchall()
    return {r[0]: dict(zip(GENERATED, r[1:], strict=True)) for r in rows}


def _stores_equal_source(settings: Any, conn: psycopg.Connection[Any], name: str) -> None:
    wanted = _source(conn, name)
    found = stores.stores(settings, f"public.{name}")
    for store in STORES:
        held = _texts(found[store])
        differ = {
            k: {
                c: (v, held.get(k, {}).get(c))
                for c, v in row.items()
                if held.get(k, {}).get(c) != v
            }
            for k, row in wanted.items()
        }
        assert held.keys() == wanted.keys(), (store, sorted(held), sorted(wanted))
        assert not any(differ.values()), (store, {k: d for k, d in differ.items() if d})


def test_generated_columns_reach_every_store(captured: Capture) -> None:
    columns = ", ".join(f"{c} {d}" for c, d in GENERATED.items())
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, a int, label text, at timestamptz, "
        f"big text, tags text[], amount numeric(8,2), doc jsonb, other int, {columns})",
        # stored out of line, uncompressed: an update leaving it alone logs a placeholder
        "ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO {name} (id, a, label, at, big, tags, amount, doc) "
        "SELECT g, g, 'l' || g, timestamptz '2024-02-28 23:30+00' + g * interval '1 hour', "
        "repeat(md5(g::text), 300), ARRAY['t' || g, 'u'], g + 0.25, "
        "jsonb_build_object('kind', 'k' || g) FROM generate_series(1, 10) g",
        prefix="gen",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {name} (id, a, label, at, big, tags, amount, doc) VALUES "
            "(11, 11, 'new', '2024-03-01 00:00+00', repeat('x', 5000), '{}', NULL, '{}')"
        )
        for value in (100, 200, 300):  # three versions of key 1
            conn.execute(f"UPDATE {name} SET a = {value} WHERE id = 1")
        conn.execute(f"UPDATE {name} SET label = 'relabelled', amount = 2 WHERE id = 2")
        # `big` is TOASTed and unchanged: its placeholder, read back from the source
        conn.execute(f"UPDATE {name} SET a = -5 WHERE id = 3")
        conn.execute(f"UPDATE {name} SET other = 1 WHERE id = 4")
        conn.execute(f"UPDATE {name} SET big = 'short', tags = NULL WHERE id = 5")
        conn.execute(f"DELETE FROM {name} WHERE id = 6")
    info = table_info(settings, table)
    assert [c.name for c in info.generated] == list(GENERATED)
    wait_until_captured(settings)
    run_apply(settings, STORES, once=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        _stores_equal_source(settings, conn, name)

    # each version of key 1 holds its own doubled value (computed from its event)
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    history = spark.read.format("delta").load(history_path(warehouse_root(settings), table))
    versions = sorted(r["doubled"] for r in history.where("id = 1").collect())
    assert versions == [2, 200, 400, 600], versions

    # a backfill reads the rows again through Debezium, without generated values
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET a = a + 1000 WHERE id = 7")
    _, offset = start_backfill(settings, table)
    assert watch_backfill(settings, offset, lambda p: None, timeout=240).state == "COMPLETED"
    wait_until_captured(settings)
    run_apply(settings, STORES, once=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        _stores_equal_source(settings, conn, name)
    results = verify(settings, [info], STORES, timeout=60)
    assert [(d.store, d.ok, d.store_rows) for d in results] == [(s, True, 10) for s in STORES], [
        (d.store, d.different[:3]) for d in results
    ]


def test_a_generated_value_its_event_cannot_give_is_read_back(captured: Capture) -> None:
    """An expression that fails on the event's values (here NULL, the placeholder's
    stand-in, cast to a NOT NULL domain: an integrity error, not a data error) holds no
    store back: that row's generated values are read from the source, the other rows of
    the batch keep theirs."""
    t = captured(
        "CREATE DOMAIN {name}_nn AS int NOT NULL",
        "CREATE TABLE {name} (id int PRIMARY KEY, a int, big text, "
        "big_len {name}_nn GENERATED ALWAYS AS (length(big) + a) STORED)",
        "ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO {name} (id, a, big) SELECT g, g, repeat(md5(g::text), 300) "
        "FROM generate_series(1, 3) g",
        prefix="gen",
    )
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET a = 50 WHERE id = 1")  # `big`: its placeholder
        conn.execute(f"UPDATE {t.name} SET a = 60, big = 'x' WHERE id = 2")
        wanted = dict(conn.execute(f"SELECT id, big_len FROM {t.name}").fetchall())
    assert wanted == {1: 9650, 2: 61, 3: 9603}
    wait_until_captured(t.settings)
    run_apply(t.settings, STORES, once=True)
    found = stores.stores(t.settings, f"public.{t.name}")
    for store in STORES:
        held = {int(k): int(row["big_len"]) for k, row in found[store].items()}
        assert held == wanted, (store, held)


def test_a_table_owners_expression_runs_with_no_privilege_and_no_time_to_stall(
    captured: Capture,
) -> None:
    """A table owner's generated column calls an IMMUTABLE wrapper around code that
    writes a table, or waits: it ran as the pipeline's administrator (a superuser on the
    local stack), for as long as it liked. Now it runs as a role without privileges, read
    only, for at most EXPRESSION_TIMEOUT; the values it cannot give are read back from
    the source's row, and no store waits. (The role and its schema are left behind.)"""
    owner = f"owner_{uuid.uuid4().hex[:8]}"
    t = captured(
        f"CREATE ROLE {owner} LOGIN",
        f"CREATE SCHEMA {{name}} AUTHORIZATION {owner}",
        f"SET ROLE {owner}",
        "CREATE TABLE {name}.seen (n serial PRIMARY KEY, who text)",
        "CREATE FUNCTION {name}.note() RETURNS int LANGUAGE plpgsql AS "
        "$$BEGIN INSERT INTO {name}.seen (who) VALUES (current_user); RETURN 0; END$$",
        "CREATE FUNCTION {name}.noted(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS "
        "$$BEGIN PERFORM {name}.note(); RETURN i * 2; END$$",
        "CREATE FUNCTION {name}.slow(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS "
        f"$$BEGIN IF current_user <> '{owner}' THEN PERFORM pg_sleep(3600); END IF; "
        "RETURN i * 3; END$$",
        "CREATE TABLE {name}.noting (id int PRIMARY KEY, v int, "
        "g int GENERATED ALWAYS AS ({name}.noted(v)) STORED)",
        "CREATE TABLE {name}.waiting (id int PRIMARY KEY, v int, "
        "g int GENERATED ALWAYS AS ({name}.slow(v)) STORED)",
        "INSERT INTO {name}.noting (id, v) VALUES (1, 1), (2, 2)",
        "INSERT INTO {name}.waiting (id, v) VALUES (1, 1), (2, 2)",
        "RESET ROLE",
        prefix="owned",
        tables=["{name}.noting", "{name}.waiting"],
    )
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"SET ROLE {owner}")
        for table in ("noting", "waiting"):
            conn.execute(f"UPDATE {t.name}.{table} SET v = v + 10 WHERE id = 1")
            conn.execute(f"INSERT INTO {t.name}.{table} (id, v) VALUES (3, 3)")
    wait_until_captured(t.settings)
    run_apply(t.settings, STORES, once=True)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        who = {r[0] for r in conn.execute(f"SELECT who FROM {t.name}.seen").fetchall()}
        assert who == {owner}, who  # only the owner's own writes ran its code
        for table, factor in (("noting", 2), ("waiting", 3)):
            wanted = dict(conn.execute(f"SELECT id, g FROM {t.name}.{table}").fetchall())
            assert wanted == {1: 11 * factor, 2: 2 * factor, 3: 3 * factor}
            found = stores.stores(t.settings, f"{t.name}.{table}")
            for store in STORES:
                held = {int(k): int(row["g"]) for k, row in found[store].items()}
                assert held == wanted, (store, table, held)
