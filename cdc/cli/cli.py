"""`cdc`: run the Postgres change-data-capture stack.

Thin subcommands over the modules; every error is one line on stderr with a
non-zero exit code.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from typing import Annotated, Any

import typer
from rich.text import Text

from cdc.cli.output import Output, OutputForm, RowsForm, console
from cdc.cli.render import pipeline_table, status_table, verify_tables
from cdc.core.catalog import captured_table
from cdc.core.errors import CdcError, ConfigError
from cdc.core.settings import Settings, load_settings, local_admin_password
from cdc.core.store_declarations import store_help
from cdc.core.topics import change_topic
from cdc.stack import Stack
from cdc.stack.components import ComponentStatus

__all__ = ["app", "main"]


app = typer.Typer(
    name="cdc",
    help="Keep derived stores in sync with PostgreSQL: Debezium into Kafka, applied by Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = console(stderr=True)
OutputOption = Annotated[
    OutputForm, typer.Option("--output", "-o", help="text for people, json for scripts")
]
RowsOutputOption = Annotated[
    RowsForm, typer.Option("--output", "-o", help="text for people, json or csv for scripts")
]


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log what happens")] = False,
) -> None:
    # the terminal gets warnings and errors (everything with --verbose); a Spark job's
    # Python log (ours, Great Expectations') also goes to its file (cdc/core/spark.py)
    terminal = logging.StreamHandler()
    terminal.setLevel(logging.DEBUG if verbose else logging.WARNING)
    terminal.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[terminal])
    if not verbose:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        # a store that does not answer is told in one line by `cdc apply`, not per request
        logging.getLogger("opensearch").setLevel(logging.CRITICAL)


def settings() -> Settings:
    return load_settings()


def console_say(message: str) -> None:
    """The CLI's Say: a line on standard error, dim-dotted, as text (no markup)."""
    err.print(Text.assemble(("·", "dim"), " ", message), highlight=False)  # text, no markup


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
    SLO, and the process applying it
    (with apply.iceberg, the warehouse tables whose Iceberg table lags its Delta table).
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
        pipeline_status(stack.settings, connect_down=_connect_down(statuses))
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


def _connect_down(statuses: list[ComponentStatus]) -> str | None:
    """Why Kafka Connect did not answer the stack's look just now (None: it did): the
    pipeline's status says it without asking again (and waiting its timeout twice)."""
    connect = next((s for s in statuses if s.name == "connect"), None)
    if connect is None or connect.up:
        return None
    error = connect.error or "does not answer"
    return error if "Kafka Connect" in error else f"Kafka Connect {error}"


@app.command("config")
def show_config(output: OutputOption = OutputForm.text) -> None:
    """Show the settings in force (secrets masked) and where they come from."""
    masked = settings().masked()
    lines: list[str | Text] = []
    for key, value in masked.items():
        if isinstance(value, dict):
            lines.append(Text(f"[{key}]", style="bold"))
            lines += [f"  {sub} = {sub_value}" for sub, sub_value in value.items()]
        else:
            lines.append(f"{key} = {value}")
    Output(output).emit(masked, *lines)


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


@app.command()
def setup(
    output: OutputOption = OutputForm.text,
    print_sql: Annotated[
        bool,
        typer.Option(
            "--print-sql",
            help="print the SQL the setup runs on PostgreSQL, for a DBA to run, and change nothing",
        ),
    ] = False,
) -> None:
    """Prepare the source, topics and connector for the pipeline's tables (idempotent).

    Creates or updates the replication role and its grants on exactly the captured
    tables, the replica identities, the publication, the signal and heartbeat tables,
    and the change topics. On a streaming pipeline, tables new to pipeline.tables are
    captured and backfilled; tables no longer in it stop being captured. A captured
    table renamed since is captured under its new name and backfilled there; one dropped
    and created again is cut (as a TRUNCATE: the stores drop the old rows) and backfilled.
    """
    from cdc.capture.pipeline import sync_pipeline

    s = settings()
    if print_sql:
        from cdc.capture.source import setup_sql

        sys.stdout.write(setup_sql(s))
        return
    result = sync_pipeline(s)
    Output(output).emit(
        result.__dict__, *(f"{t} -> {change_topic(s.pipeline, t)}" for t in result.tables)
    )
    if output is not OutputForm.text:
        return
    for label, items in (
        ("created topics", result.topics_created),
        ("renamed (a new table under its new name)", [f"{a} -> {b}" for a, b in result.renamed]),
        (
            "cut (as a TRUNCATE: the stores may hold rows under its name that are not its "
            "own: created again, swapped, added back, or put back in the publication)",
            result.recreated,
        ),
        ("now captured", result.added),
        ("no longer captured (topic kept)", result.removed),
        ("backfill started", result.backfills),
    ):
        if items:
            console_say(f"{label}: {', '.join(items)}")
    for line in result.stores:
        console_say(line)


