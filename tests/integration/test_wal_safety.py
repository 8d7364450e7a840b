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

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.components.postgres import Postgres
from cdc.settings import Settings
from tests.conftest import RunningStack
from tests.helpers import free_ports, run_cdc

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
