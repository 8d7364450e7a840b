"""The demo people run first.

The stack comes up; the demo shop (customers, products, orders, order_items) is
created and snapshotted at a known offset; capture streams; the apply job keeps the
warehouse (with a join view and a window aggregate), the search index and the cache;
a workload of shop transactions runs while a live dashboard shows events per second
per table, lag per store and dead letters; then a few queries, a search, a cache read
and `cdc verify`. Without a terminal (or with CI=true) it runs for a fixed time and
succeeds only if verify finds no drift.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from cdc.capture.pipeline import pipe_streams, sync_pipeline
from cdc.check.status import pipeline_status
from cdc.cli.workload import Workload
from cdc.core.say import Say
from cdc.core.settings import PROJECT_ROOT, Settings, load_settings, local_admin_password
from cdc.core.settings.file import add_settings, config_path
from cdc.core.settings.pipeline import ReplicaIdentity, TableChoice
from cdc.core.settings.views import (
    HoppingWindow,
    SessionWindow,
    SlidingWindow,
    StreamStreamJoin,
    StreamTableJoin,
    TableJoin,
    TumblingWindow,
)
from cdc.core.topics import change_topic, end_offsets
from cdc.stack import Stack

__all__ = [
    "DEMO_ENRICHMENT",
    "DEMO_HOPPING",
    "DEMO_JOIN",
    "DEMO_SESSIONS",
    "DEMO_SHIPPING",
    "DEMO_SLIDING",
    "DEMO_WINDOW",
    "DemoResult",
    "demo_settings",
    "keep_demo_settings",
    "run_demo",
    "with_demo_choice",
    "with_demo_views",
]

TABLES = ["public.customers", "public.products", "public.orders", "public.order_items"]
# the derived data the demo keeps in the warehouse
DEMO_JOIN = TableJoin(
    name="orders_enriched",
    table="public.orders",
    references="public.customers",
    on="customer_id",
    columns=["name", "email", "country"],
)
# each order line enriched with its product as it was when the line was inserted
DEMO_ENRICHMENT = StreamTableJoin(
    name="order_items_priced",
    kind="stream_table",
    table="public.order_items",
    references="public.products",
    on="product_id",
    columns=["name", "price"],
)
DEMO_WINDOW = TumblingWindow(name="orders_per_minute", table="public.orders", sum="total")
# revenue over the last 5 minutes, every minute
DEMO_HOPPING = HoppingWindow(
    name="revenue_5_minutes",
    table="public.orders",
    sum="total",
    kind="hopping",
    window="5 minutes",
    slide="1 minute",
)

# each order with its shipping within 30 minutes (time-to-ship), or none
DEMO_SHIPPING = StreamStreamJoin(
    name="time_to_ship",
    kind="stream_stream",
    table="public.orders",
    references="public.orders",
    on="id",
    when={"status": ["shipped"]},
    within="30 minutes",
    watermark="10 seconds",
)
# at each order: the orders and revenue of the minute up to it
DEMO_SLIDING = SlidingWindow(
    name="orders_last_minute",
    table="public.orders",
    kind="sliding",
    sum="total",
    window="1 minute",
    watermark="10 seconds",
)
# each customer's orders less than 30 seconds apart
DEMO_SESSIONS = SessionWindow(
    name="customer_sessions",
    table="public.orders",
    kind="session",
    group_by="customer_id",
    sum="total",
    gap="30 seconds",
    watermark="10 seconds",
)


DEMO_JOINS = [DEMO_JOIN, DEMO_ENRICHMENT, DEMO_SHIPPING]
DEMO_WINDOWS = [DEMO_WINDOW, DEMO_HOPPING, DEMO_SLIDING, DEMO_SESSIONS]


def with_demo_views(settings: Settings) -> Settings:
    """The settings with the demo's join view and window aggregate, unless views are set."""
    apply = settings.apply
    if apply.joins or apply.windows:
        return settings
    views = apply.model_copy(update={"joins": DEMO_JOINS, "windows": DEMO_WINDOWS})
    return settings.model_copy(update={"apply": views})


# what of the shop leaves PostgreSQL: the customers' emails hashed (the orders joined
# with their customer carry the hash) and not their free-form attributes, and only the
# products in stock (a product sold out leaves every store, and comes back with its
# restock: the filter's column needs the full replica identity)
DEMO_CHOICE = {
    "public.customers": TableChoice(exclude_columns=["attributes"], mask={"email": "hash"}),
    "public.products": TableChoice(where="in_stock > 0"),
}
DEMO_IDENTITY: dict[str, ReplicaIdentity] = {"public.products": "full"}


