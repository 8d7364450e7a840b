"""DDL that changes every stored value without a change event: `ADD COLUMN … DEFAULT`
(existing rows read the default) and a type change that rewrites the values' text
(numeric(8,2) → numeric(12,4): 1.50 becomes 1.5000). The apply job's next micro-batch
sees the new catalog and backfills the table through the log, so every store ends with
the source's values; read with the tests' own readers (tests/stores.py)."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.source_reader import captured_tables
from cdc.check.verify import verify
from tests.conftest import Capture
from tests.stores import stores

pytestmark = pytest.mark.integration

STORES = ["cache", "search", "warehouse"]


def test_a_value_rewriting_alter_is_backfilled_into_every_store(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, amount numeric(8,2))",
        "INSERT INTO {name} SELECT g, g + 0.5 FROM generate_series(1, 5) g",
        prefix="rewrite",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, STORES, once=True)
    assert stores(settings, table)["cache"][1]["amount"] == "1.50"

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {name} ADD COLUMN flag int NOT NULL DEFAULT 7")
        conn.execute(f"ALTER TABLE {name} ALTER COLUMN amount TYPE numeric(12,4)")
        conn.execute(f"INSERT INTO {name} VALUES (6, 6.5, 8)")  # a batch to see it

    deadline = time.monotonic() + 180
    while True:
        run_apply(settings, STORES, once=True)
        held = stores(settings, table)
        if (
            all(
                sorted(rows) == [1, 2, 3, 4, 5, 6] and all(r.get("flag") for r in rows.values())
                for rows in held.values()
            )
            or time.monotonic() > deadline
        ):
            break
        time.sleep(2)
    for key in range(1, 7):
        flag = 8 if key == 6 else 7
        text = {"id": str(key), "amount": f"{key}.5000", "flag": str(flag)}
        assert held["cache"][key] == text, key
        assert held["search"][key]["flag"] == flag, key
        assert str(held["search"][key]["amount"]) == f"{key}.5000", key
        assert held["warehouse"][key]["flag"] == flag, key
        assert held["warehouse"][key]["amount"] == Decimal(f"{key}.5000"), key


def test_a_dropped_column_leaves_every_store_and_verify_judges_them_alike(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, qty int, discontinued boolean)",
        "INSERT INTO {name} SELECT g, g, g % 2 = 0 FROM generate_series(1, 20) g",
        prefix="dropcol",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, STORES, once=True)
    assert all(len(rows) == 20 for rows in stores(settings, table).values())
    catalog = captured_tables(settings)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {name} DROP COLUMN discontinued")
    # verify, with the table as it is now, sees the dropped column's values in every
    # store (not only in the cache)
    now = {**catalog, **captured_tables(settings)}[table]
    drifts = verify(settings, [now], STORES)
    assert {d.store for d in drifts if len(d.different) == 20} == set(STORES), drifts

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET qty = qty + 100 WHERE id = 1")  # a batch to see it

    def left(held: dict[str, dict[Any, dict[str, Any]]]) -> int:
        return sum(
            1
            for rows in held.values()
            for row in rows.values()
            if row.get("discontinued") is not None
        )

    deadline = time.monotonic() + 180
    while True:
        run_apply(settings, STORES, once=True)
        held = stores(settings, table)
        if (left(held) == 0 and held["cache"][1]["qty"] == "101") or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert left(held) == 0
    for key in range(1, 21):
        qty = key + 100 if key == 1 else key
        assert held["cache"][key] == {"id": str(key), "qty": str(qty)}, key
        assert held["search"][key] == {"id": key, "qty": qty}, key
        assert held["warehouse"][key]["qty"] == qty, key
    assert all(d.ok for d in verify(settings, [now], STORES))


def test_an_enum_value_renamed_reaches_every_store(captured: Capture) -> None:
    t = captured(
        "CREATE TYPE {name}_mood AS ENUM ('sad', 'ok')",
        "CREATE TABLE {name} (id int PRIMARY KEY, mood {name}_mood)",
        "INSERT INTO {name} SELECT g, CASE WHEN g % 2 = 0 THEN 'sad' ELSE 'ok' END::{name}_mood "
        "FROM generate_series(1, 10) g",
        prefix="enum",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, STORES, once=True)
    assert stores(settings, table)["cache"][2]["mood"] == "sad"

    with psycopg.connect(dsn, autocommit=True) as conn:
        # no row changes, yet every 'sad' row now reads 'unhappy'
        conn.execute(f"ALTER TYPE {name}_mood RENAME VALUE 'sad' TO 'unhappy'")
        conn.execute(f"UPDATE {name} SET mood = 'ok' WHERE id = 1")  # a batch to see it

    def renamed(held: dict[str, dict[Any, dict[str, Any]]]) -> bool:
        return all(
            rows[k]["mood"] == ("unhappy" if k % 2 == 0 else "ok")
            for rows in held.values()
            for k in range(1, 11)
        )

    deadline = time.monotonic() + 180
    while True:
        run_apply(settings, STORES, once=True)
        held = stores(settings, table)
        if renamed(held) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert renamed(held), {s: {k: r["mood"] for k, r in rows.items()} for s, rows in held.items()}
