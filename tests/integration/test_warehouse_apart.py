"""`cdc apply` of every store runs the warehouse in a process of its own (contract point
9: the warehouse's work never takes what the fast stores need). Frozen (SIGSTOP), the
warehouse holds neither the cache nor the search index back; killed, it is started again
and catches up; the apply job stopped, it stops too. `cdc status` names the process of
each store. The stores are read with this test's own readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from tests.conftest import Capture
from tests.helpers import ROOT, ended, run_cdc
from tests.logcheck import poll
from tests.stores import cache, search

pytestmark = [pytest.mark.integration, pytest.mark.long]


def source_rows(dsn: str, name: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT id, n FROM {name}").fetchall())  # type: ignore[arg-type]


def values(rows: dict) -> dict[int, int]:  # type: ignore[type-arg]
    """A store's rows (tests/stores.py) as id -> n."""
    return {key: int(row["n"]) for key, row in rows.items()}


def stores(env: dict[str, str]) -> dict[str, dict]:  # type: ignore[type-arg]
    status = run_cdc("status", "-o", "json", env=env)
    return json.loads(status.stdout)["pipeline"]["stores"]  # type: ignore[no-any-return]


def test_the_warehouse_apart_holds_no_other_store_back(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 300) g",
        prefix="apart",
    )
    name, table, settings, dsn, env = t.name, t.table, t.settings, t.dsn, t.env
    log = settings.data_dir / f"{name}-apply.log"
    apply = None
    warehouse = None
    try:
        with log.open("w") as out:
            apply = subprocess.Popen(
                [sys.executable, "-m", "cdc", "apply"],  # every store: the default
                env={**os.environ, **env},
                cwd=ROOT,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )

        def all_applied() -> bool:
            found = stores(env)
            return all(
                found.get(s, {}).get("pid") and found[s]["backlog_events"] == 0
                for s in ("cache", "search", "warehouse")
            )

        poll(all_applied, 300, "every store to apply the snapshot")
        found = stores(env)
        assert found["cache"]["pid"] == found["search"]["pid"] == apply.pid
        warehouse = found["warehouse"]["pid"]
        assert warehouse != apply.pid and found["warehouse"]["running"] is True
        applied_before = found["warehouse"]["applied_at_ms"]

        # the warehouse frozen (its process and its Spark JVM): the others go on
        os.killpg(warehouse, signal.SIGSTOP)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for step in range(1, 4):
                conn.execute(f"UPDATE {name} SET n = n + 1 WHERE id % 3 < {step}")
            conn.execute(f"DELETE FROM {name} WHERE id > 290")
        expected = source_rows(dsn, name)
        poll(lambda: values(cache(settings, table)) == expected, 120, "the cache")
        poll(lambda: values(search(settings, table)) == expected, 120, "the index")
        frozen = stores(env)["warehouse"]
        assert frozen["applied_at_ms"] == applied_before and frozen["backlog_events"] > 0

        # killed, it is started again, and catches up
        os.killpg(warehouse, signal.SIGCONT)
        os.killpg(warehouse, signal.SIGKILL)
        poll(
            lambda: stores(env)["warehouse"]["backlog_events"] == 0,
            300,
            "the warehouse to be started again and catch up",
        )
        again = stores(env)["warehouse"]["pid"]
        assert again not in (warehouse, apply.pid) and not ended(again)
        assert apply.poll() is None
        assert "warehouse: its process exited" in log.read_text()
        warehouse = again

        # Ctrl-C stops the apply job, which stops the warehouse's process
        os.kill(apply.pid, signal.SIGINT)
        apply.wait(timeout=120)
        deadline = time.monotonic() + 60
        while not ended(warehouse) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ended(warehouse), "the warehouse's process outlived the apply job"
        assert stores(env)["warehouse"]["running"] is False
    finally:
        for pid in (warehouse, apply.pid if apply is not None else None):
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGCONT)
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
