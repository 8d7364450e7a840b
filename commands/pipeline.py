"""Operations on a whole pipeline: its state for `cdc status`, and dropping it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cdc.catalog import published_tables
from cdc.connect import ConnectClient
from cdc.errors import CdcError
from cdc.settings import Settings
from cdc.source import admin_connection, drop_publication
from cdc.topics import change_topic, dead_letter_topic, end_offsets, pipeline_topic_specs
from materializers.progress import late_events, read_progress
from snapshot.slot import drop_slot
from snapshot.state import forget, read_state

__all__ = ["PipelineStatus", "SyncResult", "drop_pipeline", "pipeline_status", "sync_pipeline"]


@dataclass
class PipelineStatus:
    name: str
    snapshot: str  # none, running (interrupted or under way), done
    snapshot_lsn: str | None
    slot: dict[str, Any] | None  # active, wal_retained_bytes, confirmed_flush_lsn
    connector: dict[str, Any] | None  # state, tasks, trace of a failed task
    topics: dict[str, int] = field(default_factory=dict)  # end offset summed over partitions
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)  # per store: backlog, lag
    dead_letters: int = 0
    late_events: dict[str, int] = field(default_factory=dict)  # per window aggregate
    error: str | None = None


def pipeline_status(settings: Settings, tables: list[str] | None = None) -> PipelineStatus:
    pipe = settings.pipeline
    status = PipelineStatus(pipe.name, "none", None, None, None)
    try:
        with admin_connection(settings) as conn:
            has_state = conn.execute("SELECT to_regclass('cdc.snapshots') IS NOT NULL").fetchone()
            state = read_state(conn, pipe.name) if has_state and has_state[0] else None
            if state:
                status.snapshot, status.snapshot_lsn = state.status, state.lsn
            row = conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                "confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (pipe.slot,),
            ).fetchone()
            if row:
                status.slot = {
                    "name": pipe.slot,
                    "active": row[0],
                    "wal_retained_bytes": row[1],
                    "confirmed_flush_lsn": row[2],
                    "wal_status": row[3],
                }
            if tables is None:
                tables = published_tables(conn, pipe.publication)
        connectors = ConnectClient(settings.connect.url).connectors()
        entry = connectors.get(pipe.connector, {}).get("status")
        if entry:
            status.connector = {
                "name": pipe.connector,
                "state": entry["connector"]["state"],
                "tasks": [t["state"] for t in entry.get("tasks", [])],
            }
            failed = [t for t in entry.get("tasks", []) if t.get("state") == "FAILED"]
            if failed:
                from cdc.connect import summarize_trace

                status.connector["error"] = summarize_trace(failed[0].get("trace", ""))
        if tables:
            topics = [change_topic(pipe, t) for t in tables]
            ends = end_offsets(settings.kafka.bootstrap_servers, [*topics, dead_letter_topic(pipe)])
            dlq = ends.pop(dead_letter_topic(pipe), {})
            status.dead_letters = sum(dlq.values())
            status.topics = {t: sum(parts.values()) for t, parts in ends.items()}
            status.stores = _store_progress(settings, ends)
            status.late_events = _late_events(settings)
    except CdcError as exc:
        status.error = str(exc)
    return status


@dataclass
class SyncResult:
    tables: list[str]
    added: list[str]
    removed: list[str]
    topics_created: list[str]
    backfills: list[str]  # tables whose backfill was requested


def _published(settings: Settings) -> list[str]:
    with admin_connection(settings) as conn:
        return published_tables(conn, settings.pipeline.publication)


def sync_pipeline(settings: Settings) -> SyncResult:
    """Make the source, topics and connector match the settings' tables (idempotent).

    On a streaming pipeline, a table that is new to it is captured from now on and
    backfilled (Debezium incremental snapshot); a table no longer selected stops being
    captured (its topic stays, as a copy of what was).
    """
    from cdc.capture import register_connector
    from cdc.source import prepare_source
    from cdc.topics import ensure_topics
    from snapshot.backfill import start_backfill

    before = _published(settings)
    tables = prepare_source(settings)
    names = [t.qualified for t in tables]
    created = ensure_topics(
        settings.kafka.bootstrap_servers,
        pipeline_topic_specs(settings.pipeline, [t.qualified for t in tables]),
    )
    added = [t for t in names if before and t not in before]
    removed = [t for t in before if t not in names]
    backfills = []
    if pipe_streams(settings) and (added or removed):
        register_connector(settings, tables)
        for table in added:
            start_backfill(settings, table)
            backfills.append(table)
    return SyncResult(names, added, removed, created, backfills)


def pipe_streams(settings: Settings) -> bool:
    return settings.pipeline.connector in ConnectClient(settings.connect.url).connectors()


def _store_progress(
    settings: Settings, ends: dict[str, dict[int, int]]
) -> dict[str, dict[str, Any]]:
    """Per store: the events it has still to apply, and how far behind the source it is."""

    stores: dict[str, dict[str, Any]] = {}
    now_ms = time.time() * 1000
    for store in settings.apply.stores:
        progress = read_progress(settings, store)
        if progress is None:
            continue
        backlog = progress.backlog(ends)
        commit_ms = progress.commit_ms
        if commit_ms is None:
            lag = None
        elif backlog:
            lag = (now_ms - commit_ms) / 1000  # at least this far behind
        else:
            lag = ((progress.applied_ms or now_ms) - commit_ms) / 1000  # the last batch's
        stores[store] = {
            "backlog_events": backlog,
            "lag_s": round(lag, 3) if lag is not None else None,
            "applied_at_ms": progress.applied_ms,
            # the store did not answer: its batch waits, uncommitted (reason, since_ms)
            "waiting": progress.waiting,
        }
    return stores


def _late_events(settings: Settings) -> dict[str, int]:
    """Per window aggregate: the events that came after its watermark (not counted)."""
    late = {}
    for window in settings.apply.windows:
        counted = late_events(settings, window.name)
        if counted is not None:
            late[window.name] = counted
    return late


def drop_pipeline(settings: Settings) -> list[str]:
    """Remove the connector, its offsets, the slot and the publication; the topics stay.
    Returns what went.

    Connect keeps a deleted connector's offsets under its name, and a connector created
    with that name later would resume from them, before its own slot: they are removed
    first (the connector stopped, its offsets reset). The next snapshot sets the offset of
    its connector in any case (a generation starts at its slot's consistent point).
    """
    pipe = settings.pipeline
    gone = []
    client = ConnectClient(settings.connect.url)
    if pipe.connector in client.connectors():
        client.stop(pipe.connector)
        client.wait_stopped(pipe.connector)
        client.reset_offsets(pipe.connector)
        client.delete(pipe.connector)
        gone.append(f"connector {pipe.connector} and its offsets")
        time.sleep(0.5)
    with admin_connection(settings) as conn:
        conn.autocommit = True
        if drop_slot(conn, pipe.slot):
            gone.append(f"slot {pipe.slot}")
        if conn.execute("SELECT to_regclass('cdc.snapshots') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
            forget(conn, pipe.name)
    if drop_publication(settings):
        gone.append(f"publication {pipe.publication}")
    return gone
