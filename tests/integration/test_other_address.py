"""A store at another address than loopback (issue 69: "other addresses, not only
loopback"): Redis in a network namespace the test makes itself, listening only at
10.x.y.2, reached from this machine over a veth pair. `cdc apply` writes the cache
there, and the test's own redis-py reads it back: every row PostgreSQL holds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest
import redis

from tests.conftest import Capture
from tests.helpers import run_cdc
from tests.logcheck import poll, table_info, wait_until_equal
from tests.netns import namespace

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def test_the_cache_at_another_address_holds_every_row(captured: Capture, tmp_path: Path) -> None:
    with namespace() as ns:
        port = 6379  # the namespace's own: no other server of this machine is there
        server = subprocess.Popen(
            ns.command(
                "redis-server",
                *("--bind", ns.address, "--port", str(port), "--protected-mode", "no"),
                *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(host=ns.address, port=port, decode_responses=True)

            def answers() -> bool:
                try:
                    return bool(client.ping())
                except redis.RedisError:
                    return False

            poll(answers, 30, f"redis at {ns.address}")
            t = captured(
                "CREATE TABLE {name} (id int PRIMARY KEY, note text)",
                "INSERT INTO {name} SELECT g, 'row ' || g FROM generate_series(1, 500) g",
                prefix="far",
            )
            with psycopg.connect(t.dsn, autocommit=True) as conn:
                conn.execute(f"UPDATE {t.name} SET note = 'changed' WHERE id % 5 = 0")
                conn.execute(f"DELETE FROM {t.name} WHERE id % 7 = 0")
            wait_until_equal(t.settings, table_info(t.settings, t.table))
            env = {
                **t.env,
                "CDC_REDIS__MANAGED": "false",
                "CDC_REDIS__HOST": ns.address,
                "CDC_REDIS__PORT": str(port),
            }
            result = run_cdc("apply", "--once", "--store", "cache", env=env, timeout=900)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

            with psycopg.connect(t.dsn) as conn:
                rows = conn.execute(f"SELECT id, note FROM {t.name}").fetchall()
            expected = {r[0]: r[1] for r in rows}
            prefix = f"{t.settings.pipeline.topic_prefix}:{t.table}:"
            held = {}
            for name in client.scan_iter(match=prefix + "*"):
                entry = client.hgetall(name)
                if "_deleted" not in entry:  # a deleted key's marker
                    held[json.loads(name[len(prefix) :])["id"]] = entry["note"]
            assert len(expected) == 500 - 500 // 7
            assert held == expected
        finally:
            server.terminate()
            server.wait(timeout=30)