def with_demo_choice(settings: Settings) -> Settings:
    """The settings with the demo's choice of columns and rows, unless one is set."""
    pipe = settings.pipeline
    if pipe.table:
        return settings
    chosen = pipe.model_copy(
        update={
            "table": DEMO_CHOICE,
            "replica_identity": {**DEMO_IDENTITY, **pipe.replica_identity},
        }
    )
    return settings.model_copy(update={"pipeline": chosen})


def demo_settings(settings: Settings) -> dict[str, Any]:
    """What the demo adds to these settings (with_demo_views, with_demo_choice), as the
    settings file writes it: empty when they have views and a choice of their own."""
    added: dict[str, Any] = {}
    if not (settings.apply.joins or settings.apply.windows):
        added["apply"] = {
            "joins": [_view_entry(v) for v in DEMO_JOINS],
            "windows": [_view_entry(v) for v in DEMO_WINDOWS],
        }
    pipe = settings.pipeline
    if not pipe.table:
        chosen = {
            name: choice.model_dump(mode="json", exclude_unset=True)
            for name, choice in DEMO_CHOICE.items()
        }
        identity = {k: v for k, v in DEMO_IDENTITY.items() if k not in pipe.replica_identity}
        added["pipeline"] = {"table": chosen} | ({"replica_identity": identity} if identity else {})
    return added


def _view_entry(view: Any) -> dict[str, Any]:
    """A view's settings as its `[[apply.joins]]` or `[[apply.windows]]` entry: what the
    demo set, and its kind."""
    entry = view.model_dump(mode="json", exclude_unset=True)
    return {"name": entry.pop("name"), "kind": view.kind, **entry}


def keep_demo_settings(settings: Settings, say: Say) -> Path | None:
    """Write what the demo adds to the settings into the settings file (CDC_CONFIG, else
    ./cdc.toml; what it says already is kept), so that the commands run after the demo
    (`cdc apply`, `cdc verify`, `cdc query`, `cdc status`) capture, mask, filter and
    derive as the demo did, and find nothing changed. Returns the settings file, if there
    is one."""
    wanted = demo_settings(settings)
    if not wanted:  # views and a choice of the user's own: the file is theirs
        return config_path() if config_path().exists() else None
    path, added = add_settings(wanted)
    if added:
        say(
            f"the demo's settings are in {path} ({', '.join(added)}): `cdc` run with it "
            "reads them, so the next commands agree with the demo (edit or remove them there)"
        )
    if _chosen(load_settings()) != _chosen(with_demo_choice(with_demo_views(settings))):
        say(  # the environment gives its own: said, not hidden
            f"warning: {path} has the demo's views and choice of columns and rows, but the "
            "CDC_* environment overrides them: the commands run after the demo may find them "
            "changed (unset CDC_APPLY__JOINS, CDC_APPLY__WINDOWS, CDC_PIPELINE__TABLE)"
        )
    return path


def _chosen(settings: Settings) -> tuple[Any, ...]:
    """What of the settings the demo chooses."""
    pipe, apply = settings.pipeline, settings.apply
    return pipe.table, pipe.replica_identity, apply.joins, apply.windows


class DemoResult:
    def __init__(self) -> None:
        self.ok = False
        self.transactions = 0
        self.lag: dict[str, float | None] = {}  # per store, as the dashboard last showed it
        self.interrupted = False


def interactive() -> bool:
    return sys.stdout.isatty() and os.environ.get("CI", "").lower() not in ("1", "true", "yes")


