"""How things look to people: rich tables for the terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cdc.capture.slot import wal_size
from cdc.check.reconcile import VerifyReport
from cdc.check.status import PipelineStatus
from cdc.stack.components import ComponentStatus

__all__ = ["pipeline_table", "status_table", "verify_tables"]

EXAMPLES = 5  # keys shown per kind of drift


def status_table(statuses: Sequence[ComponentStatus]) -> Table:
    table = Table(title="cdc stack", title_justify="left")
    for column in ("component", "state", "address", "version", "details"):
        table.add_column(column, overflow="fold")
    for s in statuses:
        state = "[green]up[/green]" if s.up else "[red]down[/red]"
        name = s.name if s.managed else f"{s.name} (external)"
        detail = escape(s.error or _details(s.details))  # their text, never markup
        table.add_row(name, state, s.address, s.version or "", detail)
    return table


def _details(details: dict[str, Any]) -> str:
    parts = []
    for key, value in details.items():
        if key == "connectors":
            if not value:
                parts.append("no connectors")
            for name, c in value.items():
                tasks = ",".join(t or "?" for t in c["tasks"]) or "no tasks"
                parts.append(f"{name}: {c['state']} (tasks {tasks})")
        else:
            parts.append(f"{key}={value}")
    return "; ".join(parts)


def _bytes(n: int | None) -> str:
    return "?" if n is None else wal_size(n)


def _slot_line(slot: dict[str, Any]) -> str:
    if slot.get("health") == "failed":
        state = "[red]lost[/red]"
    else:
        state = "[green]active[/green]" if slot["active"] else "[yellow]inactive[/yellow]"
    retained = _bytes(slot["wal_retained_bytes"])
    if slot.get("health") == "warning":
        retained = f"[yellow]{retained}[/yellow]"
    line = (
        f"{state}; WAL retained {retained}; confirmed flush {slot['confirmed_flush_lsn']}; "
        f"wal_status {slot['wal_status']}"
    )
    if slot.get("safe_wal_size") is not None:
        line += f"; invalidated after {_bytes(max(slot['safe_wal_size'], 0))} more WAL"
    if slot.get("failover"):  # PostgreSQL 17+: a standby with sync_replication_slots keeps it
        line += "; failover slot"
    for standby in slot.get("standbys") or []:
        held = standby.get("has_slot") and standby.get("synced") and not standby.get("error")
        state = "synced" if held else "[yellow]not synced[/yellow]"
        lsn = standby.get("confirmed_flush_lsn")
        at = f" at {lsn}" if held and lsn else ""
        line += f"; {state} on standby {escape(standby['address'])}{at}"
    return line


def pipeline_table(p: PipelineStatus) -> Table:
    table = Table(title=f"pipeline {p.name}", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("state", overflow="fold")
    if p.error:
        table.add_row("error", f"[red]{escape(p.error)}[/red]")
    snapshot = p.snapshot + (f" at {p.snapshot_lsn}" if p.snapshot_lsn else "")
    if p.snapshot == "running":
        if p.snapshot_ranges:
            snapshot += f"; {p.snapshot_ranges} CTID range(s) written"
        snapshot += " (interrupted, or under way: `cdc snapshot` resumes an interrupted one)"
    table.add_row("snapshot", snapshot)
    if p.slot:
        table.add_row(f"slot {p.slot['name']}", _slot_line(p.slot))
        health, problem = p.slot.get("health"), p.slot.get("problem")
        if problem:
            color = "red" if health == "failed" else "yellow"
            table.add_row(f"[{color}]{health}[/{color}]", f"[{color}]{problem}[/{color}]")
    else:
        table.add_row("slot", "none")
    if p.connector:
        c = p.connector
        color = "green" if c["state"] == "RUNNING" else "red"
        text = f"[{color}]{c['state']}[/{color}] (tasks {_tasks_line(c)})"
        if c.get("error"):
            text += f": {c['error']}"
        elif c.get("backfills"):
            text += f"; backfills: {escape(c['backfills'])}"
        table.add_row(f"connector {c['name']}", text)
    else:
        table.add_row("connector", "none")
    if p.profile:
        table.add_row("profile", f"{p.profile['name']} ({escape(p.profile['why'])})")
    if p.capture is not None:
        table.add_row("capture", _capture_line(p.capture))
    for problem in p.tables_drift:
        table.add_row("[red]tables[/red]", f"[red]{escape(problem)}[/red]")
    for topic, end in p.topics.items():
        table.add_row(f"topic {topic}", f"end offset {end}")
    if p.replication:
        table.add_row("[yellow]replicas[/yellow]", f"[yellow]{escape(p.replication)}[/yellow]")
    for name, published in p.published.items():
        behind = published["behind"]
        if published.get("error"):
            text = f"[red]the {name} catalog could not be read: {escape(published['error'])}[/red]"
        elif behind:
            listed = ", ".join(
                f"{name} (Delta {delta}, Iceberg {'none' if ice is None else ice})"
                for name, (delta, ice) in sorted(behind.items())[:5]
            )
            text = (
                f"[yellow]{len(behind)} of {published['tables']} tables behind Delta "
                f"(published within a trigger interval while `cdc apply` runs): "
                f"{escape(listed)}[/yellow]"
            )
        else:
            text = f"[green]{published['tables']} tables published[/green] (as Delta has them)"
        table.add_row(name, text)
    for store, s in p.stores.items():
        if s["backlog_events"]:
            lag = "?" if s["lag_s"] is None else f"{s['lag_s']:.1f}s"
            state = f"backlog {s['backlog_events']} events; lag {lag}"
            if s.get("nothing_applied"):
                state = f"no batch finished yet ({state}, since the snapshot)"
        elif s["lag_s"]:  # all of the log applied; the capture's lag is still its own
            state = f"[green]caught up[/green] with the log (backlog 0); lag {s['lag_s']:.1f}s"
        else:
            state = "[green]caught up[/green] (backlog 0; lag 0s)"
        if s.get("last_latency_s") is not None:
            state += f"; its newest change was visible {s['last_latency_s']:.1f}s after commit"
        fresh = s.get("freshness") or {}
        if fresh.get("p99_s") is not None:
            state += (
                f"; visible {fresh['p50_s']:.1f}s (p50) / {fresh['p99_s']:.1f}s (p99) after "
                f"commit over the last {fresh['window_s']:.0f}s"
            )
        if fresh.get("slo_s") is not None:
            state += (
                f"; [red]SLO {fresh['slo_s']:g}s breached[/red]: {escape(fresh['why'])}"
                if fresh.get("breached")
                else f"; SLO {fresh['slo_s']:g}s met"
            )
        if s.get("pid") is not None:
            state += f"; applied by pid {s['pid']}" + ("" if s.get("running") else " (stopped)")
        if slow := s.get("written_by_spark"):
            listed = ", ".join(f"{path} ({why})" for path, why in sorted(slow.items()))
            state += (
                f"; [yellow]{len(slow)} table(s) written by Spark, not delta-rs "
                f"(slower): {escape(listed)}[/yellow]"
            )
        if s.get("waiting"):
            since = s["waiting"]["since_ms"]
            state = (
                f"[yellow]waiting[/yellow] ({escape(s['waiting']['reason'])}) for "
                f"{max(time.time() - since / 1000, 0):.0f}s, nothing dropped; " + state
            )
        table.add_row(f"store {store}", state)
    for window, late in p.late_events.items():
        table.add_row(f"window {window}", f"{late} events too late for the watermark")
    dead = f"[red]{p.dead_letters}[/red]" if p.dead_letters else "0"
    table.add_row("dead letters", dead)
    return table


def verify_tables(report: VerifyReport) -> list[Table | Text]:
    """`cdc verify`'s report: each store's drift per table, then the expectations, then
    one line that sums it up."""
    drift = Table("store", "table", "source rows", "store rows", "drift", title="cdc verify")
    for d in report.drifts:
        if d.ok:
            verdict = "[green]none[/green]"
        else:
            kinds = [
                f"{len(keys)} {what} (e.g. {', '.join(keys[:EXAMPLES])})"
                for what, keys in (
                    ("missing", d.missing),
                    ("extra", d.extra),
                    ("different", d.different),
                )
                if keys
            ]
            verdict = "[red]" + escape("; ".join(kinds)) + "[/red]"
        drift.add_row(d.store, escape(d.table), str(d.source_rows), str(d.store_rows), verdict)
    parts: list[Table | Text] = [drift]
    for table, keys in sorted(report.held_back.items()):
        parts.append(
            Text(
                f"held back by the capture (over kafka.max_message_bytes; raise it, `cdc "
                f"setup`, then `cdc dlq replay`): {table}: {len(keys)} key(s) "
                f"({', '.join(keys[:EXAMPLES])})",
                style="yellow",
            )
        )
    drifted = sum(not d.ok for d in report.drifts)
    summary = f"drift in {drifted} of {len(report.drifts)} (store, table) pairs"
    if report.checks:
        suites = Table("table", "expectation", "column", "result", title="Great Expectations")
        for c in report.checks:
            verdict = "[green]ok[/green]" if c.ok else "[red]failed[/red]"
            suites.add_row(
                escape(c.table),
                c.expectation,
                escape(c.column or ""),
                f"{verdict} ({escape(str(c.observed))})",
            )
        parts.append(suites)
        met = sum(c.ok for c in report.checks)
        summary = f"Great Expectations: {met} of {len(report.checks)} expectations met; {summary}"
    # styled on a terminal, the words alone in a file or pipe (a str would be printed as
    # it is, markup included: Output.emit shows strings as text)
    parts.append(Text(summary, style="green" if report.ok else "red"))
    return parts


def _capture_line(capture: dict[str, Any]) -> str:
    """The capture's lag behind PostgreSQL, and when it stalls, since when."""
    if capture["lag_s"] is None:
        return f"[yellow]{escape(capture['why'])}[/yellow]"
    if capture["stalled"]:
        return f"[red]stalled[/red]: {escape(capture['why'])}"
    return (
        f"lag {capture['lag_s']:.1f}s behind PostgreSQL (the last heartbeat reached Kafka "
        f"{capture['latency_s']:.1f}s after its commit; one every {capture['interval_s']:g}s)"
    )


def _tasks_line(connector: dict[str, Any]) -> str:
    """Each task's state and the worker that runs it: `RUNNING on 10.0.0.7:8083`."""
    workers = connector.get("workers") or []
    said = []
    for i, state in enumerate(connector["tasks"]):
        worker = workers[i] if i < len(workers) else None
        said.append(f"{state} on {escape(worker)}" if worker else state)
    return ", ".join(said) or "none"
