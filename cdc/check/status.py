"""`cdc status` of a pipeline: its snapshot, slot (and its health), connector, the
capture's lag behind PostgreSQL, topics, tables whose capture drifted, and per store its
backlog, lag (from PostgreSQL's commit: the capture's lag at least), freshness against
its SLO and the process applying it; the views' late events; the Iceberg tables that
lag."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from cdc.capture.connect_client import connect_client
from cdc.capture.lag import CaptureLag, capture_lag
from cdc.capture.replica_identity import identity_problems
from cdc.capture.slot import slot_row, standby_slots
from cdc.capture.snapshot.record import read_ranges, read_state
from cdc.core.catalog import describe_table, published_tables, selected_tables
from cdc.core.errors import CdcError, SourceError
from cdc.core.identity import acknowledged, recorded_since, table_changes
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings
from cdc.core.spark import execution_profile
from cdc.core.store_declarations import declared
from cdc.core.topics import (
    change_times,
    change_topic,
    connect_topics,
    dead_letter_topic,
    end_offsets,
    heartbeat_rows_topic,
    last_heartbeat,
    pipeline_topic_specs,
    under_replicated,
    written_since,
)
from cdc.log.freshness import Freshness, judge
from cdc.log.progress import late_events, read_progress
from cdc.stores.registry import derived_views

__all__ = ["PipelineStatus", "pipeline_status", "still_waiting"]


@dataclass
class PipelineStatus:
    name: str
    snapshot: str  # none, running (interrupted or under way), done
    snapshot_lsn: str | None
    # active, wal_retained_bytes, confirmed_flush_lsn, wal_status, safe_wal_size, ...;
    # health: ok, warning (retains too much WAL) or failed (lost); problem: what to do
    slot: dict[str, Any] | None
    connector: dict[str, Any] | None  # state, tasks, trace of a failed task
    # commit → in Kafka: lag_s, heartbeat_ms, latency_s, interval_s, stalled, why
    # (cdc/capture/lag.py); None when Kafka was not read
    capture: dict[str, Any] | None = None
    topics: dict[str, int] = field(default_factory=dict)  # end offset summed over partitions
    stores: dict[str, dict[str, Any]] = field(default_factory=dict)  # per store: backlog, lag
    dead_letters: int = 0
    late_events: dict[str, int] = field(default_factory=dict)  # per window aggregate
    # a running snapshot's CTID ranges already in Kafka (what a rerun does not read again)
    snapshot_ranges: int | None = None
    # per publisher of a store (the warehouse's Iceberg tables): its
    # tables, and those it lags: {"tables": n, "behind": {folder: [the store's version,
    # the one published or None]}}, or {"error": why it could not be read}
    published: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a captured table renamed, dropped, or selected and not captured: what to run
    tables_drift: list[str] = field(default_factory=list)
    # pipeline topics with fewer replicas than kafka.replication_factor, and the command
    # that raises them (a warning: nothing is lost until a broker is)
    replication: str | None = None
    # the apply job's profile (apply.profile, resolved) and why: {"name", "why"}
    profile: dict[str, str] = field(default_factory=dict)
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


def backfill_channel(config: dict[str, str]) -> str:
    """Where the running connector takes a backfill's signal and watermarks, from its
    configuration (pipeline.read_only_backfills, as the last `cdc setup` gave it)."""
    if config.get("read.only") == "true":
        return f"read-only: signals on topic {config.get('signal.kafka.topic', '?')}"
    return f"signals and watermarks in table {config.get('signal.data.collection', '?')}"


def pipeline_status(
    settings: Settings, tables: list[str] | None = None, connect_down: str | None = None
) -> PipelineStatus:
    """The pipeline's figures. Whatever else is down, the capture's lag and each store's
    lag and backlog are read from PostgreSQL and Kafka alone (the heartbeats, the log's
    ends, the stores' progress): Kafka Connect not answering is said (`connect_down`:
    why, when the caller has asked it already; not asked again), never a reason to
    show less."""
    pipe = settings.pipeline
    status = PipelineStatus(pipe.name, "none", None, None, None)
    profile, why = execution_profile(settings)
    status.profile = {"name": profile, "why": why}
    try:
        with admin_connection(settings) as conn:
            has_state = conn.execute("SELECT to_regclass('cdc.snapshots') IS NOT NULL").fetchone()
            state = read_state(conn, pipe.name) if has_state and has_state[0] else None
            if state:
                status.snapshot, status.snapshot_lsn = state.status, state.lsn
                if state.status == "running":
                    status.snapshot_ranges = len(read_ranges(conn, pipe.name))
            standbys = standby_slots(
                settings.postgres.standbys, lambda a: settings.postgres.at(a).dsn(), pipe.slot
            )
            status.slot = slot_row(conn, pipe.slot, pipe.wal_retained_warn_bytes, standbys)
            published = published_tables(conn, pipe.publication)
            found = table_changes(conn, pipe.name, published, selected_tables(conn, pipe))
            since = recorded_since(conn, pipe.name)
            acks = acknowledged(conn, pipe.name)
            if tables is None:
                tables = published
        if since is not None:
            written = written_since(settings.kafka, pipe, since, set(published), acks)
            prefix = len(pipe.topic_prefix) + 1
            found = replace(found, strays=[(t, t[prefix:]) for t in written])
        if published or state:
            status.tables_drift = found.problems(lambda name: change_topic(pipe, name))
            status.tables_drift += _choice_problems(settings, published)
        try:  # Connect not answering (stopped, paused by a signal): the rest is still told
            if connect_down is not None:
                raise CdcError(connect_down)
            connectors = connect_client(settings, timeout=5.0).connectors()
        except CdcError as exc:
            connectors = {}
            status.connector = {
                "name": pipe.connector,
                "state": "UNKNOWN",
                "tasks": [],
                "error": str(exc),
            }
        entry = connectors.get(pipe.connector, {}).get("status")
        if entry:
            status.connector = {
                "name": pipe.connector,
                "state": entry["connector"]["state"],
                "tasks": [t["state"] for t in entry.get("tasks", [])],
                # the worker (host:port, as it advertises itself) that runs each task
                "workers": task_workers(entry),
            }
            config = connectors[pipe.connector].get("info", {}).get("config", {})
            if config:
                status.connector["backfills"] = backfill_channel(config)
            failed = [t for t in entry.get("tasks", []) if t.get("state") == "FAILED"]
            if failed:
                from cdc.capture.connect_client import summarize_trace, too_large

                trace = failed[0].get("trace", "")
                status.connector["error"] = too_large(
                    trace, settings.kafka.max_message_bytes
                ) or summarize_trace(trace)
        if tables:
            capture = _capture_lag(settings, status.connector)
            status.capture = capture.to_json()
            topics = [change_topic(pipe, t) for t in tables]
            ends = end_offsets(settings.kafka, [*topics, dead_letter_topic(pipe)])
            dlq = ends.pop(dead_letter_topic(pipe), {})
            status.dead_letters = sum(dlq.values())
            status.topics = {t: sum(parts.values()) for t, parts in ends.items()}
            status.replication = _replication(settings, tables)
            status.stores = _store_progress(settings, ends, capture)
            status.late_events = _late_events(settings)
        status.published = _published(settings)
    except CdcError as exc:
        status.error = str(exc)
    return status


def _replication(settings: Settings, tables: list[str]) -> str | None:
    """The pipeline's topics (and the local Connect worker's) that have fewer replicas
    than kafka.replication_factor, and what raises them (cdc/core/topics.py)."""
    names = [s.name for s in pipeline_topic_specs(settings.pipeline, tables)]
    if settings.connect.managed:
        names += connect_topics(settings.connect.group_id).values()
    plan = settings.data_dir / "kafka-replicas.json"
    return under_replicated(settings.kafka, names, plan)


def task_workers(status: dict[str, Any]) -> list[str | None]:
    """The worker that runs each task of a connector (its `worker_id`, host:port as the
    worker advertises itself), in the order of the tasks; None for a task not assigned."""
    return [t.get("worker_id") or None for t in status.get("tasks", [])]


def _capture_lag(settings: Settings, connector: dict[str, Any] | None) -> CaptureLag:
    """The capture's lag now, from the newest heartbeat row in the log."""
    pipe = settings.pipeline
    state = None
    if connector is None:
        state = f"connector {pipe.connector} missing (run `cdc setup`)"
    elif connector["state"] == "UNKNOWN":
        state = connector["error"]
    elif connector["state"] != "RUNNING" or any(t != "RUNNING" for t in connector["tasks"]):
        tasks = ", ".join(connector["tasks"]) or "none"
        state = f"connector {connector['state']} (tasks {tasks})"
    return capture_lag(
        last_heartbeat(settings.kafka, pipe),
        pipe.heartbeat_interval_ms / 1000,
        time.time() * 1000,
        state,
        heartbeat_rows_topic(pipe),
    )


