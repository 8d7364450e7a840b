"""The stack's commands: up, down, status, config and the demo."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.text import Text

from cdc.cli.base import (
    OutputOption,
    app,
    console_say,
    err,
    settings,
)
from cdc.cli.output import Output, OutputForm
from cdc.cli.render import pipeline_table, status_table
from cdc.core.object_store import delta_rs_options
from cdc.core.settings import local_admin_password
from cdc.core.spark import execution_profile
from cdc.core.state_folders import warehouse_store
from cdc.stack import Stack
from cdc.stack.components import ComponentStatus


@app.command()
def up() -> None:
    """Start the local stack and wait until every component answers.

    PostgreSQL, Kafka (KRaft), Kafka Connect with Debezium, OpenSearch and Redis,
    each with its state and log under data_dir.
    """
    stack = Stack(settings())
    stack.up(console_say)
    # a cluster made just now has a generated password the settings were loaded without
    _print_status(Stack(local_admin_password(stack.settings)), Output())


@app.command()
def down(
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="also delete, under data_dir, the state cdc made: the components' and the "
            "pipelines' (checkpoints, a warehouse under data_dir)",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="purge without asking")] = False,
) -> None:
    """Stop the local stack cleanly (Connect first, PostgreSQL last).

    --purge removes only folders cdc made (marked with a .cdc-state file), never
    anything outside data_dir; it asks first unless --yes.
    """
    stack = Stack(settings())
    plan = stack.purge_plan() if purge else None
    if plan is not None and plan.remove and not yes:
        where = f"{plan.names()} under {plan.data_dir}"
        if not sys.stdin.isatty() or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            err.print(
                f"[red]error:[/red] `cdc down --purge` would remove {where} and asks first; "
                "there is no terminal to ask on: pass --yes",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(2)
        typer.confirm(f"This removes {where}. Continue?", abort=True)
    stopped = stack.down(say=console_say)
    if plan is not None:
        stack.purge(plan, console_say)
    elif not stopped:
        console_say("nothing was running")


@app.command()
def status(output: OutputOption = OutputForm.text) -> None:
    """Show the health of each component and of the pipeline, per store.

    Each component: up or down, address, version, and its details (connectors, tasks),
    then the pipeline: the capture's lag behind PostgreSQL (from the heartbeats), and per
    store its backlog, lag (from the commit in PostgreSQL: the capture's at least),
    freshness (commit to visible, p50 and p99 over apply.freshness_window_s) against its
    SLO, and the process applying it (with [stores.warehouse] iceberg, the warehouse
    tables whose Iceberg table lags its Delta table).
    With Kafka Connect not answering, the pipeline is still shown, and why it stalls.
    Exits 1 if a component is down, the slot is lost, the connector or a task failed, a
    captured table was renamed or dropped (or one selected is not captured: `cdc setup`),
    or a store breaches its freshness SLO (apply.freshness_slo_s)."""
    stack = Stack(settings())
    if not _print_status(stack, Output(output)):
        raise typer.Exit(1)


def _print_status(stack: Stack, output: Output) -> bool:
    from cdc.check.status import pipeline_status

    statuses = stack.status()
    up = {s.name for s in statuses if s.up}
    # the pipeline's figures need PostgreSQL and Kafka only: with Connect not answering
    # they are what tells how far behind the capture is, and why
    pipeline = (
        pipeline_status(stack.settings, connect_down=connect_down(statuses))
        if {"postgres", "kafka"} <= up
        else None
    )
    output.emit(
        {
            "components": [s.__dict__ for s in statuses],
            "pipeline": pipeline.__dict__ if pipeline else None,
        },
        status_table(statuses),
        *([pipeline_table(pipeline)] if pipeline is not None else []),
    )
    return all(s.up for s in statuses) and not (
        pipeline is not None and (pipeline.broken or pipeline.breached)
    )


def connect_down(statuses: list[ComponentStatus]) -> str | None:
    """Why Kafka Connect did not answer the stack's look just now (None: it did): the
    pipeline's status says it without asking again (and waiting its timeout twice)."""
    connect = next((s for s in statuses if s.name == "connect"), None)
    if connect is None or connect.up:
        return None
    error = connect.error or "does not answer"
    return error if "Kafka Connect" in error else f"Kafka Connect {error}"


@app.command("config")
def show_config(output: OutputOption = OutputForm.text) -> None:
    """Show the settings in force (secrets masked) and where they come from, and the
    apply job's profile in use (apply.profile resolved) and why."""
    given = settings()
    masked = given.masked()
    profile, why = execution_profile(given)
    lines: list[str | Text] = [Text(f"profile in use: {profile} ({why})", style="bold")]
    for key, value in masked.items():
        if isinstance(value, dict):
            lines.append(Text(f"[{key}]", style="bold"))
            lines += [f"  {sub} = {sub_value}" for sub, sub_value in value.items()]
        else:
            lines.append(f"{key} = {value}")
    document = {**masked, "profile_in_use": {"name": profile, "why": why}}
    store = warehouse_store(given)
    if store is not None:  # the warehouse on object storage: how a reader of yours reaches it
        options = {
            k: "**********" if "SECRET" in k else v for k, v in delta_rs_options(store).items()
        }
        document["warehouse_storage_options"] = options
        lines.append(Text("delta-rs storage_options of the warehouse", style="bold"))
        lines += [f"  {k} = {v}" for k, v in options.items()]
    Output(output).emit(document, *lines)


@app.command()
def demo(
    keep: Annotated[
        bool, typer.Option("--keep/--no-keep", help="leave the stack running at the end")
    ] = True,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", help="seconds of workload (default: until Ctrl-C; 30 without a terminal)"
        ),
    ] = None,
    rate: Annotated[
        float, typer.Option("--rate", min=0.1, help="workload transactions per second")
    ] = 50.0,
) -> None:
    """Run the whole pipeline on a demo shop, with a live dashboard, then verify it.

    Starts the stack, creates and snapshots the demo schema (customers, products,
    orders, order_items), streams changes, applies them to the warehouse (with a join
    view and a per-minute window aggregate), the search index and the cache, runs a
    shop workload while a dashboard shows events/s, lag and dead letters, then shows
    query, search and get examples and verifies every store. Exits 1 on drift.
    """
    from cdc.cli.demo import run_demo

    result = run_demo(
        settings(), Output().console, console_say, keep=keep, duration=duration, rate=rate
    )
    if result.interrupted:
        console_say("stopped (Ctrl-C); the stack keeps running: `cdc down` stops it")
        raise typer.Exit(130)
    if not result.ok:
        raise typer.Exit(1)
