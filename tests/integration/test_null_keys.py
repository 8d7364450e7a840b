"""A key column may hold NULL (`pipeline.key_columns` on a table without a primary key):
such a key is one live row in the warehouse on Spark's path too (finding B of the
2026-12-01 review). Its lookups joined on `=`, which never matches NULL: a backfill of
keys the current state held was taken for inserts and appended again (a duplicate live
row per key), and a change delivered again was not refused."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.backfill import start_backfill, watch_backfill
from tests.conftest import Capture
from tests.logcheck import table_info, wait_until_equal
from tests.stores import warehouse_frame

pytestmark = pytest.mark.integration


def test_a_key_holding_null_is_one_row_after_a_backfill_on_sparks_path(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (a int NOT NULL, b int, v text)",
        # every key holds NULL: a batch with one key the `=` join matched would MERGE
        "INSERT INTO {name} SELECT g, NULL, 'x' FROM generate_series(1, 40) g",
        prefix="nullkey",
        replica_identity={"public.{name}": "full"},
        key_columns={"public.{name}": ["a", "b"]},
    )
    settings = t.settings.model_copy(
        update={"apply": t.settings.apply.model_copy(update={"warehouse_writer": "spark"})}
    )
    run_apply(settings, ["warehouse"], once=True)
    _, offset = start_backfill(settings, t.name)
    assert watch_backfill(settings, offset, lambda p: None, timeout=240).state == "COMPLETED"
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET v = 'y' WHERE a <= 10")
    wait_until_equal(settings, table_info(settings, t.table))
    run_apply(settings, ["warehouse"], once=True)

    live = warehouse_frame(settings, t.table).select("a", "b", "v").collect()
    twice = {a: n for a, n in Counter(r["a"] for r in live).items() if n > 1}
    assert not twice, f"keys with more than one live row: {sorted(twice)[:10]}"
    with psycopg.connect(t.dsn) as conn:
        source = set(conn.execute(f"SELECT a, b, v FROM {t.name}").fetchall())  # type: ignore[arg-type]
    assert {(r["a"], r["b"], r["v"]) for r in live} == source
