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

from cdc.capture.connect import connect_client
from cdc.capture.pipeline import drop_pipeline
from cdc.settings import Settings
from cdc.stack.components.postgres import Postgres
from snapshot.initial import run_snapshot
from tests.conftest import RunningStack
from tests.helpers import free_ports, run_cdc
from tests.logcheck import pipeline_env, pipeline_for

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
