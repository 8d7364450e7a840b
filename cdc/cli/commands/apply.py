"""The apply job's commands: apply, metrics and rebuild."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cdc.cli.base import (
    app,
    check_stores,
    console_say,
    settings,
)
from cdc.cli.commands.stack import connect_down
from cdc.core.errors import BackfillError, CdcError
from cdc.core.store_declarations import store_help
from cdc.stack import Stack
from cdc.stack.components import ComponentStatus


@app.command("apply")
def apply_(
    store: Annotated[
        list[str] | None,
        typer.Option("--store", "-s", help=store_help("repeat; default: all")),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="apply what the topics hold now, then stop")
    ] = False,
) -> None:
    """Run the apply job: PySpark Structured Streaming from the change topics into the stores.

    One streaming query per store, each with its own checkpoint. Each micro-batch keeps
    every key's last event and writes it only where it is newer than what the store
    holds, so replays and restarts converge. Beside other stores, the warehouse runs in
    a process of its own at a lower CPU priority (apply.own_process), so its work
    never holds the cache and the search index back. Runs until Ctrl-C (or, with
    --once, until it has applied what the topics hold).
    """
    from cdc.apply.job import run_apply

    s = settings()
    stores = store or list(s.apply.stores)
    check_stores(stores)
    console_say(
        f"applying pipeline {s.pipeline.name} to {', '.join(stores)}" + (" once" if once else "")
    )
    run_apply(s, stores, once=once)


@app.command()
def metrics(
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535)] = 9464,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics (the figures of `cdc status`) until Ctrl-C.

    Per component: up; per pipeline: slot active and WAL retained, connector
    running, change topic end offsets, per store backlog (events) and lag
    (seconds), dead letters, window events too late for the watermark.
    """
    import time

    from cdc.check.status import PipelineStatus, pipeline_status
    from cdc.cli.metrics import serve

    s = settings()
    stack = Stack(s)
    try:

        def look() -> tuple[list[ComponentStatus], PipelineStatus]:
            statuses = stack.status()
            return statuses, pipeline_status(s, connect_down=connect_down(statuses))

        server = serve(look, port, host)
    except OSError as exc:
        raise CdcError(f"cannot listen on {host}:{port} ({exc.strerror}): use --port") from None
    console_say(f"metrics at http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()


@app.command()
def rebuild(
    store: Annotated[str, typer.Option("--store", "-s", help=store_help())],
    table: Annotated[
        list[str] | None, typer.Option("--table", "-t", help="schema.table (repeat; default: all)")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Rebuild a store's tables from the log: empty them, restart the store's checkpoint,
    and backfill the tables through the log. Stop `cdc apply` first; run it afterwards.

    For a change topic deleted and created again (`cdc apply` stops and names this
    command), a store found drifting, or a store lost. It empties nothing unless the
    store answers and a backfill can start (the connector streams, Kafka answers).
    """
    from cdc.capture.backfill import ready_to_backfill, start_backfill, watch_backfill
    from cdc.check.rebuild import reset_store

    check_stores([store])
    s = settings()
    names = [t if "." in t else f"public.{t}" for t in table or []]
    what = f"the {store}'s copy of " + (", ".join(names) if names else "every captured table")
    if not yes:
        if not sys.stdin.isatty():
            raise typer.BadParameter(f"rebuilding {what} needs confirmation: pass --yes")
        typer.confirm(f"Empty and rebuild {what}?", abort=True)
    ready_to_backfill(s, names)  # before the store is emptied: nothing changed if not
    chosen = reset_store(s, store, names or None, console_say)
    for at, name in enumerate(chosen):
        try:
            signal, offset = start_backfill(s, name)
            console_say(f"backfilling {name} through the log")
            done = watch_backfill(s, offset, lambda p: None, signal_id=signal)
        except CdcError as exc:
            left = " ".join(f"--table {t}" for t in chosen[at:])
            raise BackfillError(
                f"the {store} was emptied of {', '.join(chosen)} and its checkpoint restarted, "
                f"but the backfill of {name} failed ({exc}): once that is mended, run "
                f"`cdc rebuild --store {store} {left} --yes` again"
            ) from None
        console_say(f"backfill of {name} completed: {done.rows_scanned or 0} rows read")
    console_say(f"now run `cdc apply` (or `cdc apply --store {store}`): it rebuilds the {store}")
