"""Where a pipeline's initial snapshot stands, kept beside the slot in the source database.

A snapshot is complete only when its row says `done`. An interrupted run leaves
`running`: with its consistent point recorded and CTID ranges written whole
(cdc.snapshot_ranges), the next `cdc snapshot` resumes it, else starts it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = [
    "ReadRange",
    "SnapshotState",
    "forget",
    "mark_done",
    "mark_point",
    "mark_running",
    "read_ranges",
    "read_state",
    "record_ranges",
    "resume_point",
]


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
        "lsn = NULL, snapshot_at = NULL, started_at = now(), finished_at = NULL, rows = NULL, "
        "snapshot_xmin = NULL",
        (pipeline, slot),
    )
    conn.execute("DELETE FROM cdc.snapshot_ranges WHERE pipeline = %s", (pipeline,))


def mark_point(
    conn: psycopg.Connection[Any], pipeline: str, lsn: str, ts_ms: int, xmin: int
) -> None:
    """The running snapshot's consistent point, its time, and its snapshot's xmin: what a
    run after a crash resumes from."""
    conn.execute(
        "UPDATE cdc.snapshots SET lsn = %s::pg_lsn, snapshot_at = to_timestamp(%s / 1000.0), "
        "snapshot_xmin = %s WHERE pipeline = %s",
        (lsn, ts_ms, xmin, pipeline),
    )


@dataclass(frozen=True)
class ReadRange:
    """Pages [first, end) (end None: to the table's end) of a table the snapshot wrote whole."""

    relid: int
    files: str
    first: int
    end: int | None


def record_ranges(conn: psycopg.Connection[Any], pipeline: str, ranges: list[ReadRange]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO cdc.snapshot_ranges (pipeline, relid, files, first_page, end_page) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(pipeline, r.relid, r.files, r.first, r.end) for r in ranges],
        )


def read_ranges(conn: psycopg.Connection[Any], pipeline: str) -> list[ReadRange]:
    made = conn.execute("SELECT to_regclass('cdc.snapshot_ranges')").fetchone()
    if not made or made[0] is None:  # a source set up before resumable snapshots
        return []
    found = conn.execute(
        "SELECT relid, files, first_page, end_page FROM cdc.snapshot_ranges "
        "WHERE pipeline = %s ORDER BY relid, first_page",
        (pipeline,),
    ).fetchall()
    return [ReadRange(int(r[0]), str(r[1]), int(r[2]), r[3]) for r in found]


def resume_point(conn: psycopg.Connection[Any], pipeline: str) -> tuple[int, int] | None:
    """The running snapshot's xmin and time (ms), once its point is recorded (mark_point)."""
    row = conn.execute(
        "SELECT snapshot_xmin, (extract(epoch FROM snapshot_at) * 1000)::bigint "
        "FROM cdc.snapshots WHERE pipeline = %s AND status = 'running' AND lsn IS NOT NULL "
        "AND snapshot_xmin IS NOT NULL",
        (pipeline,),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else None


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
    ranges = conn.execute("SELECT to_regclass('cdc.snapshot_ranges')").fetchone()
    if ranges and ranges[0]:  # a source set up before resumable snapshots has none
        conn.execute("DELETE FROM cdc.snapshot_ranges WHERE pipeline = %s", (pipeline,))
