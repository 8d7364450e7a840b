"""A warehouse table whose Delta log names a data file that is gone (deleted by hand, by
a VACUUM or by a bucket rule): `cdc get`, `cdc verify` and `cdc apply` each say so in
one line naming the table and the command that mends it (a traceback of delta-rs's or
Spark's FileNotFoundError before), and that command, `cdc rebuild`, mends it: after it
and an apply the table equals PostgreSQL, read by delta-rs."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import run_cdc
from tests.stores import delta_rs_read

pytestmark = pytest.mark.integration


def _said(result: object, table: str) -> str:
    out = result.stdout + result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 8, out[-3000:]  # type: ignore[attr-defined]
    line = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert line.startswith("error: ") and f"the warehouse's copy of {table} cannot be" in line
    assert f"`cdc rebuild --store warehouse --table {table} --yes`" in line, line
    assert "a data file its Delta log names is missing (part-" in line, line
    return line


def test_a_data_file_gone_is_said_with_its_mend_and_the_mend_works(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, g FROM generate_series(1, 300) g",
        prefix="gone",
    )
    applied = run_cdc("apply", "--once", "--store", "warehouse", env=t.env)
    assert applied.returncode == 0, applied.stderr[-2000:]
    current = Path(current_path(warehouse_root(t.settings), t.table))
    files = sorted(current.glob("*.parquet"))
    assert files
    for file in files:
        file.unlink()

    _said(run_cdc("get", t.table, "7", "--store", "warehouse", env=t.env), t.table)
    _said(run_cdc("verify", "--store", "warehouse", "--timeout", "120", env=t.env), t.table)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.table} SET n = n + 1000 WHERE id <= 10")
    apply = run_cdc("apply", "--once", "--store", "warehouse", env=t.env)
    assert "the apply job stopped: StoreError: " in _said(apply, t.table)

    mended = run_cdc("rebuild", "--store", "warehouse", "--table", t.table, "--yes", env=t.env)
    assert mended.returncode == 0, mended.stderr[-2000:]
    applied = run_cdc("apply", "--once", "--store", "warehouse", env=t.env)
    assert applied.returncode == 0, applied.stderr[-2000:]
    rows = delta_rs_read(current).to_pylist()
    with psycopg.connect(t.dsn) as conn:
        source = dict(conn.execute(f"SELECT id, n FROM {t.table}").fetchall())
    assert {r["id"]: r["n"] for r in rows} == source
    assert source[3] == 1003 and len(source) == 300