@app.command()
def snapshot(output: OutputOption = OutputForm.text) -> None:
    """Take the initial snapshot at the slot's consistent point, then start streaming.

    Creates the slot with an exported snapshot, reads every captured table under
    it in parallel (Spark), writes the rows as op "r" events to the change topics,
    and only then starts the Debezium connector on that slot (snapshot.mode=no_data).
    Safe to rerun: an interrupted snapshot resumes, reading only the CTID ranges it had
    not written (backfilled while streaming from the slot); one that wrote none, or
    whose slot is gone, starts again.
    """
    from cdc.capture.initial_snapshot import run_snapshot

    result = run_snapshot(settings(), err, console_say)
    rate = result.total_rows / result.seconds if result.seconds else 0
    said = (
        f"snapshot at LSN {result.lsn}: {result.total_rows} rows from {len(result.rows)} "
        f"table(s) in {result.seconds:.1f}s ({rate:,.0f} rows/s); streaming from the slot"
    )
    if result.continued:
        said = (
            f"snapshot at LSN {result.lsn} finished after its interruption in "
            f"{result.seconds:.1f}s: {result.total_rows} rows in the log from "
            f"{len(result.rows)} table(s); streaming from the slot"
        )
    Output(output).emit(
        result.__dict__ | {"total_rows": result.total_rows}, *([] if result.resumed else [said])
    )


@app.command()
def backfill(
    table: Annotated[str | None, typer.Argument(help="schema.table to backfill")] = None,
    where: Annotated[
        str | None, typer.Option("--where", help="SQL filter: backfill only matching rows")
    ] = None,
    pause: Annotated[bool, typer.Option("--pause", help="pause the running backfill")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="resume a paused backfill")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="stop the backfill of TABLE")] = False,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="start it and return without following it")
    ] = False,
) -> None:
    """Backfill a table while streaming (Debezium incremental snapshot), and follow it.

    Rows are read in key order in chunks between watermarks, so a backfilled row never
    lands in the log after a newer change of the same key. Ctrl-C stops following;
    the backfill goes on (--pause, --resume, --stop control it). With
    pipeline.read_only_backfills the signal goes through Kafka and the watermarks are
    read, not written: nothing is written to the source.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from cdc.capture.backfill import send_signal, start_backfill, watch_backfill

    s = settings()
    if pause or resume or stop:
        if sum((pause, resume, stop)) > 1:
            raise typer.BadParameter("give one of --pause, --resume, --stop")
        if stop and not table:
            raise typer.BadParameter("--stop needs the TABLE whose backfill to stop")
        kind = "pause-snapshot" if pause else "resume-snapshot" if resume else "stop-snapshot"
        data = {"type": "incremental"}
        if stop:
            data["data-collections"] = [table if "." in table else f"public.{table}"]  # type: ignore[assignment,operator]
        send_signal(s, kind, data)
        console_say(f"sent {kind}")
        return
    if not table:
        raise typer.BadParameter("name the TABLE to backfill")
    signal, offset = start_backfill(s, table, where)
    console_say(f"backfill of {table} requested" + (f" (where {where})" if where else ""))
    if no_wait:
        return
    with Progress(
        TextColumn("{task.description}", markup=False),  # names, not markup
        BarColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
        console=err,
    ) as bar:
        task = bar.add_task(table, total=1.0, detail="waiting for Debezium")

        def show(p: Any) -> None:
            detail = p.state.lower().replace("_", " ")
            if p.last_key is not None:
                detail += f", key {p.last_key} of {p.max_key}"
            bar.update(task, completed=p.fraction or 0.0, detail=detail)

        done = watch_backfill(s, offset, show, signal_id=signal)
        bar.update(task, completed=1.0, detail="completed")
    Output().emit(None, f"backfill of {table} completed: {done.rows_scanned or 0} rows read")


def _check_stores(stores: list[str]) -> None:
    """A store name that is not one: refused before anything runs."""
    from cdc.stores.registry import check_store_names

    try:
        check_store_names(stores)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


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
    a process of its own at a lower CPU priority (apply.warehouse_apart), so its work
    never holds the cache and the search index back. Runs until Ctrl-C (or, with
    --once, until it has applied what the topics hold).
    """
    from cdc.apply.job import run_apply

    s = settings()
    stores = store or list(s.apply.stores)
    _check_stores(stores)
    console_say(
        f"applying pipeline {s.pipeline.name} to {', '.join(stores)}" + (" once" if once else "")
    )
    run_apply(s, stores, once=once)


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help='Spark SQL, e.g. "SELECT count(*) FROM customers"')],
    as_of: Annotated[
        str | None,
        typer.Option("--as-of", help="Delta time travel: a version number or a timestamp"),
    ] = None,
    output: RowsOutputOption = RowsForm.text,
) -> None:
    """Run Spark SQL over the warehouse.

    Tables are registered by name: <table> (live rows of its current state),
    <table>_history (every version, SCD type 2), and each join view and window
    aggregate by its name.
    """
    from cdc.check.query import run_query
    from cdc.core.catalog import published_tables
    from cdc.core.postgres import admin_connection

    s = settings()
    with admin_connection(s) as conn:
        tables = published_tables(conn, s.pipeline.publication)
    result = run_query(s, sql, tables, as_of)
    Output(output).rows(result.columns, result.rows)


