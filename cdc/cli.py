"""`cdc`: run the Postgres change-data-capture stack.

Thin subcommands over the modules; every error is one line on stderr with a
non-zero exit code.
"""

from __future__ import annotations

import json
import logging
import sys
from enum import StrEnum
from typing import Annotated

import typer

from cdc.errors import CdcError
from cdc.render import console, status_table
from cdc.settings import Settings, load_settings
from cdc.stack import Stack

__all__ = ["app", "main"]


class Output(StrEnum):
    text = "text"
    json = "json"


app = typer.Typer(
    name="cdc",
    help="Keep derived stores in sync with PostgreSQL: Debezium into Kafka, applied by Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = console()
err = console(stderr=True)
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
    """Start the local stack and wait until every component answers.

    PostgreSQL, Kafka (KRaft), Kafka Connect with Debezium, OpenSearch and Redis,
    each with its state and log under data_dir.
    """
    stack = Stack(settings())
    stack.up(progress)
    _print_status(stack, Output.text)


@app.command()
def down(
    purge: Annotated[
        bool, typer.Option("--purge", help="also delete every component's state")
    ] = False,
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
    else:
        out.print(status_table(statuses))
    return all(s.up for s in statuses)


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
    keep: Annotated[
        bool, typer.Option("--keep/--no-keep", help="leave the stack running at the end")
    ] = True,
) -> None:
    """Start the stack, capture a demo table and show its changes arrive in Kafka.

    Rows are inserted, updated and deleted in PostgreSQL; the Debezium change events
    (c, u, d and the tombstone) are read back from the change topic.
    """
    from cdc.demo import run_demo

    run_demo(settings(), out, progress, keep=keep)


@app.command()
def setup(output: OutputOption = Output.text) -> None:
    """Prepare the source and the topics for the pipeline (idempotent).

    Creates or updates the replication role, its grants on exactly the captured
    tables, the replica identities, the publication, the signal and heartbeat
    tables, and the change topics.
    """
    from cdc.source import prepare_source
    from cdc.topics import ensure_topics
    from snapshot.initial import topic_specs

    s = settings()
    tables = prepare_source(s)
    created = ensure_topics(s.kafka.bootstrap_servers, topic_specs(s, tables))
    if output is Output.json:
        out.print_json(
            json.dumps({"tables": [t.qualified for t in tables], "topics_created": created})
        )
        return
    for table in tables:
        key = ", ".join(table.key)
        out.print(f"{table.qualified} (key {key}) -> {s.pipeline.topic(table.qualified)}")
    if created:
        progress(f"created topics: {', '.join(created)}")


@app.command()
def snapshot(output: OutputOption = Output.text) -> None:
    """Take the initial snapshot at the slot's consistent point, then start streaming.

    Creates the slot with an exported snapshot, reads every captured table under
    it in parallel (Spark), writes the rows as op "r" events to the change topics,
    and only then starts the Debezium connector on that slot (snapshot.mode=no_data).
    Safe to rerun: an interrupted snapshot starts again from scratch.
    """
    from snapshot.initial import run_snapshot

    result = run_snapshot(settings(), err, progress)
    if output is Output.json:
        out.print_json(json.dumps(result.__dict__ | {"total_rows": result.total_rows}))
    elif not result.resumed:
        rate = result.total_rows / result.seconds if result.seconds else 0
        out.print(
            f"snapshot at LSN {result.lsn}: {result.total_rows} rows from {len(result.rows)} "
            f"table(s) in {result.seconds:.1f}s ({rate:,.0f} rows/s); streaming from the slot"
        )


def main() -> None:
    try:
        app()
    except CdcError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