def run_demo(
    settings: Settings,
    out: Console,
    say: Say,
    keep: bool = True,
    duration: float | None = None,
    rate: float = 50.0,
) -> DemoResult:
    """Run the demo; `duration` None runs the workload until Ctrl-C when interactive
    (else 30 s)."""
    result = DemoResult()
    if duration is None and not interactive():
        duration = 30.0
    stack = Stack(settings)
    stack.up(say)
    settings = local_admin_password(settings)  # generated as the cluster was made
    create_shop(settings, say)
    kept = keep_demo_settings(settings, say)
    settings = with_demo_choice(with_demo_views(settings))
    if pipe_streams(settings):
        say(f"pipeline {settings.pipeline.name} already streams; checking its tables")
        sync_pipeline(settings)
    else:
        from cdc.apply.snapshot_into import snapshot_into
        from cdc.capture.snapshot.initial import run_snapshot

        snap = run_snapshot(settings, out, say, snapshot_into(settings))
        out.print(
            f"initial snapshot at LSN {snap.lsn}: {snap.total_rows} rows in "
            f"{snap.seconds:.1f}s; the connector streams from that point on"
        )

    from cdc.apply.job import run_apply

    stop_apply = threading.Event()
    failure: list[BaseException] = []

    def apply() -> None:
        try:
            run_apply(settings, stop=stop_apply)
        except BaseException as exc:  # shown below
            failure.append(exc)

    say("starting the apply job (the warehouse in a process of its own, search, cache)")
    applier = threading.Thread(target=apply, name="apply", daemon=True)
    applier.start()
    workload = Workload(settings.postgres.dsn(), rate=rate)
    try:
        # the workload starts once every store holds the snapshot: from then on the
        # dashboard shows each store following the source
        _wait_for_first_batches(settings, say, failure)
        _warm_up(settings, say, workload, failure)
        say("starting the shop's workload")
        workload.start()
        try:
            _dashboard(settings, out, workload, duration, result, failure)
        except KeyboardInterrupt:  # ends the workload, not the demo
            say("Ctrl-C: the workload stops; the stores catch up, then verify runs")
        finally:
            workload.stop.set()
            if workload.is_alive():
                workload.join()
            result.transactions = sum(workload.done.values())
        say(
            "lag at the end of the workload: "
            + ", ".join(
                f"{store} {'?' if lag is None else f'{lag:.1f}s'}"
                for store, lag in sorted(result.lag.items())
            )
        )
        if workload.error is not None:
            say(f"the workload stopped: {workload.error}")
        if not failure:
            _dashboard(settings, out, workload, None, result, failure, catch_up=True)
            result.ok = _show_and_verify(settings, out, say)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        result.interrupted = True
    finally:
        workload.stop.set()
        stop_apply.set()
        applier.join(timeout=60)
    if failure:
        say(f"the apply job failed: {str(failure[0]).splitlines()[0]}")
        result.ok = False
    if not keep:
        stack.down(say=say)
    else:
        out.print(
            '\nnext: `cdc status`, `cdc query "SELECT * FROM orders_enriched LIMIT 5"`, '
            '`cdc search products "walnut"`, `cdc get customers 1`, `cdc verify`, '
            "`cdc apply` to keep applying, `cdc metrics` for Prometheus, `cdc down` to stop"
            + (f" (they read the demo's settings in {kept})" if kept else "")
        )
    return result


def create_shop(settings: Settings, say: Say) -> None:
    say("creating the demo shop (sql/demo_schema.sql)")
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute((PROJECT_ROOT / "sql" / "demo_schema.sql").read_text())
        count = conn.execute("SELECT count(*) FROM customers").fetchone()
        if count and count[0] == 0:
            say("adding the demo rows (sql/demo_seed.sql)")
            with conn.transaction():
                conn.execute((PROJECT_ROOT / "sql" / "demo_seed.sql").read_text())


def _wait_for_first_batches(
    settings: Settings,
    say: Say,
    failure: list[BaseException],
    timeout: float = 600.0,
) -> None:
    """Wait until every store has finished its first batch (the snapshot's rows), and
    each view kept by a query of its own its first, saying which have, for at most
    `timeout` seconds: the workload then meets warm queries, not their first plans."""
    from cdc.log.checkpoints import checkpoint
    from cdc.stores.registry import derived_views

    started = time.monotonic()
    said: set[str] = set()
    wanted = list(settings.apply.stores)
    door = derived_views(settings, wanted)
    queries = [q.label for q in door.queries(door.of(settings))] if door is not None else []
    while time.monotonic() - started < timeout and not failure:
        stores = pipeline_status(settings, TABLES).stores
        done = {s for s in wanted if s in stores and not stores[s].get("nothing_applied")}
        for store in sorted(done - said):
            say(f"{store}: holds the snapshot ({time.monotonic() - started:.0f}s)")
        said |= done
        ran = {n for n in queries if checkpoint(settings, n).last_committed_batch() is not None}
        if said >= set(wanted) and ran >= set(queries):
            if queries:
                say(f"the views' queries ran their first batch ({time.monotonic() - started:.0f}s)")
            return
        time.sleep(1)


