"""Other writers on the warehouse's tables while `cdc apply` runs under load (finding A
of the 2026-12-01 review): another engine's OPTIMIZE, VACUUM, DELETE and UPDATE of
`current`, and `cdc verify --repair` removing the keys only the warehouse holds. Each
makes the apply's MERGEs lose commit conflicts; a MERGE that lost was counted as
written and its batch's changes never reached `current` (643 rows stale in the
review's run). Afterwards `current`, read by delta-rs (this test's own reader), equals
PostgreSQL, and `cdc verify` is clean."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import apply_process, run_cdc
from tests.logcheck import poll
from tests.other_writer import KINDS, OtherWriter, committed, foreign_rows

pytestmark = pytest.mark.integration

ROWS = 2000
LOAD_S = 40
# the keys the repair removes: none of them is PostgreSQL's
EXTRA = 10_000_000


def live_rows(path: str) -> dict[int, tuple[int, str]]:
    """`current` as delta-rs reads it: id -> (n, body)."""
    from deltalake import DeltaTable

    rows = DeltaTable(path).to_pyarrow_table(columns=["id", "n", "body"]).to_pylist()
    return {r["id"]: (r["n"], r["body"]) for r in rows}


def holds(path: str) -> int:
    """How many live rows `current` holds; 0 before it is made."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return len(live_rows(path))
    except TableNotFoundError:
        return 0


def source_rows(dsn: str, name: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT id, n, body FROM {name}").fetchall()  # type: ignore[arg-type]
    return {i: (n, body) for i, n, body in found}


def load(dsn: str, name: str, stop: threading.Event, paused: threading.Event) -> None:
    """About 40 transactions a second: updates, and a delete with its key inserted again;
    none while `paused` is set."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(0.025):
            if paused.is_set():
                continue
            key = random.randint(1, ROWS)
            if random.random() < 0.1:
                with conn.transaction():
                    conn.execute(f"DELETE FROM {name} WHERE id = %s", (key,))
                conn.execute(
                    f"INSERT INTO {name} VALUES (%s, 0, 'again') ON CONFLICT (id) DO NOTHING",
                    (key,),
                )
            else:
                conn.execute(
                    f"UPDATE {name} SET n = n + 1, body = md5(random()::text) WHERE id = %s",
                    (key,),
                )


def test_other_writers_and_a_repair_under_load_leave_the_warehouse_exact(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL, body text)",
        f"INSERT INTO {{name}} SELECT g, 0, 'v0' FROM generate_series(1, {ROWS}) g",
        prefix="others",
    )
    path = current_path(warehouse_root(t.settings), t.table)
    stop, paused = threading.Event(), threading.Event()
    loader = threading.Thread(target=load, args=(t.dsn, t.name, stop, paused), daemon=True)
    other = OtherWriter([(path, "id")])
    with apply_process(t.env, ["warehouse"]) as apply:
        poll(lambda: holds(path) == ROWS, 240, "the warehouse to hold the snapshot")
        try:
            loader.start()
            other.start()
            time.sleep(LOAD_S / 2)
            # keys only the warehouse holds, which the repair removes while apply runs and
            # the other writer writes. The load pauses: verify compares a table only
            # while it holds still (docs/verify.md); the apply catches up meanwhile
            from deltalake import write_deltalake

            extra = list(range(EXTRA, EXTRA + 50))
            rows = foreign_rows(path, "id", extra)
            committed(lambda: write_deltalake(path, rows, mode="append"))
            paused.set()
            repaired = run_cdc(
                "verify", "--table", t.table, "--store", "warehouse", "--repair", env=t.env
            )
            said = repaired.stdout[-3000:] + repaired.stderr[-3000:]
            assert "Traceback" not in repaired.stderr, said
            held = live_rows(path)
            assert not set(extra) & set(held), f"the repair left keys the source lacks: {said}"
            paused.clear()
            time.sleep(LOAD_S / 2)
        finally:
            stop.set()
            loader.join(timeout=60)
            other.stop()
        assert other.error is None, repr(other.error)
        assert set(other.done) == set(KINDS), other.done
        assert apply.poll() is None, "cdc apply stopped"

        expected = source_rows(t.dsn, t.name)

        def exact() -> bool:
            return live_rows(path) == expected

        try:
            poll(exact, 180, "the warehouse's current state to equal PostgreSQL")
        except AssertionError:
            held = live_rows(path)
            stale = [k for k in expected if held.get(k) != expected[k]]
            extra_keys = [k for k in held if k not in expected]
            raise AssertionError(
                f"{len(stale)} keys stale or missing in the warehouse (e.g. {stale[:5]}), "
                f"{len(extra_keys)} extra (e.g. {extra_keys[:5]}); other writes: {other.done}"
            ) from None
        verified = run_cdc("verify", "--table", t.table, "--store", "warehouse", env=t.env)
        assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
