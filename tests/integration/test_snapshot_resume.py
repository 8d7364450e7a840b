"""A snapshot that survives a crash (issue 48 item 3): `cdc snapshot` killed (SIGKILL,
its Spark driver with it) after it had written some of its CTID ranges; the table then
changes: rows deleted, inserted, and updated, some moved by their UPDATE into pages
the first run had already written, a toasted value among them left unchanged (its
UPDATE event carries Debezium's placeholder). `cdc snapshot` again resumes: it
streams from the slot's consistent point and backfills only what the first run had
not written. The log then equals the table, and so does the cache (read with
redis-py), while fewer rows went through the log again than the table holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from cdc.core.topics import change_topic, end_offsets
from tests.conftest import Capture
from tests.helpers import ROOT, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.stores import cache

pytestmark = pytest.mark.integration

ROWS = 200_000
PAGES_PER_READER = 60  # about 25 ranges of this table, a few per Spark job


def _ranges(dsn: str, pipeline: str) -> int:
    with psycopg.connect(dsn) as conn:
        made = conn.execute("SELECT to_regclass('cdc.snapshot_ranges')").fetchone()
        if not made or made[0] is None:  # the snapshot has not set up the source yet
            return 0
        row = conn.execute(
            "SELECT count(*) FROM cdc.snapshot_ranges WHERE pipeline = %s", (pipeline,)
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_killed_snapshot_resumes_and_reads_only_what_it_had_not_written(
    captured: Capture,
) -> None:
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int, note text, big text)",
        # a toasted value every 5,000 rows: incompressible, over 2 kB
        f"INSERT INTO {{name}} SELECT i, 0, 'v0', CASE WHEN i % 5000 = 0 THEN "
        "(SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 100) g) "
        f"END FROM generate_series(1, {ROWS}) i",
        "ANALYZE {name}",
        prefix="resume",
        snapshot=False,
        snapshot_pages_per_reader=PAGES_PER_READER,
    )
    pipe = made.settings.pipeline
    env = {**made.env, "CDC_PIPELINE__SNAPSHOT_PAGES_PER_READER": str(PAGES_PER_READER)}
    first = subprocess.Popen(
        [sys.executable, "-m", "cdc", "snapshot"],
        env={**os.environ, **env},
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while _ranges(made.dsn, pipe.name) == 0:
            assert first.poll() is None, "the snapshot ended before it wrote a range"
            assert time.monotonic() < deadline, "the snapshot never recorded a range"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM
        first.wait(timeout=30)
    recorded = _ranges(made.dsn, pipe.name)
    with psycopg.connect(made.dsn) as conn:
        state = conn.execute(
            "SELECT status FROM cdc.snapshots WHERE pipeline = %s", (pipe.name,)
        ).fetchone()
        pages = conn.execute(
            "SELECT relpages FROM pg_class WHERE oid = %s::regclass", (made.table,)
        ).fetchone()
    assert state == ("running",)
    shown = json.loads(run_cdc("status", "--output", "json", env=env).stdout)["pipeline"]
    assert (shown["snapshot"], shown["snapshot_ranges"]) == ("running", recorded)
    assert pages is not None and recorded * PAGES_PER_READER < pages[0], "it wrote every range"

    with psycopg.connect(made.dsn, autocommit=True) as conn:
        # room in the first pages (written by the first run), then UPDATEs of rows from
        # the last pages (not written): their new versions land in that room
        conn.execute(f"DELETE FROM {made.name} WHERE id <= 3000")
        # (index cleanup on: a VACUUM that skips it leaves the pages out of the FSM)
        conn.execute(f"VACUUM (INDEX_CLEANUP ON) {made.name}")
        conn.execute(f"UPDATE {made.name} SET n = n + 1, note = 'moved' WHERE id > {ROWS - 2000}")
        conn.execute(f"DELETE FROM {made.name} WHERE id BETWEEN {ROWS - 3000} AND {ROWS - 2500}")
        conn.execute(
            f"INSERT INTO {made.name} SELECT i, 1, 'new', NULL "
            f"FROM generate_series({ROWS + 1}, {ROWS + 500}) i"
        )
        moved = conn.execute(
            f"SELECT count(*) FROM {made.name} WHERE id > {ROWS - 2000} "
            f"AND ctid < '({recorded * PAGES_PER_READER},0)'::tid"
        ).fetchone()
        toasted = conn.execute(
            f"SELECT count(*) FROM {made.name} WHERE id > {ROWS - 2000} AND big IS NOT NULL"
        ).fetchone()
    assert moved is not None and moved[0] > 0, "no UPDATE moved a row into a written range"
    assert toasted is not None and toasted[0] > 0

    topic = change_topic(pipe, made.table)
    before = sum(end_offsets(made.settings.kafka, [topic])[topic].values())
    again = run_cdc("snapshot", "--output", "json", env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming the snapshot at LSN" in again.stderr
    result = json.loads(again.stdout)
    assert result["continued"] is True
    backfilled = result["rows"][made.table] - before
    source_rows = ROWS - 3000 - 501 + 500
    # only what the first run had not written went through the log again
    assert 0 < backfilled < source_rows, (backfilled, source_rows)

    wait_until_equal(made.settings, table_info(made.settings, made.table), timeout=300)
    assert run_cdc("apply", "--once", "--store", "cache", env=env, timeout=600).returncode == 0
    held = cache(made.settings, made.table)
    with psycopg.connect(made.dsn) as conn:
        wanted = {
            int(i): (n, note, big)
            for i, n, note, big in conn.execute(f"SELECT id, n, note, big FROM {made.name}")
        }
    got = {int(k): (int(r["n"]), r["note"], r.get("big")) for k, r in held.items()}
    assert got == wanted, sorted(set(got.items()) ^ set(wanted.items()))[:5]
