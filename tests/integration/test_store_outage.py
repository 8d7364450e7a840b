"""A store that is down blocks its own apply; it never drops. Redis killed (SIGKILL) and
OpenSearch frozen (SIGSTOP) while changes stream, then PostgreSQL stopped while they come
back: nothing goes to the dead-letter topic, `cdc status` says the store is waiting and
why, the apply job waits for PostgreSQL (it reads the catalog every batch), and once each
answers again every store equals the source (read with this test's own readers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings.connections import KafkaSettings
from cdc.stack import Stack
from tests.conftest import Capture, RunningStack
from tests.helpers import ROOT, free_ports, run_cdc
from tests.logcheck import poll
from tests.stores import cache, search

pytestmark = pytest.mark.integration


def pid_of(data_dir: Path, component: str) -> int:
    return int((data_dir / "run" / f"{component}.pid").read_text().split()[0])


def source_rows(dsn: str, name: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT id, n FROM {name}").fetchall())  # type: ignore[arg-type]


def cache_n(settings: Any, table: str) -> dict[int, int]:
    return {k: int(row["n"]) for k, row in cache(settings, table).items()}


def search_n(settings: Any, table: str) -> dict[int, int]:
    return {k: row["n"] for k, row in search(settings, table).items()}


def dead_letters(kafka: KafkaSettings, topic: str) -> int:
    consumer = KafkaConsumer(**kafka_client_kwargs(kafka))
    partitions = consumer.partitions_for_topic(topic) or set()
    ends = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
    consumer.close()
    return sum(ends.values())


def test_a_store_that_is_down_blocks_its_apply_and_loses_nothing(
    stack: RunningStack, captured: Capture
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 2000) g",
        prefix="down",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    data_dir = settings.data_dir
    prefix = settings.pipeline.topic_prefix
    env = {**t.env, "CDC_APPLY__STORE_RETRY_S": "3"}
    log = data_dir / f"{name}-apply.log"
    apply = None
    frozen = None
    try:
        with log.open("w") as out:
            apply = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cdc",
                    "apply",
                    "--store",
                    "cache",
                    "--store",
                    "search",
                ],
                env={**os.environ, **env},
                cwd=ROOT,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        expected = source_rows(dsn, name)
        poll(lambda: cache_n(settings, table) == expected, 300, "the cache")

        os.kill(pid_of(data_dir, "redis"), signal.SIGKILL)
        frozen = pid_of(data_dir, "opensearch")
        os.kill(frozen, signal.SIGSTOP)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for step in range(1, 6):
                conn.execute(f"UPDATE {name} SET n = n + 1 WHERE id % 5 < {step}")
            conn.execute(f"DELETE FROM {name} WHERE id > 1900")
            conn.execute(f"INSERT INTO {name} SELECT g, 7 FROM generate_series(3001, 3100) g")

        def cache_waits() -> bool:
            status = run_cdc("status", "-o", "json", env=env)
            document = json.loads(status.stdout)
            waiting = document["pipeline"]["stores"].get("cache", {}).get("waiting")
            return bool(waiting and "Redis" in waiting["reason"])

        poll(cache_waits, 120, "`cdc status` to show the cache waiting for Redis")
        assert apply.poll() is None, "the apply job died while Redis was down"
        time.sleep(35)  # OpenSearch frozen past the client's timeout and the retries
        assert apply.poll() is None, "the apply job died while OpenSearch was frozen"

        # PostgreSQL stops too (a fast shutdown); the stores answer again before it does
        postgres = pid_of(data_dir, "postgres")
        os.kill(postgres, signal.SIGINT)
        poll(lambda: not Path(f"/proc/{postgres}").exists(), 60, "PostgreSQL to stop")
        os.kill(frozen, signal.SIGCONT)
        frozen = None
        Stack(settings).redis.start()  # Redis again (its AOF holds what it took)
        poll(
            lambda: any(
                "PostgreSQL at" in line and "waits (nothing committed" in line
                for line in log.read_text().splitlines()
            ),
            120,
            "`cdc apply` to wait for PostgreSQL (the catalog it reads every batch)",
        )
        time.sleep(10)
        assert apply.poll() is None, "the apply job died while PostgreSQL was down"
        started = run_cdc("up", env=stack.env)  # PostgreSQL again
        assert started.returncode == 0, started.stderr
        expected = source_rows(dsn, name)
        assert len(expected) == 2000
        poll(lambda: cache_n(settings, table) == expected, 300, "the cache")
        poll(lambda: search_n(settings, table) == expected, 300, "the index")
        assert dead_letters(settings.kafka, f"{prefix}.dlq") == 0
        assert apply.poll() is None
        said = log.read_text()
        assert "cache: Redis at" in said and "nothing committed or dropped" in said, said
        assert "cache: answers again" in said, said
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        if apply is not None and apply.poll() is None:
            os.killpg(apply.pid, signal.SIGKILL)
        run_cdc("up", env=stack.env)


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (("verify", "--store", "cache", "--timeout", "60"), "Redis at redis://"),
        (("rebuild", "--store", "search", "--yes"), "OpenSearch at http://"),
    ],
)
def test_a_command_that_reads_a_store_that_is_down_says_so_in_one_line(
    captured: Capture, command: tuple[str, ...], said: str
) -> None:
    """`cdc verify` and `cdc rebuild` (after the stores have applied the table) with the
    cache and the index at a port nothing listens on: one line naming the store and what
    to do, exit 8, and nothing removed (a traceback of the client's error before)."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 20) g",
        prefix="gone",
    )
    applied = run_cdc("apply", "--once", "--store", "cache", "--store", "search", env=t.env)
    assert applied.returncode == 0, applied.stderr[-2000:]
    (closed,) = free_ports(1)
    env = {**t.env, "CDC_REDIS__PORT": str(closed), "CDC_OPENSEARCH__PORT": str(closed)}
    result = run_cdc(*command, env=env, timeout=300)
    assert result.returncode == 8, result.stdout[-1000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]  # after the progress lines
    assert line.startswith("error: ") and said in line and "does not answer" in line, line
    assert "start it (`cdc up`) or check its settings" in line, line
    # the store still holds the table: nothing was reset before the store was reached
    assert len(cache(t.settings, t.table)) == 20
    assert len(search(t.settings, t.table)) == 20


def test_a_rebuild_that_could_not_backfill_empties_nothing(captured: Capture) -> None:
    """`cdc rebuild` with Kafka down: it says so before the store is emptied, so the store
    keeps the table (before, it emptied the store and restarted its checkpoint, then
    failed at the backfill)."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 20) g",
        prefix="nobf",
    )
    applied = run_cdc("apply", "--once", "--store", "cache", env=t.env)
    assert applied.returncode == 0, applied.stderr[-2000:]
    (closed,) = free_ports(1)
    env = {**t.env, "CDC_KAFKA__PORT": str(closed)}
    result = run_cdc("rebuild", "--store", "cache", "--table", t.table, "--yes", env=env)
    assert result.returncode == 13, result.stdout[-1000:] + result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "Traceback" not in said and "removing" not in said, said
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: Kafka at ") and "does not answer" in line, line
    assert len(cache(t.settings, t.table)) == 20
