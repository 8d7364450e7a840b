"""The capture's commands: setup, snapshot, backfill, resync, tables and drop."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from cdc.cli.base import (
    OutputOption,
    app,
    console_say,
    err,
    settings,
)
from cdc.cli.commands.check import reconcile
from cdc.cli.output import Output, OutputForm
from cdc.core.settings import load_settings
from cdc.core.topics import change_topic


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
        from cdc.capture.source_setup import setup_sql

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
    for line in [*result.stores, *result.notes]:
        console_say(line)


@app.command()
def snapshot(output: OutputOption = OutputForm.text) -> None:
    """Take the initial snapshot at the slot's consistent point, then start streaming.

    Creates the slot with an exported snapshot, reads every captured table under
    it in parallel (Spark), writes the rows as op "r" events to the change topics,
    and only then starts the Debezium connector on that slot (snapshot.mode=no_data).
    The same read also writes the stores that take it (the warehouse's tables:
    pipeline.snapshot_into_stores), whose apply then skips those records. Safe to rerun:
    an interrupted snapshot resumes, reading only the CTID ranges it had not written
    (backfilled while streaming from the slot); one that wrote none, or whose slot is
    gone, starts again.
    """
    from cdc.apply.snapshot_into import snapshot_into
    from cdc.capture.snapshot.initial import run_snapshot

    chosen = settings()
    result = run_snapshot(chosen, err, console_say, snapshot_into(chosen))
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
    reconcile(s, None, list(s.apply.stores), timeout, True, output, quality=False)


tables_app = typer.Typer(help="List, add and remove the pipeline's tables.", no_args_is_help=True)
app.add_typer(tables_app, name="tables")


@tables_app.command("list")
def tables_list(output: OutputOption = OutputForm.text) -> None:
    """The tables the settings select, with their keys and topics."""
    from cdc.core.catalog import resolve_tables
    from cdc.core.postgres_client import admin_connection

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
    from cdc.capture.source_setup import setup_sql
    from cdc.core.settings.file import edit_tables

    def check(tables: list[str]) -> None:
        # what `cdc setup` would refuse (a table that is missing or cannot be captured,
        # a bad name) is refused before the file is written: it reads, changes nothing
        setup_sql(load_settings(pipeline={"tables": tables}))

    path, tables = edit_tables(add, remove, check)
    console_say(f"{path}: pipeline.tables = {tables}")
    setup(OutputForm.text)


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
