"""Operations on a whole pipeline: its state for `cdc status`, and dropping it."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from psycopg import sql

from cdc.capture.connect import connect_client
from cdc.capture.role import drop_role, other_pipelines, sync_grants
from cdc.capture.slot import drop_slot
from cdc.capture.source import admin_connection, drop_publication
from cdc.catalog import describe_table, published_tables, selected_tables
from cdc.errors import CdcError, SourceError
from cdc.identity import current_relations, drift, recorded, recorded_since
from cdc.settings import Settings
from cdc.topics import (
    change_times,
    change_topic,
    change_topic_spec,
    dead_letter_topic,
    end_offsets,
    pipeline_topic_specs,
    set_topic_configs,
    written_since,
)
from materializers.log.progress import late_events, read_progress
from materializers.views.registry import streaming, views_of
from snapshot.state import forget, read_state

__all__ = [
    "RESNAPSHOT",
    "WAL_ADVICE",
    "PipelineStatus",
    "SyncResult",
    "drop_pipeline",
    "pipeline_status",
    "slot_health",
    "sync_pipeline",
    "wal_size",
]

# what brings back a pipeline whose slot PostgreSQL invalidated: a new generation
RESNAPSHOT = "take a new snapshot: `cdc drop`, then `cdc snapshot`"
# what to do about a slot that retains too much WAL
WAL_ADVICE = "fix the connector, or `cdc drop` an abandoned pipeline"


@dataclass
class PipelineStatus:
    name: str
    snapshot: str  # none, running (interrupted or under way), done
    snapshot_lsn: str | None
    # active, wal_retained_bytes, confirmed_flush_lsn, wal_status, safe_wal_size, ...;
    # health: ok, warning (retains too much WAL) or failed (lost); problem: what to do
    slot: dict[str, Any] | None
    connector: dict[str, Any] | None  # state, tasks, trace of a failed task
    topics: dict[str, int] = field(default_factory=dict)  # end offset summed over partitions
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)  # per store: backlog, lag
    dead_letters: int = 0
    late_events: dict[str, int] = field(default_factory=dict)  # per window aggregate
    # apply.iceberg: the warehouse's tables, and those whose Iceberg table lags its Delta
    # table: {"tables": n, "behind": {folder: [Delta version, Iceberg's or None]}}
    iceberg: dict[str, Any] | None = None
    # a captured table renamed, dropped, or selected and not captured: what to run
    tables_drift: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def breached(self) -> dict[str, str]:
        """The stores whose freshness breaches their SLO, and why (`cdc status` exits 1)."""
        return {
            store: figures["freshness"]["why"]
            for store, figures in self.stores.items()
            if (figures.get("freshness") or {}).get("breached")
        }

    @property
    def broken(self) -> bool:
        """The pipeline cannot stream without someone acting: its slot is lost, or its
        connector or a task failed (`cdc status` exits 1; a warning does not)."""
        if self.slot is not None and self.slot.get("health") == "failed":
            return True
        if self.tables_drift:
            return True
        connector = self.connector or {}
        return connector.get("state") == "FAILED" or "FAILED" in connector.get("tasks", [])


def pipeline_status(settings: Settings, tables: list[str] | None = None) -> PipelineStatus:
    pipe = settings.pipeline
    status = PipelineStatus(pipe.name, "none", None, None, None)
    try:
        with admin_connection(settings) as conn:
            has_state = conn.execute("SELECT to_regclass('cdc.snapshots') IS NOT NULL").fetchone()
            state = read_state(conn, pipe.name) if has_state and has_state[0] else None
            if state:
                status.snapshot, status.snapshot_lsn = state.status, state.lsn
            status.slot = _slot(conn, pipe.slot, pipe.wal_retained_warn_bytes)
            published = published_tables(conn, pipe.publication)
            found = drift(conn, pipe.name, published, selected_tables(conn, pipe))
            since = recorded_since(conn, pipe.name)
            if tables is None:
                tables = published
        if since is not None:
            written = written_since(settings.kafka, pipe, since, set(published))
            prefix = len(pipe.topic_prefix) + 1
            found = replace(found, strays=[(t, t[prefix:]) for t in written])
        if published or state:
            status.tables_drift = found.problems(lambda name: change_topic(pipe, name))
            status.tables_drift += _choice_problems(settings, published)
        connectors = connect_client(settings).connectors()
        entry = connectors.get(pipe.connector, {}).get("status")
        if entry:
            status.connector = {
                "name": pipe.connector,
                "state": entry["connector"]["state"],
                "tasks": [t["state"] for t in entry.get("tasks", [])],
            }
            failed = [t for t in entry.get("tasks", []) if t.get("state") == "FAILED"]
            if failed:
                from cdc.capture.connect import summarize_trace, too_large

                trace = failed[0].get("trace", "")
                status.connector["error"] = too_large(
                    trace, settings.kafka.max_message_bytes
                ) or summarize_trace(trace)
        if tables:
            topics = [change_topic(pipe, t) for t in tables]
            ends = end_offsets(settings.kafka, [*topics, dead_letter_topic(pipe)])
            dlq = ends.pop(dead_letter_topic(pipe), {})
            status.dead_letters = sum(dlq.values())
            status.topics = {t: sum(parts.values()) for t, parts in ends.items()}
            status.stores = _store_progress(settings, ends)
            status.late_events = _late_events(settings)
        if settings.apply.iceberg:
            status.iceberg = _iceberg_status(settings)
    except CdcError as exc:
        status.error = str(exc)
    return status


def _iceberg_status(settings: Settings) -> dict[str, Any]:
    """apply.iceberg: how many warehouse tables there are, and which Iceberg lags."""
    from materializers.stores.warehouse.iceberg import IcebergPublisher
    from materializers.stores.warehouse.tables import warehouse_base, warehouse_root

    root = warehouse_root(settings)
    try:
        publisher = IcebergPublisher(warehouse_base(settings), root)
        behind = {
            path.removeprefix(root).lstrip("/"): list(versions)
            for path, versions in publisher.behind().items()
        }
    except Exception as exc:  # the catalog unreadable (locked, corrupt): said, not raised
        line = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return {"tables": 0, "behind": {}, "error": line}
    return {"tables": len(publisher.tables()), "behind": behind}


def _choice_problems(settings: Settings, published: list[str]) -> list[str]:
    """What pipeline.table chooses that the capture does not do yet: columns added since
    `cdc setup` named the publication's columns, or a choice the table no longer fits."""
    pipe, lines = settings.pipeline, []
    with admin_connection(settings) as conn:
        for name in published:
            if name not in pipe.table:
                continue
            try:
                pending = describe_table(conn, name, pipe).pending
            except SourceError as exc:
                lines.append(f"{exc}; then run `cdc setup`")
                continue
            if pending:
                lines.append(
                    f"table {name}: its column(s) {', '.join(pending)}, added since the "
                    "setup, are not captured yet (the publication names its columns): run "
                    "`cdc setup` (it captures and backfills them)"
                )
    return lines


