"""DDL that changes every stored value without a change event: `ADD COLUMN … DEFAULT`
(existing rows read the default) and a type change that rewrites the values' text
(numeric(8,2) → numeric(12,4): 1.50 becomes 1.5000). The apply job's next micro-batch
sees the new catalog and backfills the table through the log, so every store ends with
the source's values; read with the tests' own readers (tests/stores.py)."""

from __future__ import annotations

import time
from decimal import Decimal

import psycopg
import pytest

from materializers.apply import run_apply
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