def _warm_up(
    settings: Settings,
    say: Say,
    workload: Workload,
    failure: list[BaseException],
    timeout: float = 300.0,
) -> None:
    """One transaction of each kind of the workload, then wait (at most `timeout`
    seconds) until every store has applied them and each view kept by a query of its
    own has run a batch since: a store's first batch of changes plans and compiles what
    its snapshot's did not need, and on 2 cores that takes the warehouse half a minute;
    the workload then meets stores that have done it once."""
    from cdc.log.checkpoints import checkpoint
    from cdc.stores.registry import derived_views

    started = time.monotonic()
    topics = [change_topic(settings.pipeline, t) for t in TABLES]
    door = derived_views(settings, settings.apply.stores)
    queries = (
        [checkpoint(settings, q.label) for q in door.queries(door.of(settings))]
        if door is not None
        else []
    )

    def newest(query: Any) -> int:
        found = query.last_committed_batch()
        return -1 if found is None else found

    def logged() -> int:
        return sum(sum(parts.values()) for parts in end_offsets(settings.kafka, topics).values())

    ran = {q: newest(q) for q in queries}
    before = logged()
    say("warming the stores up: one transaction of each kind the workload runs")
    workload.once_each()
    arrived = False
    while time.monotonic() - started < timeout and not failure:
        arrived = arrived or logged() > before
        stores = pipeline_status(settings, TABLES).stores if arrived else {}
        applied = arrived and all(
            s in stores and not stores[s].get("backlog_events") for s in settings.apply.stores
        )
        later = all(newest(q) > ran[q] for q in queries)
        if applied and later:
            say(f"the stores applied the warm-up ({time.monotonic() - started:.0f}s)")
            return
        time.sleep(1)
    if not failure:
        say("the warm-up is not applied everywhere yet; starting the workload anyway")


def _dashboard(
    settings: Settings,
    out: Console,
    workload: Workload,
    duration: float | None,
    result: DemoResult,
    failure: list[BaseException],
    catch_up: bool = False,
) -> None:
    """Refresh the dashboard every second until `duration` is over (or Ctrl-C); with
    `catch_up`, until every store has applied the whole log (at most 10 minutes).
    Without a terminal, a snapshot every 10 s (each status read costs every component
    some CPU, which the stores' batches need on a small machine), and one at the end."""
    topics = {change_topic(settings.pipeline, t): t for t in TABLES}
    started = time.monotonic()
    last: dict[str, int] = {}
    last_at = started
    rates: dict[str, float] = {}
    live = Live(console=out, auto_refresh=False, transient=False) if interactive() else None
    printed = 0.0
    if live:
        live.start()
    if catch_up:
        duration = 600.0
    try:
        while duration is None or time.monotonic() - started < duration:
            if failure or (workload.error is not None and not catch_up):
                break
            time.sleep(1)
            now = time.monotonic()
            if not (live or catch_up or now - printed >= 10):
                continue  # without a terminal, a status only for each snapshot printed
            ends = {
                t: sum(parts.values())
                for t, parts in end_offsets(settings.kafka, list(topics)).items()
            }
            if last:
                rates = {t: (ends[t] - last.get(t, 0)) / (now - last_at) for t in ends}
            last, last_at = ends, now
            status = pipeline_status(settings, TABLES)
            if not catch_up:
                result.lag = {s: f.get("lag_s") for s, f in status.stores.items()}
            caught_up = all(
                status.stores.get(s, {}).get("backlog_events") == 0 for s in settings.apply.stores
            )
            view = _view(
                topics,
                rates,
                status,
                workload,
                now - started,
                None if catch_up else duration,
                settings.apply.stores,
                "caught up" if caught_up else "catching up" if catch_up else None,
            )
            if live:
                live.update(view, refresh=True)
            elif now - printed >= 10 or (catch_up and caught_up):
                out.print(view)  # without a terminal: a snapshot every 10 s
                printed = now
            if catch_up and caught_up:
                break
        if not (live or catch_up or failure):  # the lag as the workload ends
            status = pipeline_status(settings, TABLES)
            result.lag = {s: f.get("lag_s") for s, f in status.stores.items()}
    finally:
        if live:
            live.stop()