def _published(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each publisher's figures (its store's declaration's `publisher`); one that cannot
    be made or read is said in one line under its store's name, not raised."""
    found: dict[str, dict[str, Any]] = {}
    for store in settings.apply.stores:
        try:
            publisher = declared()[store].publisher_of(settings)
            if publisher is not None:
                found[publisher.name] = publisher.status()
        except Exception as exc:  # e.g. a remote warehouse: Iceberg publishes a local one
            line = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            found[store] = {"tables": 0, "behind": {}, "error": line}
    return found


def _choice_problems(settings: Settings, published: list[str]) -> list[str]:
    """What pipeline.table and pipeline.replica_identity choose that the capture does not
    do yet: columns added since `cdc setup` named the publication's columns, a choice the
    table no longer fits, or a partition without the configured replica identity."""
    pipe, lines = settings.pipeline, []
    with admin_connection(settings) as conn:
        for name in published:
            if name not in pipe.table and name not in pipe.replica_identity:
                continue
            try:
                table = describe_table(conn, name, pipe)
            except SourceError as exc:
                lines.append(f"{exc}; then run `cdc setup`")
                continue
            lines += identity_problems(conn, [table], pipe.replica_identity)
            pending = table.pending if name in pipe.table else []
            if pending:
                lines.append(
                    f"table {name}: its column(s) {', '.join(pending)}, added since the "
                    "setup, are not captured yet (the publication names its columns): run "
                    "`cdc setup` (it captures and backfills them)"
                )
    return lines


def _store_progress(
    settings: Settings, ends: dict[str, dict[int, int]], capture: CaptureLag | None = None
) -> dict[str, dict[str, Any]]:
    """Per store: the events it has still to apply, and how far behind the source it is:
    the age of its oldest change not applied, in the log or not yet (the capture's lag).
    A store that has finished no batch yet is listed once the log holds events
    (`nothing_applied`), its lag counted from the snapshot."""
    from cdc.capture.generation import read_generation
    from cdc.log.progress import Progress

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
        if capture is not None and capture.lag_s is not None and lag is not None:
            lag = max(lag, capture.lag_s)
        latency = progress.last_latency_s()
        stores[store] = {
            "nothing_applied": nothing_applied,
            "backlog_events": backlog,
            "lag_s": round(lag, 3) if lag is not None else None,
            "last_latency_s": round(latency, 3) if latency is not None else None,
            "applied_at_ms": progress.applied_ms,
            # the store did not answer: its batch waits, uncommitted (reason, since_ms)
            "waiting": still_waiting(progress.waiting),
            # the apply process that wrote its last batch, and whether it still runs
            "pid": progress.pid,
            "running": _running(progress.pid),
            # tables its faster writer cannot write (Spark writes them): path -> why
            "written_by_spark": progress.written_by_spark or {},
            # how its last batch was written, and how many batches took each route
            "route": progress.route,
            "routes": dict(progress.routes),
        }
        freshness = Freshness.from_json(progress.freshness)
        judged = judge(
            freshness,
            lag,
            # judged once an apply job has written the store (until then, its lag says
            # how far behind it is)
            None if nothing_applied else settings.apply.slo_s(store),
            now_ms,
            settings.apply.freshness_window_s,
            None if capture is None else (capture.lag_s, capture.why),
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


def still_waiting(waiting: dict[str, Any] | None) -> dict[str, Any] | None:
    """A store's wait as the apply process that waits noted it, while that process runs:
    one stopped while it waited (killed, or `cdc apply` ended) left its note behind."""
    if waiting is None or not _running(waiting.get("pid")):
        return None
    return waiting


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
    late: dict[str, int] = {}
    door = derived_views(settings)
    if door is None:
        return late
    for name in [v.name for q in door.queries(door.of(settings)) for v in q.members]:
        counted = late_events(settings, name)
        if counted is not None:
            late[name] = counted
    return late
