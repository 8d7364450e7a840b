"""The apply job killed with SIGKILL mid-batch and restarted: every store equals the source."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from cdc.check.status import pipeline_status
from cdc.check.view_checks import view_checks
from cdc.core.settings.views import SessionWindow, SlidingWindow, StreamStreamJoin, StreamTableJoin
from cdc.log.progress import read_progress
from cdc.stores.warehouse.tables import view_path, warehouse_root
from tests.conftest import Capture
from tests.contents import expected_cache, expected_search, source_tuples
from tests.helpers import ROOT, ended, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.source_load import Writer
from tests.stores import (
    cache_contents,
    history_rows,
    open_and_live,
    search_contents,
    warehouse_rows,
)

pytestmark = pytest.mark.integration


def test_apply_killed_mid_batch_and_restarted_converges(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 6000) g",
        prefix="kill",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    # each insert enriched with its own row as of the insert: its inserted values
    enrichment = StreamTableJoin(
        name=f"{name}_inserts",
        kind="stream_table",
        table=table,
        references=table,
        on="id",
        columns=["version", "note"],
    )
    # with a watermark, mid-window when killed: sessions of inserts, sliding windows of
    # a second, and each insert's first update within 2 seconds
    sessions = SessionWindow(
        name=f"{name}_sessions",
        table=table,
        kind="session",
        gap="1 second",
        group_by="note",
        watermark="10 seconds",
    )
    sliding = SlidingWindow(
        name=f"{name}_sliding",
        table=table,
        kind="sliding",
        window="1 second",
        watermark="10 seconds",
    )
    updated = StreamStreamJoin(
        name=f"{name}_updated",
        kind="stream_stream",
        table=table,
        references=table,
        on="id",
        columns=["version"],
        within="2 seconds",
        watermark="10 seconds",
    )
    env = {
        **t.env,
        # many small batches in every store: one is cut short
        "CDC_APPLY__MAX_OFFSETS_PER_TRIGGER": "1500",
        "CDC_STORES__WAREHOUSE__MAX_OFFSETS_PER_TRIGGER": "1500",
        "CDC_APPLY__JOINS": json.dumps([enrichment.model_dump(), updated.model_dump()]),
        "CDC_APPLY__WINDOWS": json.dumps([sessions.model_dump(), sliding.model_dump()]),
    }
    writer = Writer(dsn, name, first_new_id=100_000, max_id=6_000)
    apply = None
    try:
        writer.start()
        apply = subprocess.Popen(
            [sys.executable, "-m", "cdc", "apply"],
            env={**os.environ, **env},
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        while writer.commits < 3000:  # a bounded backlog, spread over several batches
            assert time.monotonic() < deadline and writer.error is None, "the writer is stuck"
            time.sleep(0.2)
        writer.stop.set()
        while not all(read_progress(settings, s) for s in ("cache", "search", "warehouse")):
            assert time.monotonic() < deadline, "the apply job made no progress"
            assert apply.poll() is None, "the apply job died"
            time.sleep(0.5)
        warehouse = read_progress(settings, "warehouse").pid  # type: ignore[union-attr]
        assert warehouse not in (None, apply.pid)  # the warehouse's own process
        os.killpg(apply.pid, signal.SIGKILL)  # the job and its Spark JVM, mid-stream
        apply.wait()
        # the warehouse's process dies with it (no warehouse writes beside a restart's)
        deadline_gone = time.monotonic() + 10
        while not ended(warehouse):
            assert time.monotonic() < deadline_gone, "the warehouse's process outlived it"
            time.sleep(0.2)
        writer.stop.set()
        writer.join()
        assert writer.error is None
        time.sleep(12)  # then a change whose time moves the watermark past the writer's
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {name} VALUES (900000, 0, 'tick')")
        wait_until_equal(settings, table_info(settings, table))  # the log holds everything

        # the restart replays the batch the kill cut short as it was planned, then takes
        # the rest in batches of another size (fewer: the catch-up's time is not the point)
        bigger = {
            "CDC_APPLY__MAX_OFFSETS_PER_TRIGGER": "100000",
            "CDC_STORES__WAREHOUSE__MAX_OFFSETS_PER_TRIGGER": "100000",
        }
        result = run_cdc("apply", "--once", env={**env, **bigger})
        assert result.returncode == 0, result.stderr
        assert cache_contents(settings, table) == expected_cache(settings, table)
        assert search_contents(settings, table) == expected_search(settings, table)
        assert warehouse_rows(settings, table, ["version", "note"]) == source_tuples(
            settings, table, ["version", "note"]
        )
        history = history_rows(settings, table)
        assert (
            history.count()
            == history.select("id", "_cdc_commit_lsn", "_cdc_lsn").distinct().count()
        )
        # each live row is its key's one open version (the ends as the test derives them)
        opened, live = open_and_live(settings, table, ["id", "version", "note"])
        assert opened == live
        # every insert once, enriched with what it inserted; and as the log enriches it
        inserts = history.where("_cdc_op = 'c'")
        events = history.sparkSession.read.format("delta").load(
            view_path(warehouse_root(settings), enrichment.name)
        )
        assert inserts.count() > 0
        assert events.count() == inserts.count()
        assert events.where("id_version <=> version AND id_note <=> note").count() == events.count()
        views = {"joins": [enrichment, updated], "windows": [sessions, sliding]}
        with_views = settings.model_copy(update={"apply": settings.apply.model_copy(update=views)})
        late = pipeline_status(with_views).late_events
        assert late == {sessions.name: 0, sliding.name: 0, updated.name: 0}
        checks = view_checks(with_views, {table: table_info(settings, table)})
        assert [c.table for c in checks] == [
            f"view {v}" for v in (enrichment.name, updated.name, sessions.name, sliding.name)
        ]
        assert all(c.ok for c in checks), [c.observed for c in checks]
        for check in checks[1:]:  # recomputed, with sessions and starts due
            assert not check.observed.startswith(("not recomputed", "0 due")), check.observed
    finally:
        writer.stop.set()
        if apply is not None and apply.poll() is None:
            os.killpg(apply.pid, signal.SIGKILL)