@app.command()
def search(
    table: Annotated[str, typer.Argument(help="a captured table: schema.table or its name")],
    text: Annotated[str, typer.Argument(help="words to find (simple query string syntax)")],
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, max=10_000, help="at most this many")
    ] = 10,
    output: RowsOutputOption = RowsForm.text,
) -> None:
    """Search a table's OpenSearch index; the best matches first."""
    from cdc.check.query import search_table

    s = settings()
    result = search_table(s, captured_table(s, table), text, limit)
    Output(output).rows(result.columns, result.rows)


@app.command()
def get(
    table: Annotated[str, typer.Argument(help="a captured table: schema.table or its name")],
    key: Annotated[str, typer.Argument(help='the primary key: 42, or JSON {"a": 1, "b": "x"}')],
    store: Annotated[
        str, typer.Option("--store", "-s", help=store_help("default: cache"))
    ] = "cache",
    output: OutputOption = OutputForm.text,
) -> None:
    """Read what a store holds for a row: its fields and the position that wrote them."""
    from cdc.check.query import store_entry

    _check_stores([store])
    s = settings()
    entry = store_entry(s, store, captured_table(s, table), key)
    if output is OutputForm.json:
        Output(output).emit(entry)
    else:  # a row per field
        Output(output).rows(["field", "value"], sorted(entry.items()))


@app.command()
def verify(
    table: Annotated[
        list[str] | None, typer.Option("--table", "-t", help="a captured table (repeat)")
    ] = None,
    store: Annotated[
        list[str] | None,
        typer.Option("--store", "-s", help=store_help("repeat; default: all")),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for the stores to reach the cut")
    ] = 120.0,
    repair: Annotated[
        bool,
        typer.Option("--repair", help="backfill the drifted keys (or table), then verify again"),
    ] = False,
    output: OutputOption = OutputForm.text,
) -> None:
    """Reconcile each store with the source at a consistent cut; exit 1 on drift.

    Notes the source's current LSN, waits until every store has applied past it,
    then compares row counts and per-key content hashes, narrowing to the keys that
    differ, and reports them with examples. With --repair, drifted keys are
    backfilled through the log (keys only a store has are removed from it) and the
    stores verified again once the running apply job has taken the backfill.
    """
    s = settings()
    stores = store or list(s.apply.stores)
    _check_stores(stores)
    _reconcile(s, table, stores, timeout, repair, output)


