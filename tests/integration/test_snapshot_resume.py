"""A snapshot that survives a crash (issue 48 item 3): `cdc snapshot` killed (SIGKILL,
its Spark driver with it) after it had written some of its CTID ranges; the table then
changes: rows deleted, inserted, and updated, some moved by their UPDATE into pages
the first run had already written, a toasted value among them left unchanged (its
UPDATE event carries Debezium's placeholder). `cdc snapshot` again resumes: it
streams from the slot's consistent point and backfills only what the first run had
not written. The log then equals the table, and so does the cache (read with
redis-py), while fewer rows went through the log again than the table holds.

A table dropped and created again between the crash and the rerun is cut in every store
before its backfill: none of the old relation's rows the first run wrote stays. A table
rewritten (VACUUM FULL) between the crash and the rerun, or while an uninterrupted
snapshot copies it, loses no row: the rerun sees its new files, the copy sees them after
its next group of ranges, and the table is backfilled whole as a resumed snapshot does.
Every store is read with the tests' own readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.core.topics import change_topic, end_offsets
from tests.conftest import Capture, Captured
from tests.helpers import ROOT, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.stores import cache, stores

pytestmark = pytest.mark.integration

ROWS = 200_000
PAGES_PER_READER = 60  # about 25 ranges of this table, a few per Spark job
STORES = ["cache", "search", "warehouse"]


def _ranges(dsn: str, pipeline: str) -> int:
    with psycopg.connect(dsn) as conn:
        made = conn.execute("SELECT to_regclass('cdc.snapshot_ranges')").fetchone()
        if not made or made[0] is None:  # the snapshot has not set up the source yet
            return 0
        row = conn.execute(
            "SELECT count(*) FROM cdc.snapshot_ranges WHERE pipeline = %s", (pipeline,)
        ).fetchone()
    return int(row[0]) if row else 0


def _start_snapshot(env: dict[str, str], out: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """`cdc snapshot` in a session of its own (its Spark JVM with it), its output to `out`."""
    return subprocess.Popen(
        [sys.executable, "-m", "cdc", "snapshot"],
        env={**os.environ, **env},
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
    )


def _wait_for_a_range(made: Captured, snapshot: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while _ranges(made.dsn, made.settings.pipeline.name) == 0:
        assert snapshot.poll() is None, "the snapshot ended before it wrote a range"
        assert time.monotonic() < deadline, "the snapshot never recorded a range"
        time.sleep(0.1)


def _kill_after_a_range(made: Captured, env: dict[str, str]) -> int:
    """Start `cdc snapshot`, SIGKILL it (the driver and its Spark JVM) once it has
    recorded a range; returns how many it had recorded."""
    first = _start_snapshot(env)
    try:
        _wait_for_a_range(made, first)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    return _ranges(made.dsn, made.settings.pipeline.name)


def _every_store_equals(made: Captured, wanted: dict[int, str], timeout: float = 240) -> None:
    """Apply until every store holds exactly `wanted` (id -> v), read with the tests' own
    readers; fail with what each store holds that it should not, or lacks."""
    deadline = time.monotonic() + timeout
    while True:
        run_apply(made.settings, STORES, once=True)
        held = {
            store: {int(k): str(r["v"]) for k, r in rows.items()}
            for store, rows in stores(made.settings, made.table).items()
        }
        if all(rows == wanted for rows in held.values()) or time.monotonic() > deadline:
            break
        time.sleep(2)
    for store, rows in held.items():
        extra, missing = sorted(set(rows) - set(wanted)), sorted(set(wanted) - set(rows))
        wrong = sorted(k for k in set(rows) & set(wanted) if rows[k] != wanted[k])
        assert not (extra or missing or wrong), (
            f"{store}: {len(extra)} extra {extra[:5]}, {len(missing)} missing {missing[:5]}, "
            f"{len(wrong)} different {wrong[:5]}"
        )


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
    recorded = _kill_after_a_range(made, env)
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
    # what no transaction changed since is read by Spark before the connector streams;
    # the row versions written since (moved, new) by Debezium's incremental snapshot
    assert "reading the rest of 1 table(s), then streaming" in again.stderr
    assert f"backfilling 1 table(s): {made.table}" in again.stderr
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


@pytest.mark.long
def test_a_table_created_again_before_the_resume_leaves_no_row_of_the_old_one(
    captured: Capture,
) -> None:
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        f"INSERT INTO {{name}} SELECT g, 'x' FROM generate_series(1, {ROWS}) g",
        "ANALYZE {name}",
        prefix="again",
        snapshot=False,
        snapshot_pages_per_reader=PAGES_PER_READER,
    )
    env = {**made.env, "CDC_PIPELINE__SNAPSHOT_PAGES_PER_READER": str(PAGES_PER_READER)}
    assert _kill_after_a_range(made, env) > 0
    # a migration between the crash and the rerun: the same name, another relation
    with psycopg.connect(made.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {made.name}")
        conn.execute(f"CREATE TABLE {made.name} (id int PRIMARY KEY, v text)")
        conn.execute(
            f"INSERT INTO {made.name} SELECT g, 'y' FROM generate_series(150001, 160000) g"
        )

    again = run_cdc("snapshot", "--output", "json", env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming the snapshot at LSN" in again.stderr
    _every_store_equals(made, {i: "y" for i in range(150001, 160001)})


SPARSE_ROWS, SPARSE_PAGES_PER_READER = 60_000, 20  # about 90 ranges of the sparse table


def _sparse_table(captured: Capture, prefix: str) -> tuple[Captured, dict[str, str]]:
    """A table with dead space in every page (a third of its rows deleted, no VACUUM):
    VACUUM FULL moves the rows of late pages into early ones. Returns it, and the
    environment that snapshots it in small ranges."""
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        f"INSERT INTO {{name}} SELECT g, repeat('x', 200) FROM generate_series(1, {SPARSE_ROWS}) g",
        "DELETE FROM {name} WHERE id % 3 = 0",
        "ANALYZE {name}",
        prefix=prefix,
        snapshot=False,
        snapshot_pages_per_reader=SPARSE_PAGES_PER_READER,
    )
    pages = str(SPARSE_PAGES_PER_READER)
    return made, {**made.env, "CDC_PIPELINE__SNAPSHOT_PAGES_PER_READER": pages}


def _source(made: Captured) -> dict[int, str]:
    with psycopg.connect(made.dsn) as conn:
        return {int(i): str(v) for i, v in conn.execute(f"SELECT id, v FROM {made.name}")}


@pytest.mark.long
def test_a_table_rewritten_between_the_crash_and_the_rerun_loses_no_row(
    captured: Capture,
) -> None:
    made, env = _sparse_table(captured, "vacuumed")
    assert _kill_after_a_range(made, env) > 0
    with psycopg.connect(made.dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM FULL {made.name}")  # rows of unread pages move into read ones

    again = run_cdc("snapshot", "--output", "json", env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "resuming the snapshot at LSN" in again.stderr
    wanted = _source(made)
    assert len(wanted) == SPARSE_ROWS - SPARSE_ROWS // 3
    _every_store_equals(made, wanted)


def test_a_table_rewritten_during_the_copy_loses_no_row(captured: Capture, tmp_path: Any) -> None:
    made, env = _sparse_table(captured, "rewritten")
    with psycopg.connect(made.dsn) as conn:
        found = conn.execute(
            "SELECT relpages FROM pg_class WHERE oid = %s::regclass", (made.table,)
        ).fetchone()
    assert found is not None
    ranges = -(-int(found[0]) // SPARSE_PAGES_PER_READER)
    log = tmp_path / "snapshot.log"
    out = log.open("wb")
    snapshot = _start_snapshot(env, out)
    try:
        _wait_for_a_range(made, snapshot)
        with psycopg.connect(made.dsn, autocommit=True) as conn:
            # it takes its lock between two groups of ranges (the readers hold theirs)
            conn.execute(f"VACUUM FULL {made.name}")
        read = _ranges(made.dsn, made.settings.pipeline.name)
        # the rewrite came before the copy's second half: later groups read its pages
        assert read < ranges // 2, (read, ranges)
        assert snapshot.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if snapshot.poll() is None:
            os.killpg(snapshot.pid, signal.SIGKILL)
            snapshot.wait(timeout=30)
        out.close()
    wanted = _source(made)
    assert len(wanted) == SPARSE_ROWS - SPARSE_ROWS // 3
    _every_store_equals(made, wanted)
