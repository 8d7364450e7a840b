"""Backfills while streaming keep per-key order in the log."""

from __future__ import annotations

import io
import time
import uuid

import psycopg
import pytest
from rich.console import Console

from cdc.errors import BackfillError
from commands.pipeline import drop_pipeline
from snapshot.backfill import start_backfill, watch_backfill
from snapshot.initial import run_snapshot
from tests.conftest import RunningStack
from tests.logcheck import events_by_key, pipeline_for, table_info, wait_until_equal
from tests.writer import Writer

pytestmark = pytest.mark.integration


def test_a_backfill_under_writes_keeps_every_key_in_order(stack: RunningStack) -> None:
    name = "bf_" + uuid.uuid4().hex[:8]
    settings = pipeline_for(stack.settings, [f"public.{name}"])
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)")
        conn.execute(f"INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 8000) g")
    writer = Writer(dsn, name, first_new_id=100_000, max_id=8000)
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        writer.start()
        _, offset = start_backfill(settings, name)
        states: list[str] = []
        done = watch_backfill(settings, offset, lambda p: states.append(p.state), timeout=240)
        time.sleep(1)
        writer.stop.set()
        writer.join()
        assert writer.error is None and writer.commits > 20
        assert "STARTED" in states and done.state == "COMPLETED"
        assert done.rows_scanned and done.rows_scanned >= 7000

        table = table_info(settings, f"public.{name}")
        _, records = wait_until_equal(settings, table)
        backfilled = [
            r for r in records if r.op == "r" and r.value["source"]["snapshot"] == "incremental"
        ]
        assert len(backfilled) >= 7000
        for key, events in events_by_key(records).items():
            versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
            # a backfilled row never lands after a newer change of its key
            assert versions == sorted(versions), (key, [(e.op, e.offset) for e in events])
    finally:
        writer.stop.set()
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


def test_a_backfill_needs_a_streaming_pipeline_and_a_valid_filter(stack: RunningStack) -> None:
    name = "bf_" + uuid.uuid4().hex[:8]
    settings = pipeline_for(stack.settings, [f"public.{name}"])
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
    try:
        with pytest.raises(BackfillError, match="not streaming"):
            start_backfill(settings, name)
        run_snapshot(settings, Console(file=io.StringIO()))
        with pytest.raises(BackfillError, match="not a valid filter"):
            start_backfill(settings, name, where="no_such_column > 1")
        with pytest.raises(BackfillError, match="not captured"):
            start_backfill(settings, "public.pg_nothing_here")
    finally:
        drop_pipeline(settings)
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
