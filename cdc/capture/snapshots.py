"""Where a pipeline's initial snapshot stands, kept beside the slot in the source database.

A snapshot is complete only when its row says `done`: an interrupted run leaves
`running`, which the next `cdc snapshot` sees and redoes from the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["SnapshotState", "forget", "mark_done", "mark_running", "read_state"]


@dataclass(frozen=True)
class SnapshotState:
    pipeline: str
    slot: str
    status: str
    lsn: str | None
    rows: int | None


def read_state(conn: psycopg.Connection[Any], pipeline: str) -> SnapshotState | None:
    row = conn.execute(
        "SELECT pipeline, slot, status, lsn::text, rows FROM cdc.snapshots WHERE pipeline = %s",
        (pipeline,),
    ).fetchone()
    return SnapshotState(*row) if row else None


def mark_running(conn: psycopg.Connection[Any], pipeline: str, slot: str) -> None:
    conn.execute(
        "INSERT INTO cdc.snapshots (pipeline, slot, status) VALUES (%s, %s, 'running') "
        "ON CONFLICT (pipeline) DO UPDATE SET slot = excluded.slot, status = 'running', "
        "lsn = NULL, snapshot_at = NULL, started_at = now(), finished_at = NULL, rows = NULL",
        (pipeline, slot),
    )


def mark_done(
    conn: psycopg.Connection[Any], pipeline: str, lsn: str, ts_ms: int, rows: int
) -> None:
    conn.execute(
        "UPDATE cdc.snapshots SET status = 'done', lsn = %s::pg_lsn, "
        "snapshot_at = to_timestamp(%s / 1000.0), finished_at = now(), rows = %s "
        "WHERE pipeline = %s",
        (lsn, ts_ms, rows, pipeline),
    )


def forget(conn: psycopg.Connection[Any], pipeline: str) -> None:
    conn.execute("DELETE FROM cdc.snapshots WHERE pipeline = %s", (pipeline,))