def _reconcile(
    s: Settings,
    table: list[str] | None,
    stores: list[str],
    timeout: float,
    repair: bool,
    output: OutputForm,
    quality: bool = True,
) -> None:
    """`cdc verify` of `table` (every captured one if None) in `stores`; exit 1 on drift.
    `quality`: also the expectations over the warehouse and its views' checks."""
    from cdc.apply.dead_letters import held_back
    from cdc.check.reconcile import reconcile
    from cdc.check.repair import repair as mend
    from cdc.core.catalog import published_tables
    from cdc.core.postgres import admin_connection

    with admin_connection(s) as conn:
        names = table or published_tables(conn, s.pipeline.publication)
    tables = [captured_table(s, name) for name in names]
    mending = functools.partial(mend, s, tables, say=console_say) if repair else None
    report = reconcile(s, tables, stores, timeout, mend=mending, say=console_say, quality=quality)
    report.held_back = held_back(s)
    Output(output).emit(report.as_dict(), *verify_tables(report))
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def resync(
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for the stores to reach the cut")
    ] = 600.0,
    output: OutputOption = OutputForm.text,
) -> None:
    """After PostgreSQL lost the pipeline's slot: stream again, and mend only the gap.

    The changes committed since the lost slot's last confirmed position are gone from
    the log. Makes a new slot, starts the connector on it (no new snapshot), then
    reconciles every store with the source at a cut, as `cdc verify --repair` does:
    keys changed or inserted in the gap are backfilled through the log, keys deleted
    in it are removed (the warehouse's expectations are left to `cdc verify`). Needs
    `cdc apply` running (it applies the backfills). Refuses a pipeline whose slot is
    not lost. Exits 1 if drift remains.
    """
    from cdc.capture.resync import resync_slot

    s = settings()
    result = resync_slot(s, console_say)
    console_say(
        f"streaming from {result.lsn}; the changes after {result.lost_at or 'the lost slot'} "
        "and before it are mended from the source: verifying every store"
    )
    # only what the gap changed: the expectations and the views' checks are `cdc verify`'s
    _reconcile(s, None, list(s.apply.stores), timeout, True, output, quality=False)


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
            return statuses, pipeline_status(s, connect_down=_connect_down(statuses))

        server = serve(look, port, host)
    except OSError as exc:
        raise CdcError(f"cannot listen on {host}:{port} ({exc.strerror}): use --port") from None
    console_say(f"metrics at http://{host}:{port}/metrics (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()


tables_app = typer.Typer(help="List, add and remove the pipeline's tables.", no_args_is_help=True)
app.add_typer(tables_app, name="tables")


@tables_app.command("list")
def tables_list(output: OutputOption = OutputForm.text) -> None:
    """The tables the settings select, with their keys and topics."""
    from cdc.core.catalog import resolve_tables
    from cdc.core.postgres import admin_connection

    s = settings()
    with admin_connection(s) as conn:
        tables = resolve_tables(conn, s.pipeline)
    rows = [
        {"table": t.qualified, "key": list(t.key), "topic": change_topic(s.pipeline, t.qualified)}
        for t in tables
    ]
    Output(output).emit(
        rows, *(f"{r['table']} (key {', '.join(r['key'])}) -> {r['topic']}" for r in rows)
    )


@tables_app.command("add")
def tables_add(names: Annotated[list[str], typer.Argument(help="schema.table ...")]) -> None:
    """Add tables to pipeline.tables in the settings file, capture them and backfill them."""
    _edit_tables(add=names, remove=[])


@tables_app.command("remove")
def tables_remove(names: Annotated[list[str], typer.Argument(help="schema.table ...")]) -> None:
    """Remove tables from pipeline.tables and stop capturing them (their topics stay)."""
    _edit_tables(add=[], remove=names)


def _edit_tables(add: list[str], remove: list[str]) -> None:
    from cdc.capture.source import setup_sql
    from cdc.core.config_file import edit_tables

    def check(tables: list[str]) -> None:
        # what `cdc setup` would refuse (a table that is missing or cannot be captured,
        # a bad name) is refused before the file is written: it reads, changes nothing
        setup_sql(load_settings(pipeline={"tables": tables}))

    path, tables = edit_tables(add, remove, check)
    console_say(f"{path}: pipeline.tables = {tables}")
    setup(OutputForm.text)


dlq_app = typer.Typer(
    help="The dead-letter topic: what a store refused, and a replay once it is fixed.",
    no_args_is_help=True,
)
app.add_typer(dlq_app, name="dlq")
StoreOption = Annotated[str | None, typer.Option("--store", "-s", help=store_help("default: all"))]


@dlq_app.command("list")
def dlq_list(
    store: StoreOption = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="the newest N")] = 50,
    output: OutputOption = OutputForm.text,
) -> None:
    """The dead letters: store, error, and where each change came from."""
    from cdc.apply.dead_letters import read_dead_letters

    _check_stores([store] if store else [])
    letters = read_dead_letters(settings(), store)
    shown = letters[-limit:] if limit > 0 else letters
    Output(output).emit(
        [letter.__dict__ for letter in shown],
        *(
            f"{x.offset}: {x.store} refused {x.topic}[{x.source_partition}]@{x.source_offset} "
            f"key {x.key}: {x.error}"
            for x in shown
        ),
    )
    console_say(
        f"{len(letters)} dead letter(s)"
        + (f", the newest {len(shown)} shown" if shown != letters else "")
    )


