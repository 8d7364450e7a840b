"""How things look to people: rich tables for the terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from cdc.components import ComponentStatus

__all__ = ["console", "status_table"]


def console(stderr: bool = False) -> Console:
    """A console; wide when it writes to a file or pipe, where nothing wraps lines for us."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def status_table(statuses: Sequence[ComponentStatus]) -> Table:
    table = Table(title="cdc stack", title_justify="left")
    for column in ("component", "state", "address", "version", "details"):
        table.add_column(column, overflow="fold")
    for s in statuses:
        state = "[green]up[/green]" if s.up else "[red]down[/red]"
        name = s.name if s.managed else f"{s.name} (external)"
        table.add_row(name, state, s.address, s.version or "", s.error or _details(s.details))
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
