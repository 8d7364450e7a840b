"""The reading and mending commands: verify, query, search, get and dlq."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from cdc.cli.base import (
    OutputOption,
    RowsOutputOption,
    app,
    check_stores,
    console_say,
    settings,
)
from cdc.cli.output import Output, OutputForm, RowsForm
from cdc.cli.render import verify_tables
from cdc.core.catalog import captured_table
from cdc.core.settings import Settings
from cdc.core.store_declarations import store_help


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
    from cdc.core.postgres_client import admin_connection

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

    check_stores([store])
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
    differ, and reports them with examples. A large table is compared on Spark's
    executors, a small one in this process (verify.engine). With --repair, drifted keys are
    backfilled through the log (keys only a store has are removed from it) and the
    stores verified again at those keys once the running apply job has taken the
    backfill.
    """
    s = settings()
    stores = store or list(s.apply.stores)
    check_stores(stores)
    reconcile(s, table, stores, timeout, repair, output)


def reconcile(
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
    from cdc.check.dead_letters import held_back
    from cdc.check.reconcile import reconcile
    from cdc.check.repair import repair as mend
    from cdc.core.catalog import published_tables
    from cdc.core.postgres_client import admin_connection

    with admin_connection(s) as conn:
        names = table or published_tables(conn, s.pipeline.publication)
    tables = [captured_table(s, name) for name in names]
    mending = functools.partial(mend, s, tables, say=console_say) if repair else None
    report = reconcile(s, tables, stores, timeout, mend=mending, say=console_say, quality=quality)
    report.held_back = held_back(s)
    Output(output).emit(report.as_dict(), *verify_tables(report))
    if not report.ok:
        raise typer.Exit(1)


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
    from cdc.check.dead_letters import read_dead_letters

    check_stores([store] if store else [])
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
    from cdc.check.dead_letters import replay_dead_letters

    check_stores([store] if store else [])
    s = settings()
    stores: list[str] = [store] if store else list(s.apply.stores)
    replayed = replay_dead_letters(s, stores, console_say)
    if not replayed:
        console_say("no dead letters to replay")
        return
    for table, keys in sorted(replayed.items()):
        console_say(f"{table}: {keys} key(s) backfilled; `cdc apply` writes them")