@dlq_app.command("replay")
def dlq_replay(store: StoreOption = None) -> None:
    """Apply the dead letters again once their cause is fixed: their keys are backfilled
    through the log, so every store takes the source's rows through its guarded writes.
    Each dead letter is replayed once (a replay takes those that came after the last)."""
    from cdc.apply.dead_letters import replay_dead_letters

    _check_stores([store] if store else [])
    s = settings()
    stores: list[str] = [store] if store else list(s.apply.stores)
    replayed = replay_dead_letters(s, stores, console_say)
    if not replayed:
        console_say("no dead letters to replay")
        return
    for table, keys in sorted(replayed.items()):
        console_say(f"{table}: {keys} key(s) backfilled; `cdc apply` writes them")


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
    command), a store found drifting, or a store lost.
    """
    from cdc.capture.backfill import start_backfill, watch_backfill
    from cdc.check.rebuild import reset_store

    _check_stores([store])
    s = settings()
    names = [t if "." in t else f"public.{t}" for t in table or []]
    what = f"the {store}'s copy of " + (", ".join(names) if names else "every captured table")
    if not yes:
        if not sys.stdin.isatty():
            raise typer.BadParameter(f"rebuilding {what} needs confirmation: pass --yes")
        typer.confirm(f"Empty and rebuild {what}?", abort=True)
    chosen = reset_store(s, store, names or None, console_say)
    for name in chosen:
        signal, offset = start_backfill(s, name)
        console_say(f"backfilling {name} through the log")
        done = watch_backfill(s, offset, lambda p: None, signal_id=signal)
        console_say(f"backfill of {name} completed: {done.rows_scanned or 0} rows read")
    console_say(f"now run `cdc apply` (or `cdc apply --store {store}`): it rebuilds the {store}")


@app.command()
def drop(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    drop_role: Annotated[
        bool | None,
        typer.Option(
            "--drop-role/--keep-role",
            help="also drop the replication role (when no other pipeline is set up); "
            "default: ask, or keep it when there is no terminal",
        ),
    ] = None,
) -> None:
    """Remove the pipeline's connector (with its offsets), replication slot and publication.

    The replication role loses SELECT on the tables no other pipeline captures, and
    may be dropped too. The change topics and the derived stores stay. Streaming
    stops; a new `cdc snapshot` starts the pipeline again from a fresh snapshot (a new
    generation: what it does not hold leaves each store once the store has applied it).
    """
    from cdc.capture.pipeline import drop_pipeline, drop_replication_role

    s = settings()
    pipe = s.pipeline
    what = f"connector {pipe.connector}, slot {pipe.slot}, publication {pipe.publication}"
    if not yes:
        if not sys.stdin.isatty():
            raise typer.BadParameter(f"dropping {what} needs confirmation: pass --yes")
        typer.confirm(f"Drop {what}?", abort=True)
    gone = drop_pipeline(s)
    console_say("removed " + (", ".join(gone) if gone else "nothing (there was no pipeline)"))
    role = pipe.replication_user
    if drop_role is None:
        drop_role = sys.stdin.isatty() and typer.confirm(
            f"Also drop the replication role {role}?", default=False
        )
    if not drop_role:
        console_say(f"replication role {role} kept (drop it with `cdc drop --drop-role`)")
        return
    dropped, others = drop_replication_role(s)
    if others:
        console_say(f"replication role {role} kept: still used by {', '.join(others)}")
    else:
        console_say(f"replication role {role} " + ("dropped" if dropped else "did not exist"))


def _reflowed(text: str) -> str:
    """A docstring as help: each paragraph on one line, for the terminal to wrap at its
    width (the docstring's own line breaks would cut sentences in the middle of a line)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _reflow_help(typer_app: typer.Typer) -> None:
    """Give every command of `typer_app` (and of its groups) its help reflowed, and its
    first paragraph as the line of the command list."""
    for command in typer_app.registered_commands:
        text = command.help or (command.callback.__doc__ if command.callback else None)
        if text:
            command.help = _reflowed(text)
            command.short_help = command.short_help or command.help.split("\n\n")[0]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


_reflow_help(app)


def main() -> None:
    try:
        app()
    except CdcError as exc:
        err.print(Text.assemble(("error:", "red"), " ", str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
