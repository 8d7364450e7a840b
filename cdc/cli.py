"""`cdc`: run the Postgres change-data-capture stack.

Thin subcommands over the modules; every error is one line on stderr with a
non-zero exit code.
"""

from __future__ import annotations

import json
import logging
import sys
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cdc.errors import CdcError
from cdc.settings import Settings, load_settings
from cdc.stack import Stack

__all__ = ["app", "main"]


class Output(str, Enum):
    text = "text"
    json = "json"


app = typer.Typer(
    name="cdc",
    help="Keep derived stores in sync with PostgreSQL: Debezium into Kafka, applied by Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)
OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="text for people, json for scripts")
]


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what happens")] = False,
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def settings() -> Settings:
    return load_settings()


def progress(message: str) -> None:
    err.print(f"[dim]·[/dim] {message}", highlight=False)


@app.command()
def up() -> None:
    """Start the local stack (PostgreSQL, Kafka, Kafka Connect, OpenSearch, Redis) and wait until it answers."""
    stack = Stack(settings())
    stack.up(progress)
    _print_status(stack, Output.text)


@app.command()
def down(
    purge: Annotated[bool, typer.Option("--purge", help="also delete every component's state")] = False,
) -> None:
    """Stop the local stack cleanly (Connect first, PostgreSQL last)."""
    stopped = Stack(settings()).down(purge=purge, progress=progress)
    if not stopped and not purge:
        progress("nothing was running")


@app.command()
def status(output: OutputOption = Output.text) -> None:
    """Show each component: up or down, address, version, and its details (connectors, tasks)."""
    stack = Stack(settings())
    if not _print_status(stack, output):
        raise typer.Exit(1)


def _print_status(stack: Stack, output: Output) -> bool:
    statuses = stack.status()
    if output is Output.json:
        out.print_json(json.dumps([s.__dict__ for s in statuses], default=str))
        return all(s.up for s in statuses)
    table = Table(title="cdc stack", title_justify="left")
    for column in ("component", "state", "address", "version", "details"):
        table.add_column(column)
    for s in statuses:
        state = "[green]up[/green]" if s.up else "[red]down[/red]"
        detail = s.error or _details_text(s.details)
        managed = "" if s.managed else " (external)"
        table.add_row(s.name + managed, state, s.address, s.version or "", detail)
    out.print(table)
    return all(s.up for s in statuses)


def _details_text(details: dict[str, Any]) -> str:
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


@app.command("config")
def show_config(output: OutputOption = Output.text) -> None:
    """Show the settings in force (secrets masked) and where they come from."""
    masked = settings().masked()
    if output is Output.json:
        out.print_json(json.dumps(masked))
        return
    for key, value in masked.items():
        if isinstance(value, dict):
            out.print(f"[bold]\\[{key}][/bold]")
            for sub, sub_value in value.items():
                out.print(f"  {sub} = {sub_value}", highlight=False)
        else:
            out.print(f"{key} = {value}", highlight=False)


@app.command()
def demo(
    keep: Annotated[bool, typer.Option("--keep/--no-keep", help="leave the stack running at the end")] = True,
) -> None:
    """Start the stack, capture a demo table, change rows in PostgreSQL and show the change events in Kafka."""
    from cdc.demo import run_demo

    run_demo(settings(), out, progress, keep=keep)


def main() -> None:
    try:
        app()
    except CdcError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
