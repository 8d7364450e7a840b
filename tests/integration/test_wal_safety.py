"""WAL safety: a slot that retains too much WAL is warned about, and one PostgreSQL
invalidated (past `max_slot_wal_keep_size`) is reported as failed with the re-snapshot.

The warning is tested on the stack's PostgreSQL with a slot of the test's own that
nothing reads. The invalidation needs a low `max_slot_wal_keep_size`, which the local
stack passes on PostgreSQL's command line (where ALTER SYSTEM cannot override it, and a
shared stack's slots must not be put at risk): the test starts a PostgreSQL of its own
with the project's component, the limit set low in its settings, and points `cdc status`
at it.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cdc.capture.connect_client import connect_client
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, end_offsets
from cdc.stack.components.postgres import Postgres
from tests.conftest import RunningStack
from tests.helpers import apply_process, free_ports, run_cdc
from tests.logcheck import pipeline_env, pipeline_for
from tests.stores import cache, search, warehouse

pytestmark = pytest.mark.integration

SEGMENT = 16 * 1024 * 1024  # PostgreSQL's default WAL segment
# the warning threshold: far above what a shared stack's background writes (autovacuum,
# heartbeats, checkpoints' full-page images) add in the seconds of a status call
WARN = 8 * 1024 * 1024


def slot_status(env: dict[str, str]) -> dict[str, Any]:
    result = run_cdc("status", "-o", "json", env=env)
    document = json.loads(result.stdout)
    pipeline = document["pipeline"]
    assert pipeline is not None, result.stderr
    assert pipeline["error"] is None, pipeline["error"]
    slot: dict[str, Any] = pipeline["slot"]
    return slot


def write_wal(conn: psycopg.Connection[Any], segments: int) -> None:
    """Move the WAL on by `segments` whole segments (a message, then a segment switch)."""
    for _ in range(segments):
        conn.execute("SELECT pg_logical_emit_message(false, 'cdc-test', repeat('x', 1000))")
        conn.execute("SELECT pg_switch_wal()")


def test_a_slot_retaining_more_wal_than_the_threshold_is_warned_about(
    stack: RunningStack,
) -> None:
    name = "w" + uuid.uuid4().hex[:10]
    slot = f"cdc_{name}"
    env = {
        **stack.env,
        "CDC_PIPELINE__NAME": name,
        "CDC_PIPELINE__WAL_RETAINED_WARN_BYTES": str(WARN),
    }
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            before = slot_status(env)
            assert before["health"] == "ok" and before["problem"] is None
            # 12 MiB of WAL the slot keeps (nothing reads it)
            # (transactional: its commit flushes the WAL, which pg_current_wal_lsn reports)
            conn.execute(
                "SELECT pg_logical_emit_message(true, 'cdc-test', repeat('x', %s))",
                (WARN * 3 // 2,),
            )
            retained = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
                "FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
            assert retained is not None and retained[0] > WARN

            after = slot_status(env)
            assert after["health"] == "warning"
            assert after["wal_retained_bytes"] >= retained[0]
            assert after["warn_bytes"] == WARN
            problem = after["problem"]
            assert f"slot {slot} retains" in problem
            assert "pipeline.wal_retained_warn_bytes (8.0 MiB)" in problem
            assert "fix the connector, or `cdc drop` an abandoned pipeline" in problem
            assert "\n" not in problem

            shown = run_cdc("status", env=env)
            assert shown.returncode == 0, shown.stderr  # a warning: the pipeline still streams
            text = shown.stdout
            assert "fix the connector, or `cdc drop` an abandoned pipeline" in " ".join(
                text.split()
            )
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


@pytest.fixture
def limited_postgres(stack: RunningStack) -> Iterator[Settings]:
    """A PostgreSQL of the test's own, started by the project's component with
    `postgres.max_slot_wal_keep_size` = 1MB; stopped and removed at the end."""
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-wal-"))
    data_dir.chmod(0o755)  # the service user runs PostgreSQL when the tests run as root
    (port,) = free_ports(1)
    settings = stack.settings.model_copy(
        update={
            "data_dir": data_dir,
            "postgres": stack.settings.postgres.model_copy(
                update={"port": port, "max_slot_wal_keep_size": "1MB"}
            ),
        }
    )
    postgres = Postgres(settings)
    try:
        postgres.start()
        yield settings
    finally:
        postgres.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_slot_invalidated_by_max_slot_wal_keep_size_is_reported_lost(
    stack: RunningStack, limited_postgres: Settings
) -> None:
    name = "l" + uuid.uuid4().hex[:10]
    slot = f"cdc_{name}"
    with psycopg.connect(limited_postgres.postgres.dsn(), autocommit=True) as conn:
        setting = conn.execute("SHOW max_slot_wal_keep_size").fetchone()
        assert setting is not None and setting[0] == "1MB"  # the component passed it on
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        write_wal(conn, 4)  # far past 1MB
        conn.execute("CHECKPOINT")  # a checkpoint invalidates the slot
        found = conn.execute(
            "SELECT wal_status, restart_lsn FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        assert found == ("lost", None)

    env = {
        **stack.env,
        "CDC_POSTGRES__PORT": str(limited_postgres.postgres.port),
        "CDC_PIPELINE__NAME": name,
    }
    status = slot_status(env)
    assert status["health"] == "failed"
    assert status["wal_status"] == "lost"
    problem = status["problem"]
    assert f"slot {slot} is lost" in problem
    assert "more WAL than max_slot_wal_keep_size (1MB)" in problem
    assert "take a new snapshot: `cdc drop`, then `cdc snapshot`" in problem
    assert "\n" not in problem

    shown = run_cdc("status", env=env)
    assert shown.returncode == 1, shown.stderr  # broken: a monitor's check fails
    text = " ".join(shown.stdout.split())
    assert "lost" in text and "`cdc drop`, then `cdc snapshot`" in text


def test_snapshot_does_not_restart_streaming_on_a_lost_slot(
    stack: RunningStack, limited_postgres: Settings
) -> None:
    """The pipeline's connector was deleted by hand and its slot then invalidated:
    `cdc snapshot` (which restarts the connector of a complete snapshot) refuses in one
    line with the re-snapshot instead of streaming from a slot whose changes are gone."""
    name = "s" + uuid.uuid4().hex[:10]
    # the stack's settings (its Connect and secrets) with the limited PostgreSQL
    source = stack.settings.model_copy(update={"postgres": limited_postgres.postgres})
    settings = pipeline_for(source, [f"public.{name}"])
    pipe = settings.pipeline
    connect = connect_client(settings)
    try:
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY)")
            conn.execute(f"INSERT INTO {name} SELECT generate_series(1, 10)")
        run_snapshot(settings, Console(file=io.StringIO()))
        connect.delete(pipe.connector)
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (pipe.slot,)
            ).fetchone() != (False,):
                assert time.monotonic() < deadline, "the deleted connector still reads"
                time.sleep(0.5)
            write_wal(conn, 4)
            conn.execute("CHECKPOINT")
            lost = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (pipe.slot,)
            ).fetchone()
            assert lost == ("lost",)

        env = {**stack.env, "CDC_POSTGRES__PORT": str(settings.postgres.port)}
        again = run_cdc("snapshot", env=pipeline_env(env, settings))
        assert again.returncode != 0
        assert f"slot {pipe.slot} of pipeline {pipe.name} is lost" in again.stderr
        assert "take a new snapshot: `cdc drop`, then `cdc snapshot`" in again.stderr
        assert "Traceback" not in again.stderr
        assert pipe.connector not in connect.connectors()
    finally:
        drop_pipeline(settings)


def _notes(settings: Settings, table: str, applied: list[str]) -> dict[str, dict[int, str]]:
    """Each store's rows as id -> note, read by the test's own readers."""
    readers = {"cache": cache, "search": search, "warehouse": warehouse}
    return {
        store: {int(k): str(row.get("note")) for k, row in readers[store](settings, table).items()}
        for store in applied
    }


@pytest.mark.parametrize(
    "applied",
    [
        pytest.param(["cache", "search"], id="cache-search"),
        pytest.param(["cache", "search", "warehouse"], id="every-store", marks=pytest.mark.long),
    ],
)
def test_resync_after_a_lost_slot_mends_only_the_gap_in_every_store(
    stack: RunningStack, limited_postgres: Settings, applied: list[str]
) -> None:
    """The slot is lost with changes in its gap (inserts, updates, deletes the log never
    got): `cdc resync` makes a new slot, streams from it without a new snapshot, and
    mends the gap from the source; every store then equals the source, the changes after
    the resync included, and the topic holds no second snapshot of the table."""
    name = "r" + uuid.uuid4().hex[:10]
    source = stack.settings.model_copy(update={"postgres": limited_postgres.postgres})
    settings = pipeline_for(source, [f"public.{name}"])
    pipe, table = settings.pipeline, f"public.{name}"
    env = pipeline_env({**stack.env, "CDC_POSTGRES__PORT": str(settings.postgres.port)}, settings)
    dsn = settings.postgres.dsn()

    def source_notes() -> dict[int, str]:
        with psycopg.connect(dsn) as conn:
            return dict(conn.execute(f"SELECT id, note FROM {name}").fetchall())

    def every_store_equals_the_source(timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            wanted = source_notes()
            try:
                held = _notes(settings, table, applied)
            except Exception as exc:  # a store's first batch has not made its table yet
                assert time.monotonic() < deadline, exc
                time.sleep(2)
                continue
            if all(rows == wanted for rows in held.values()):
                return
            assert time.monotonic() < deadline, {
                s: sorted(set(rows.items()) ^ set(wanted.items()))[:5] for s, rows in held.items()
            }
            time.sleep(2)

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, note text)")
            conn.execute(f"INSERT INTO {name} SELECT i, 'v0' FROM generate_series(1, 300) i")
        run_snapshot(settings, Console(file=io.StringIO()))
        env["CDC_APPLY__STORES"] = json.dumps(applied)  # what `cdc resync` verifies
        with apply_process(env, applied):
            every_store_equals_the_source(240)
            snapshot_records = sum(
                end_offsets(settings.kafka, [change_topic(pipe, table)])[
                    change_topic(pipe, table)
                ].values()
            )
            connect_client(settings).stop(pipe.connector)
            connect_client(settings).wait_stopped(pipe.connector)
            with psycopg.connect(dsn, autocommit=True) as conn:
                # the gap: changes the log never gets
                conn.execute(f"UPDATE {name} SET note = 'gap' WHERE id <= 40")
                conn.execute(f"DELETE FROM {name} WHERE id > 280")
                conn.execute(f"INSERT INTO {name} SELECT i, 'new' FROM generate_series(301, 320) i")
                deadline = time.monotonic() + 60
                while conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (pipe.slot,)
                ).fetchone() != (False,):
                    assert time.monotonic() < deadline, "the stopped connector still reads"
                    time.sleep(0.5)
                write_wal(conn, 4)
                conn.execute("CHECKPOINT")
                lost = conn.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                    (pipe.slot,),
                ).fetchone()
                assert lost == ("lost",)
            assert "`cdc resync`" in slot_status(env)["problem"]

            resynced = run_cdc("resync", "--timeout", "300", env=env, timeout=900)
            assert resynced.returncode == 0, resynced.stdout[-2000:] + resynced.stderr[-2000:]
            assert "Traceback" not in resynced.stderr
            with psycopg.connect(dsn, autocommit=True) as conn:  # after it: streamed
                conn.execute(f"UPDATE {name} SET note = 'after' WHERE id BETWEEN 100 AND 109")
            every_store_equals_the_source(240)
            assert slot_status(env)["health"] == "ok"
            # only the gap's keys went through the log again, not the table
            records = sum(
                end_offsets(settings.kafka, [change_topic(pipe, table)])[
                    change_topic(pipe, table)
                ].values()
            )
            assert records - snapshot_records < 300, records - snapshot_records
        # a resync of a slot that is not lost is refused in one line
        again = run_cdc("resync", env=env)
        assert again.returncode != 0 and "is not lost" in again.stderr
        assert "Traceback" not in again.stderr
    finally:
        drop_pipeline(settings)
