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
from collections import Counter
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import apply_process, run_cdc
from tests.logcheck import poll

pytestmark = pytest.mark.integration

ROWS = 2000
LOAD_S = 40
# the keys the other writer adds: none of them is PostgreSQL's
FOREIGN = -1
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


def foreign_rows(path: str, ids: list[int]) -> Any:
    """Rows of `current`'s columns for `ids`, every other column NULL but `n` and `body`."""
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    columns = {
        "id": pa.array(ids, schema.field("id").type),
        "n": pa.array([0] * len(ids), schema.field("n").type),
        "body": pa.array(["foreign"] * len(ids), schema.field("body").type),
    }
    return pa.Table.from_arrays(
        [columns.get(f.name, pa.nulls(len(ids), f.type)) for f in schema], schema=schema
    )


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


def committed(step: Any) -> None:
    """Run `step` (a commit of the other writer) until it wins its commit: it loses some to
    the apply, as the apply loses some to it."""
    from deltalake.exceptions import CommitFailedError

    for _ in range(100):
        try:
            step()
            return
        except CommitFailedError:
            time.sleep(random.uniform(0.05, 0.3))
    raise AssertionError("the other writer lost 100 commits in a row")


def other_writer(path: str, stop: threading.Event, done: Counter[str]) -> None:
    """Another engine on `current`, in turn: a DELETE (of a row it appended, as a GDPR
    erasure removes one), an UPDATE, an OPTIMIZE and a VACUUM."""
    from deltalake import DeltaTable, write_deltalake

    kinds = ["delete", "update", "optimize", "vacuum"]
    turn = 0
    while not stop.wait(0.3):
        kind = kinds[turn % len(kinds)]
        turn += 1
        if kind in ("delete", "update"):
            committed(lambda: write_deltalake(path, foreign_rows(path, [FOREIGN]), mode="append"))
        if kind == "update":
            committed(
                lambda: DeltaTable(path).update(predicate=f"id = {FOREIGN}", updates={"n": "n + 1"})
            )
        if kind in ("delete", "update"):
            committed(lambda: DeltaTable(path).delete(f"id = {FOREIGN}"))
        elif kind == "optimize":
            committed(lambda: DeltaTable(path).optimize.compact())
        else:
            # as people run it: the default retention (7 days). A shorter one removes
            # files that readers of older versions still read (docs/stores.md)
            committed(lambda: DeltaTable(path).vacuum(dry_run=False))
        done[kind] += 1


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
    done: Counter[str] = Counter()
    threads = [
        threading.Thread(target=load, args=(t.dsn, t.name, stop, paused), daemon=True),
        threading.Thread(target=other_writer, args=(path, stop, done), daemon=True),
    ]
    with apply_process(t.env, ["warehouse"]) as apply:
        poll(lambda: holds(path) == ROWS, 240, "the warehouse to hold the snapshot")
        try:
            for thread in threads:
                thread.start()
            time.sleep(LOAD_S / 2)
            # keys only the warehouse holds, which the repair removes while apply runs and
            # the other writer writes. The load pauses: verify compares a table only
            # while it holds still (docs/verify.md); the apply catches up meanwhile
            from deltalake import write_deltalake

            extra = list(range(EXTRA, EXTRA + 50))
            committed(lambda: write_deltalake(path, foreign_rows(path, extra), mode="append"))
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
            for thread in threads:
                thread.join(timeout=60)
        assert set(done) == {"delete", "update", "optimize", "vacuum"}, done
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
                f"{len(extra_keys)} extra (e.g. {extra_keys[:5]}); the other writer did {done}"
            ) from None
        verified = run_cdc("verify", "--table", t.table, "--store", "warehouse", env=t.env)
        assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
