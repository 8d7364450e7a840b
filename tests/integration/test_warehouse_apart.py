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
from pathlib import Path

import psycopg
import pytest
import redis
import requests

from tests.conftest import Capture
from tests.helpers import ROOT, run_cdc
from tests.logcheck import poll

pytestmark = pytest.mark.integration


def source_rows(dsn: str, name: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT id, n FROM {name}").fetchall())  # type: ignore[arg-type]


def redis_rows(url: str, prefix: str) -> dict[int, int]:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    rows = {}
    for key in client.scan_iter(match=prefix + "*", count=1000):
        entry = client.hgetall(key)
        if "_deleted" not in entry:
            rows[json.loads(key[len(prefix) :])["id"]] = int(entry["n"])
    return rows


def search_rows(url: str, index: str) -> dict[int, int]:
    requests.post(f"{url}/{index}/_refresh", timeout=30).raise_for_status()
    body = {"size": 10000, "_source": ["id", "n"]}
    hits = requests.post(f"{url}/{index}/_search", json=body, timeout=30).json()["hits"]["hits"]
    return {h["_source"]["id"]: h["_source"]["n"] for h in hits}


def stores(env: dict[str, str]) -> dict[str, dict]:  # type: ignore[type-arg]
    status = run_cdc("status", "-o", "json", env=env)
    return json.loads(status.stdout)["pipeline"]["stores"]  # type: ignore[no-any-return]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text()


def test_the_warehouse_apart_holds_no_other_store_back(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 300) g",
        prefix="apart",
    )
    name, table, settings, dsn, env = t.name, t.table, t.settings, t.dsn, t.env
    prefix = settings.pipeline.topic_prefix
    cache_prefix, index = f"{prefix}:{table}:", f"{prefix}.{table}".lower()
    log = settings.data_dir / f"{name}-apply.log"
    apply = None
    warehouse = None
    try:
        with log.open("w") as out:
            apply = subprocess.Popen(
                [sys.executable, "-m", "commands", "apply"],  # every store: the default
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
        poll(lambda: redis_rows(settings.redis.url, cache_prefix) == expected, 120, "the cache")
        poll(lambda: search_rows(settings.opensearch.url, index) == expected, 120, "the index")
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
        assert again not in (warehouse, apply.pid) and alive(again)
        assert apply.poll() is None
        assert "warehouse: its process exited" in log.read_text()
        warehouse = again

        # Ctrl-C stops the apply job, which stops the warehouse's process
        os.kill(apply.pid, signal.SIGINT)
        apply.wait(timeout=120)
        deadline = time.monotonic() + 60
        while alive(warehouse) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(warehouse), "the warehouse's process outlived the apply job"
        assert stores(env)["warehouse"]["running"] is False
    finally:
        for pid in (warehouse, apply.pid if apply is not None else None):
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGCONT)
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
