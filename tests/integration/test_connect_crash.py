"""Kafka Connect killed mid-stream and restarted: nothing is lost."""

from __future__ import annotations

import io
import os
import signal
import time
import uuid

import psycopg
import pytest
from rich.console import Console

from cdc.components import Connect
from cdc.pipeline import drop_pipeline
from snapshot.initial import run_snapshot
from tests.conftest import RunningStack
from tests.helpers import run_cdc
from tests.integration.test_snapshot import Writer
from tests.logcheck import events_by_key, pipeline_for, table_info, wait_until_equal

pytestmark = pytest.mark.integration


def test_connect_killed_and_restarted_loses_nothing(stack: RunningStack) -> None:
    name = "crash_" + uuid.uuid4().hex[:8]
    settings = pipeline_for(stack.settings, [f"public.{name}"])
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)")
        conn.execute(f"INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 3000) g")
    writer = Writer(dsn, name, first_new_id=100_000, max_id=3000)
    connect = Connect(settings)
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        writer.start()
        time.sleep(3)
        pid = connect.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # mid-stream, offsets not flushed
        committed_while_down = writer.commits
        time.sleep(3)
        assert writer.commits > committed_while_down  # the source went on changing
        result = run_cdc("up", env=stack.env)
        assert result.returncode == 0, result.stderr
        assert connect.pid() not in (None, pid)
        time.sleep(3)
        writer.stop.set()
        writer.join()
        assert writer.error is None

        table = table_info(settings, f"public.{name}")
        _, records = wait_until_equal(settings, table, timeout=300)
        for key, events in events_by_key(records).items():
            versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
            # a restart replays from the last committed offset: duplicates are allowed,
            # a missing version is not, and the last event is the newest
            assert sorted(set(versions)) == list(range(versions[0], max(versions) + 1)), key
            assert versions[-1] == max(versions), key
    finally:
        writer.stop.set()
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