def _view(
    topics: dict[str, str],
    rates: dict[str, float],
    status: Any,
    workload: Workload,
    elapsed: float,
    duration: float | None,
    applying: Iterable[str] = (),
    phase: str | None = None,
) -> Group:
    if phase is not None:  # after the workload
        left = f"the workload has stopped; the stores are {phase}"
    elif duration is None:
        left = "Ctrl-C ends the workload"
    else:
        left = f"{max(0, duration - elapsed):.0f}s left"
    tables = Table(title=f"cdc demo: {elapsed:.0f}s, {left}", title_justify="left")
    tables.add_column("table")
    tables.add_column("events/s", justify="right")
    tables.add_column("in the log", justify="right")
    for topic, table in topics.items():
        tables.add_row(table, f"{rates.get(topic, 0):.0f}", str(status.topics.get(topic, 0)))
    stores = Table()
    for column in ("store", "backlog (events)", "lag (s)", "visible after commit (p50/p99)"):
        stores.add_column(column, justify="right" if column != "store" else "left")
    capture = status.capture or {}
    if capture:  # commit → in Kafka: every store is at least this far behind
        lag = capture.get("lag_s")
        shown = "?" if lag is None else f"{lag:.1f}"
        if capture.get("stalled"):
            shown = f"[red]{shown} (stalled)[/red]"
        stores.add_row("capture (into Kafka)", "–", shown, "–")
    for store, figures in status.stores.items():
        lag = figures.get("lag_s")
        backlog = str(figures["backlog_events"])
        if figures.get("nothing_applied"):  # lag counted from the snapshot
            backlog += " [dim](first batch running)[/dim]"
        if figures.get("waiting"):  # the store does not answer: its batch waits
            backlog += f" [yellow](waiting: {figures['waiting']['reason']})[/yellow]"
        stores.add_row(
            store,
            backlog,
            "?" if lag is None else f"{lag:.1f}",
            _freshness(figures.get("freshness") or {}),
        )
    for store in applying:
        if store not in status.stores:  # no batch has finished, and the log is empty
            stores.add_row(store, "[dim]first batch running[/dim]", "–", "–")
    done = sum(workload.done.values())
    dead = f"[red]{status.dead_letters}[/red]" if status.dead_letters else "0"
    footer = f"workload: {done} transactions ({workload.rate:.0f}/s target); dead letters: {dead}"
    return Group(tables, stores, footer)


def _freshness(fresh: dict[str, Any]) -> str:
    """A store's commit-to-visible p50/p99 over the window, and its SLO."""
    if fresh.get("p99_s") is None:
        return "–"
    shown = f"{fresh['p50_s']:.1f}s / {fresh['p99_s']:.1f}s"
    if fresh.get("slo_s") is not None:
        verdict = "[red]breached[/red]" if fresh.get("breached") else "[green]met[/green]"
        shown += f" (SLO {fresh['slo_s']:g}s {verdict})"
    return shown


def _show_and_verify(settings: Settings, out: Console, say: Say) -> bool:
    """A few queries, a search and a cache read, then verify; True when nothing drifted."""
    from cdc.check.query import run_query, search_table, store_entry
    from cdc.check.reconcile import reconcile
    from cdc.cli.render import verify_tables
    from cdc.core.catalog import describe_table
    from cdc.core.postgres_client import admin_connection

    with admin_connection(settings) as conn:
        tables = [describe_table(conn, name, settings.pipeline) for name in TABLES]
    # the first warehouse batch holds the whole snapshot: on 2 cores it takes minutes
    report = reconcile(settings, tables, list(settings.apply.stores), 900, say=say)
    for sql in (
        "SELECT status, count(*) AS orders, sum(total) AS revenue FROM orders "
        "GROUP BY status ORDER BY status",
        "SELECT id, status, total, customer_name, customer_country FROM orders_enriched "
        "ORDER BY id DESC LIMIT 5",
        "SELECT window_start, rows AS orders, total AS revenue FROM orders_per_minute "
        "ORDER BY window_start DESC LIMIT 3",
        "SELECT window_start, window_end, total AS revenue FROM revenue_5_minutes "
        "ORDER BY window_start DESC LIMIT 3",
        # the price the line was sold at, and the product's price when it was inserted
        "SELECT order_id, line, quantity, unit_price, product_name, product_price "
        "FROM order_items_priced ORDER BY event_ts DESC, order_id DESC, line LIMIT 5",
        # the minute up to each order (written once the watermark has passed it)
        "SELECT window_end, rows AS orders, total AS revenue FROM orders_last_minute "
        "ORDER BY window_end DESC LIMIT 3",
        # orders shipped within 30 minutes of their creation (the rest once it has passed)
        "SELECT id, start_ts, end_ts, elapsed_s FROM time_to_ship WHERE end_ts IS NOT NULL "
        "ORDER BY start_ts DESC LIMIT 5",
        # customers' sessions, once 30 seconds without an order have passed
        "SELECT customer_id, window_start, window_end, rows AS orders, total "
        "FROM customer_sessions ORDER BY window_end DESC, customer_id LIMIT 5",
    ):
        answer = run_query(settings, sql, TABLES)
        table = Table(*answer.columns, title=f"cdc query {sql!r}", title_justify="left")
        for row in answer.rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        out.print(table)
    found = search_table(settings, tables[1], "walnut lamp", limit=3)
    out.print(f'cdc search products "walnut lamp": {[row[2] for row in found.rows]}')
    entry = store_entry(settings, "cache", tables[0], "1")
    out.print(f"cdc get customers 1: {entry.get('name')}, balance {entry.get('balance')}")
    for part in verify_tables(report):
        out.print(part)
    return report.ok