def _slot(conn: Any, slot: str, warn_bytes: int) -> dict[str, Any] | None:
    """The slot as `cdc status` shows it, with its health; None if there is no slot.

    The row goes through to_jsonb, so columns of newer servers (`conflicting` from
    PostgreSQL 16, `invalidation_reason` from 17) come when the server has them."""
    row = conn.execute(
        "SELECT to_jsonb(s) || jsonb_build_object("
        "'wal_retained_bytes', pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, "
        "'max_slot_wal_keep_size', current_setting('max_slot_wal_keep_size')) "
        "FROM pg_replication_slots s WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    found: dict[str, Any] = row[0]
    info = {
        "name": slot,
        "active": found.get("active"),
        "wal_retained_bytes": found.get("wal_retained_bytes"),
        "confirmed_flush_lsn": found.get("confirmed_flush_lsn"),
        "wal_status": found.get("wal_status"),
        "safe_wal_size": found.get("safe_wal_size"),
        "max_slot_wal_keep_size": found.get("max_slot_wal_keep_size"),
        "invalidation_reason": found.get("invalidation_reason"),
        "conflicting": found.get("conflicting"),
        "warn_bytes": warn_bytes,
    }
    info["health"], info["problem"] = slot_health(info, warn_bytes)
    return info


def wal_size(n: float) -> str:
    """A size of WAL for people: 512 B, 3.0 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_INVALIDATED = {
    "wal_removed": "it retained more WAL than max_slot_wal_keep_size{limit}",
    "rows_removed": "rows it needed were removed (a conflict on a standby)",
    "wal_level_insufficient": "wal_level is no longer logical",
    "idle_timeout": "it was idle longer than idle_replication_slot_timeout",
}


def slot_health(slot: Mapping[str, Any], warn_bytes: int) -> tuple[str, str | None]:
    """("ok", None), ("warning", what to do) or ("failed", what to do) for a slot row.

    Failed: PostgreSQL invalidated the slot (`wal_status` lost; `invalidation_reason` on
    PostgreSQL 17+; `conflicting` on 16+): the changes it kept are gone, only a new
    snapshot brings the pipeline back. Warning: it retains more WAL than `warn_bytes`
    (0: never), or its WAL is no longer reserved (lost at the next checkpoint)."""
    name = slot.get("name", "?")
    keep = slot.get("max_slot_wal_keep_size")
    limit = f" ({keep})" if keep not in (None, "-1") else ""
    reason = slot.get("invalidation_reason")
    if slot.get("wal_status") == "lost" or reason or slot.get("conflicting"):
        if reason is None and slot.get("conflicting"):
            reason = "rows_removed"
        why = _INVALIDATED.get(reason or "wal_removed", f"invalidation reason {reason}")
        since = slot.get("confirmed_flush_lsn")
        return "failed", (
            f"slot {name} is lost: PostgreSQL invalidated it ({why.format(limit=limit)}); "
            f"the changes after {since or 'its last confirmed position'} are gone and the "
            f"connector cannot stream; {RESNAPSHOT}"
        )
    retained = slot.get("wal_retained_bytes")
    safe = slot.get("safe_wal_size")
    if slot.get("wal_status") == "unreserved":
        return "warning", (
            f"slot {name} retains WAL past max_slot_wal_keep_size{limit}: PostgreSQL "
            "invalidates it at the next checkpoint unless the connector catches up; " + WAL_ADVICE
        )
    if warn_bytes > 0 and retained is not None and retained > warn_bytes:
        if safe is not None:
            at_risk = f"; PostgreSQL invalidates the slot after {wal_size(max(safe, 0))} more"
        elif keep == "-1":
            at_risk = ", and nothing limits it (max_slot_wal_keep_size -1): the disk can fill"
        else:
            at_risk = ""
        return "warning", (
            f"slot {name} retains {wal_size(retained)} of WAL, more than "
            f"pipeline.wal_retained_warn_bytes ({wal_size(warn_bytes)}){at_risk}; " + WAL_ADVICE
        )
    return "ok", None


@dataclass
class SyncResult:
    tables: list[str]
    added: list[str]
    removed: list[str]
    topics_created: list[str]
    backfills: list[str]  # tables whose backfill was requested
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (captured as, now)
    recreated: list[str] = field(default_factory=list)  # dropped and created again


def _captured_before(settings: Settings) -> dict[int, str]:
    """The relations the pipeline captured (OID -> name), as recorded, or for a pipeline
    set up before they were recorded, as its publication holds them now."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        has = recorded(conn, pipe.name)
        if has is not None:
            return has
        return current_relations(conn, published_tables(conn, pipe.publication))


def sync_pipeline(settings: Settings) -> SyncResult:
    """Make the source, topics and connector match the settings' tables (idempotent).

    On a streaming pipeline, a table that is new to it is captured from now on and
    backfilled (Debezium incremental snapshot); a table no longer selected stops being
    captured (its topic stays, as a copy of what was). A captured table renamed since is
    a new table under its new name (backfilled; the stores keep what they hold under
    the old one). A table dropped and created again under a captured name is cut first,
    as a TRUNCATE would be (every store drops the old table's rows), then backfilled.
    """
    from cdc.capture.backfill import start_backfill
    from cdc.capture.connector import register_connector
    from cdc.capture.source import prepare_source
    from cdc.catalog import TRUNCATIONS_TABLE
    from cdc.topics import ensure_topics

    before = _captured_before(settings)
    tables = prepare_source(settings)
    names = [t.qualified for t in tables]
    with admin_connection(settings) as conn:
        now = current_relations(conn, names)
    created = ensure_topics(
        settings.kafka,
        pipeline_topic_specs(settings.pipeline, [t.qualified for t in tables]),
    )
    renamed = sorted(
        (before[oid], name) for oid, name in now.items() if before.get(oid, name) != name
    )
    recreated = sorted(
        name for oid, name in now.items() if oid not in before and name in before.values()
    )
    oids = {name: oid for oid, name in now.items()}
    added = [t for t in names if before and before.get(oids.get(t, -1)) != t]
    removed = [t for t in before.values() if t not in names]
    # a renamed table's topic, made by Kafka Connect uncompacted (cdc/capture/connector.py)
    set_topic_configs(settings.kafka, [change_topic_spec(settings.pipeline, n) for _, n in renamed])
    backfills = []
    streams = pipe_streams(settings)
    if streams and (added or removed) and recreated:
        # the old table's rows leave every store at this point, before the backfill
        with admin_connection(settings) as conn:
            for name in recreated:
                conn.execute(
                    sql.SQL("INSERT INTO {} (table_name) VALUES (%s)").format(
                        sql.Identifier(*TRUNCATIONS_TABLE.split("."))
                    ),
                    (name,),
                )
            conn.commit()
    if streams:  # its tables, or another setting (kafka.max_message_bytes…): the same
        # configuration is left alone, another one restarts the task where it stopped
        register_connector(settings, tables)
        for table in added:
            start_backfill(settings, table)
            backfills.append(table)
    return SyncResult(names, added, removed, created, backfills, renamed, recreated)


def pipe_streams(settings: Settings) -> bool:
    return settings.pipeline.connector in connect_client(settings).connectors()


def _store_progress(
    settings: Settings, ends: dict[str, dict[int, int]]
) -> dict[str, dict[str, Any]]:
    """Per store: the events it has still to apply, and how far behind the source it is.
    A store that has finished no batch yet is listed once the log holds events
    (`nothing_applied`), its lag counted from the snapshot."""
    from cdc.capture.generation import read_generation
    from materializers.apply.freshness import Freshness, judge
    from materializers.log.progress import Progress

    stores: dict[str, dict[str, Any]] = {}
    generation = read_generation(settings)
    records = {store: read_progress(settings, store) for store in settings.apply.stores}
    # the commit time of each store's oldest change not applied (its lag), read in one go
    first = {
        store: progress.first_unapplied(ends)
        for store, progress in records.items()
        if progress is not None
    }
    times = change_times(settings.kafka, set().union(*first.values()))
    now_ms = time.time() * 1000
    for store, found in records.items():
        nothing_applied = found is None
        progress = found or Progress()
        backlog = progress.backlog(ends)
        if nothing_applied and not backlog:
            continue
        oldest = min((times[p] for p in first.get(store, ()) if p in times), default=None)
        lag = progress.lag_s(
            backlog, now_ms, generation.ts_ms if generation else None, oldest_ms=oldest
        )
        latency = progress.last_latency_s()
        stores[store] = {
            "nothing_applied": nothing_applied,
            "backlog_events": backlog,
            "lag_s": round(lag, 3) if lag is not None else None,
            "last_latency_s": round(latency, 3) if latency is not None else None,
            "applied_at_ms": progress.applied_ms,
            # the store did not answer: its batch waits, uncommitted (reason, since_ms)
            "waiting": progress.waiting,
            # the apply process that wrote its last batch, and whether it still runs
            "pid": progress.pid,
            "running": _running(progress.pid),
        }
        freshness = Freshness.from_json(progress.freshness)
        judged = judge(
            freshness,
            lag,
            # judged once an apply job has written the store (until then, its lag says
            # how far behind it is)
            None if nothing_applied else settings.apply.freshness_slo_s.get(store),
            now_ms,
            settings.apply.freshness_window_s,
        )
        stores[store]["freshness"] = judged.to_json() | {
            "window_s": settings.apply.freshness_window_s,
            "histogram": {
                "buckets": freshness.cumulative(),
                "sum_s": freshness.sum_s,
                "count": freshness.count,
            },
        }
    return stores


def _running(pid: int | None) -> bool | None:
    """Whether process `pid` runs on this machine (None: no pid known)."""
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it runs
        return True
    return True


def _late_events(settings: Settings) -> dict[str, int]:
    """Per window aggregate and stream-stream join: the events that came after its
    watermark (not counted)."""
    late = {}
    for name in [v.name for v in streaming(views_of(settings))]:
        counted = late_events(settings, name)
        if counted is not None:
            late[name] = counted
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
    client = connect_client(settings)
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
        if recorded(conn, pipe.name) is not None:
            conn.execute("DELETE FROM cdc.captured WHERE pipeline = %s", (pipe.name,))
    if drop_publication(settings):
        gone.append(f"publication {pipe.publication}")
    with admin_connection(settings) as conn:
        # the role keeps SELECT only on what other pipelines still capture
        revoked = sync_grants(conn, pipe.replication_user, [], pipe.publication)
        if revoked:
            gone.append(f"{pipe.replication_user}'s SELECT on {', '.join(revoked)}")
    return gone


def drop_replication_role(settings: Settings) -> tuple[bool, list[str]]:
    """Drop the replication role unless a pipeline is still set up on the database.
    Returns whether it went, and the pipelines' publications that kept it."""
    with admin_connection(settings) as conn:
        others = other_pipelines(conn, settings.pipeline.replication_user)
        if others:
            return False, others
        return drop_role(conn, settings), []
