"""The initial snapshot, taken at the slot's consistent point (contract point 2).

1. prepare the source (role, publication, tables) and the change topics;
2. create the slot with an exported snapshot;
3. read every captured table under that snapshot, in parallel CTID ranges, with
   Spark; PostgreSQL formats each row as a Debezium `op: "r"` event and Spark
   writes it to the table's change topic with the key Debezium would write;
4. mark the snapshot done, then start the connector on that slot with
   snapshot.mode=no_data, its offset set to the slot's consistent point (created
   stopped, offset set, resumed): it streams exactly what committed after the point,
   whatever offset an earlier generation left under the connector's name.

The ranges are written a few at a time, and each group, once in Kafka, is recorded
(cdc.snapshot_ranges) with its table's identity (relation, partitions and files, as
they were before the slot was made) beside the consistent point and the snapshot's
xmin. A run that stops before 4 leaves state `running`. The next run resumes it when
it had recorded ranges: the exported snapshot died with its session, so it writes the
rows the interrupted run had not written in two parts. Those outside the recorded
ranges that no transaction wrote since the snapshot are as the snapshot saw them:
Spark reads them under a snapshot of now and writes them as the consistent point's
events, before the connector starts at the point. Every row version written since
(an UPDATE may have moved a row into a recorded range) is then backfilled while
streaming (Debezium's watermarked incremental snapshot), as before. A table whose
files changed meanwhile (VACUUM FULL) is read so whole; one whose rows the first run
wrote may belong to another relation now (dropped and created again, a partition
detached or dropped, truncated while its trigger was missing) is cut first, in every
store, then backfilled whole. Otherwise the run drops the unused slot, removes what
the interrupted run wrote and starts again.

With stores that take the snapshot's rows themselves (`into`: the warehouse, made by the
command, cdc/apply/snapshot_into.py), each group is cached once read, written to Kafka,
then handed to them as Kafka records (each row's partition as Kafka's producers pick it,
an offset no lower than its record's): their apply skips what they hold so
(cdc/capture/snapshot_held.py).

Between two groups the snapshot holds no lock: a rewrite (VACUUM FULL, CLUSTER, pg_repack,
ALTER TABLE … TYPE) may run there and move rows the copy has not read into pages it has
read. After each group the identity of its tables is read again; the copy of a table
whose files changed stops, and the run ends as a resumed one does, so that table is
backfilled whole. A table dropped meanwhile (and created again) stops the run with an
error: the rerun resumes, with the publication set up for the new relation, and cuts it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Protocol

import psycopg
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cdc.capture import pending
from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import register_connector
from cdc.capture.generation import record_generation
from cdc.capture.rewrites import record_schemas
from cdc.capture.role import replication_password
from cdc.capture.slot import (
    RESNAPSHOT,
    InFlight,
    SnapshotPoint,
    drop_slot,
    exported_snapshot,
    int_to_lsn,
    lsn_to_int,
    slot_lost,
    slot_state,
)
from cdc.capture.snapshot_events import envelope, event_query
from cdc.capture.snapshot_held import forget_held
from cdc.capture.snapshots import (
    ReadRange,
    mark_done,
    mark_point,
    mark_running,
    read_ranges,
    read_state,
    record_ranges,
    resume_point,
)
from cdc.capture.source_setup import (
    TRUNCATE_TRIGGER,
    prepare_source,
    replication_dsn,
    sync_truncate_triggers,
)
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.errors import ConnectorError, SnapshotError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.spark import jdbc_ssl_options, kafka_options, spark_session
from cdc.core.topics import (
    change_topic,
    change_topic_spec,
    dead_letter_topic,
    end_offsets,
    ensure_topics,
    key_partition,
    pipeline_topic_specs,
    read_topic,
    truncate_topics,
)

__all__ = [
    "SnapshotInto",
    "SnapshotResult",
    "ctid_clause",
    "page_ranges",
    "relation_kept",
    "run_snapshot",
    "unread_rows",
]

log = logging.getLogger(__name__)


# a group of snapshot events into the stores that take them: the group's Kafka records
# (key, value, topic, partition, offset), the end offset of each "topic:partition" once
# the group is in Kafka, and how many records the group wrote
IntoStores = Callable[[Any, dict[str, int], int], None]


class SnapshotInto(Protocol):
    """The stores a snapshot writes itself beside the change topics (made by the command
    that runs it: cdc/apply/snapshot_into.py; this floor makes no store)."""

    def writing(
        self, spark: Any, lsn: int, say: Say
    ) -> contextlib.AbstractContextManager[IntoStores | None]:
        """While the copy runs: the function that writes a group into the stores (None:
        no store takes it now)."""
        ...


@dataclass
class SnapshotResult:
    lsn: str
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False  # only the connector had to be started
    continued: bool = False  # an interrupted snapshot finished by backfilling the rest

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def page_ranges(pages: int, pages_per_reader: int) -> list[tuple[int, int | None]]:
    """A table's pages split into ranges [first, end) of `pages_per_reader` pages.

    The last range is open-ended (end None): relpages is an estimate and the table may
    have grown."""
    count = max(1, math.ceil(pages / pages_per_reader))
    firsts = [i * pages_per_reader for i in range(count)]
    return list(zip(firsts, [*firsts[1:], None], strict=True))


def ctid_clause(first: int, end: int | None) -> str:
    """The WHERE clause of the rows in pages [first, end)."""
    parts = [f"ctid >= '({first},0)'::tid"] if first > 0 else []
    parts += [f"ctid < '({end},0)'::tid"] if end is not None else []
    return " AND ".join(parts) or "true"


def unread_rows(read: list[tuple[int, int | None]], xmin: int) -> str | None:
    """The filter of the rows an interrupted snapshot did not write: those outside the
    page ranges `read`, and every row version a transaction at or after `xmin` (the
    snapshot's oldest in progress, an xid8) wrote, as an UPDATE may have moved a row
    into a range read. None: nothing to read (every page was); "true": everything.

    A row version's xmin is a 32-bit xid: it counts as newer when it is less than 2^31
    ahead of the snapshot's, modulo 2^32, which holds for every xid written since (a
    version frozen over 2^31 xids ago may count too, and is only read again)."""
    done = _written(read)
    if done is None:
        return "true"
    if done == "true":
        return None
    return f"(NOT ({done}) OR {newer_rows(xmin)})"


def unchanged_unread_rows(read: list[tuple[int, int | None]], xmin: int) -> str | None:
    """The rows of unread_rows that no transaction wrote since the snapshot: outside the
    page ranges `read`, and not newer_rows. Each is as the snapshot saw it (it was
    there, committed, and nothing changed it since), so it is read now as the snapshot's
    row. None: there are none."""
    done = _written(read)
    if done == "true":
        return None
    return f"NOT {newer_rows(xmin)}" + (f" AND NOT ({done})" if done else "")


def newer_rows(xmin: int) -> str:
    """The filter of the row versions a transaction at or after `xmin` (an xid8) wrote."""
    return f"(((xmin::text::bigint - {xmin % 2**32} + 4294967296) % 4294967296) < 2147483648)"


def _written(read: list[tuple[int, int | None]]) -> str | None:
    """The filter of the rows in the page ranges `read`: None when there are none,
    "true" when they cover every page."""
    merged: list[list[Any]] = []
    for first, end in sorted(read, key=lambda r: r[0]):
        if merged:
            last = merged[-1]
            if last[1] is None:  # read to the end already
                continue
            if first <= last[1]:
                last[1] = None if end is None else max(last[1], end)
                continue
        merged.append([first, end])
    if not merged:
        return None
    if merged == [[0, None]]:
        return "true"
    return " OR ".join(f"({ctid_clause(first, end)})" for first, end in merged)


def _partitions(files: str) -> set[int] | None:
    """The relations a table's files (_identity) name, or None for files recorded before
    they named them (one number per relation: which ones is unknown)."""
    if ":" not in files:
        return None
    return {int(part.split(":", 1)[0]) for part in files.split(",")}


def relation_kept(recorded: list[ReadRange], files: str, truncate_logged: bool) -> bool:
    """Whether every row an interrupted snapshot wrote of a table is still one of its rows
    or left it through the log, so that its backfill needs no cut first. `recorded` are
    its ranges under the relation the table is now, `files` its files now (_identity),
    `truncate_logged` whether a TRUNCATE of it since the snapshot is in the log.

    Not kept: no range names its relation (created again: the rows written were another
    relation's; or none recorded, yet a group may be in Kafka unrecorded); a partition
    recorded with its ranges is no longer one of its partitions (PostgreSQL publishes no
    delete for a detached or dropped partition's rows); its files changed, which a
    TRUNCATE also does, and a TRUNCATE would not be in the log."""
    if not recorded:
        return False
    now = _partitions(files)
    for read in recorded:
        then = _partitions(read.files)
        if now is None or then is None or not then <= now:
            return False
    return truncate_logged or all(r.files == files for r in recorded)


def run_snapshot(
    settings: Settings,
    console: Console,
    say: Say = quiet,
    into: SnapshotInto | None = None,
) -> SnapshotResult:
    """Take the pipeline's initial snapshot and start streaming after it (idempotent);
    `into`: stores that take its rows themselves (module doc)."""
    pipe = settings.pipeline
    started = time.monotonic()
    say(f"preparing the source for pipeline {pipe.name}")
    tables = prepare_source(settings)
    ensure_topics(
        settings.kafka,
        pipeline_topic_specs(settings.pipeline, [t.qualified for t in tables]),
    )
    connector = connect_client(settings).connectors().get(pipe.connector)
    # a connector stays STOPPED if its start was interrupted: a rerun starts it
    stopped = (connector or {}).get("status", {}).get("connector", {}).get("state") == "STOPPED"

    with admin_connection(settings) as conn:
        conn.autocommit = True
        state = read_state(conn, pipe.name)
        slot = slot_state(conn, pipe.slot)
        if state is not None and state.status == "done" and slot is not None:
            if slot_lost(conn, pipe.slot):
                raise SnapshotError(
                    f"slot {pipe.slot} of pipeline {pipe.name} is lost (PostgreSQL removed "
                    "the WAL it kept): the changes since the last confirmed position are gone; "
                    f"{RESNAPSHOT}"
                )
            if connector is not None and not stopped:
                raise SnapshotError(
                    f"pipeline {pipe.name} already took its snapshot and streams; to load rows "
                    "again use `cdc backfill TABLE`, or `cdc drop` then `cdc snapshot`"
                )
            say(f"snapshot at {state.lsn} is complete; starting the connector on slot {pipe.slot}")
            # at the snapshot's point, unless Connect holds this generation's offset already
            start_lsn = lsn_to_int(state.lsn) if state.lsn else None
            register_connector(settings, tables, start_lsn=start_lsn)
            return SnapshotResult(lsn=state.lsn or "", resumed=True)
        resume = _resumable(conn, settings, state, slot, connector is not None)
        if resume is not None:
            ranges, (xmin, ts_ms) = resume
        elif connector is not None:
            raise SnapshotError(
                f"connector {pipe.connector} exists but pipeline {pipe.name} has no complete "
                "snapshot; remove it first with `cdc drop`"
            )
        if resume is None and slot is not None:
            active, pid = slot
            if active:
                raise SnapshotError(
                    f"replication slot {pipe.slot} is in use by pid {pid}; stop whatever reads "
                    "it, or give this pipeline another name (pipeline.name)"
                )
            say(f"dropping slot {pipe.slot} of an interrupted snapshot; starting again")
            drop_slot(conn, pipe.slot)
        elif resume is None and state is not None and state.status == "running":
            say(f"the slot of an interrupted snapshot is gone ({pipe.slot}); starting again")
        # an attempt stopped before it recorded a range: the stores may hold rows it wrote
        # (at its point), which the new generation removes once it is whole
        interrupted = (
            lsn_to_int(state.lsn)
            if resume is None and state is not None and state.status == "running" and state.lsn
            else None
        )
        if resume is None:
            mark_running(conn, pipe.name, pipe.slot)
    if resume is not None:
        assert state is not None and state.lsn is not None
        point = SnapshotPoint(lsn_to_int(state.lsn), ts_ms, "")
        return _resume(settings, tables, point, ranges, xmin, console, say, started)

    # what an interrupted run wrote goes; offsets keep growing, so no position is reused
    forget_held(settings)
    truncate_topics(settings.kafka, [change_topic_spec(pipe, t.qualified) for t in tables])

    def waiting(blockers: list[InFlight]) -> None:
        say(
            f"creating slot {pipe.slot} waits for {len(blockers)} transaction(s) in flight "
            "to end: " + "; ".join(str(b) for b in blockers[:3])
        )

    # each table's identity before the snapshot exists: a rewrite from here on is found
    # after the copy's next group of its ranges (_copy_tables)
    with admin_connection(settings) as conn:
        identities = {t.qualified: _identity(conn, t) for t in tables}
    say(f"creating slot {pipe.slot} with an exported snapshot")
    spark = spark_session(settings, f"cdc-snapshot-{pipe.name}")
    # the locks of the stores the snapshot writes itself, held until they have every group
    # (after the connector starts: their apply waits for them, the others stream)
    with contextlib.ExitStack() as stack:
        with exported_snapshot(
            replication_dsn(settings, replication=True), settings.postgres.dsn(), pipe.slot, waiting
        ) as point:
            lsn = int_to_lsn(point.lsn)
            with admin_connection(settings) as conn:  # what a run after a crash resumes from
                conn.autocommit = True
                mark_point(conn, pipe.name, lsn, point.ts_ms, _snapshot_xmin(settings, point))
            say(f"snapshot {point.snapshot_name} at LSN {lsn}: reading {len(tables)} table(s)")
            write_into = stack.enter_context(into.writing(spark, point.lsn, say)) if into else None
            stores = _IntoStores(write_into)
            stack.callback(stores.close)  # its thread ends before the stores' locks do
            rows, changed = _copy_tables(
                settings, spark, tables, point, console, identities, stores
            )
        if changed:
            say(
                f"changed during the copy: {', '.join(changed)} (rewritten by VACUUM FULL, "
                "CLUSTER, pg_repack or ALTER TABLE, truncated, or partitions attached or "
                "detached); the copy of each stopped there: streaming starts, and each is "
                "backfilled whole as a resumed snapshot does"
            )
            with admin_connection(settings) as conn:
                ranges = read_ranges(conn, pipe.name)
                resumed = resume_point(conn, pipe.name)
            assert resumed is not None  # mark_point recorded it
            result = _resume(
                settings,
                tables,
                point,
                ranges,
                resumed[0],
                console,
                say,
                started,
                interrupted,
                spark,
            )
            stores.done(say)
            return result
        # a generation: stores that hold it whole drop what they hold from before it
        record_generation(
            settings,
            point.lsn,
            point.ts_ms,
            [change_topic(pipe, t.qualified) for t in tables],
            earlier=interrupted,
        )
        # the columns the snapshot's rows hold: DDL after it that changes values unseen is
        # found by the apply job (cdc/capture/rewrites.py)
        record_schemas(settings, tables)

        with admin_connection(settings) as conn:
            conn.autocommit = True
            mark_done(conn, pipe.name, lsn, point.ts_ms, sum(rows.values()))
        say(f"snapshot done: {sum(rows.values())} rows; starting the connector on slot {pipe.slot}")
        try:
            # a new generation: the connector starts at the slot's consistent point, whatever
            # offset an earlier connector of this name left in Connect (contract point 11)
            register_connector(settings, tables, start_lsn=point.lsn, start_ts_ms=point.ts_ms)
        except ConnectorError as exc:
            raise ConnectorError(
                f"{exc} (the snapshot is complete and kept: rerun `cdc snapshot` to start "
                "streaming)"
            ) from None
        with admin_connection(settings) as conn:
            sync_truncate_triggers(conn)  # those a busy table kept setup from installing
        stores.done(say)  # streaming meanwhile: the stores' apply waits for their lock
        return SnapshotResult(lsn=lsn, rows=rows, seconds=time.monotonic() - started)


def _resumable(
    conn: Any, settings: Settings, state: Any, slot: Any, has_connector: bool
) -> tuple[list[ReadRange], tuple[int, int]] | None:
    """What an interrupted snapshot left to resume from (its recorded ranges, xmin and
    time), or None when it must start again: no point or no range recorded, its slot
    gone, lost, or read by something other than the pipeline's connector."""
    pipe = settings.pipeline
    if state is None or state.status != "running" or slot is None:
        return None
    if slot[0] and not has_connector:  # read by someone else: refused below
        return None
    point = resume_point(conn, pipe.name)
    if point is None or slot_lost(conn, pipe.slot):
        return None
    ranges = read_ranges(conn, pipe.name)
    if not ranges and not has_connector:
        return None
    return ranges, point


def _snapshot_xmin(settings: Settings, point: SnapshotPoint) -> int:
    """The exported snapshot's xmin (an xid8): every transaction before it is over."""
    with psycopg.connect(replication_dsn(settings), connect_timeout=10) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute(f"SET TRANSACTION SNAPSHOT '{point.snapshot_name}'")
        row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return int(row[0])


def _identity(conn: Any, table: Table) -> tuple[int, str]:
    """The table's relation and its files: `relid:filenode` of each relation in its
    partition tree (the table alone when it has no partitions), by relid. A rewrite
    (VACUUM FULL, CLUSTER, pg_repack, ALTER TABLE … TYPE, TRUNCATE) gives a relation new
    files; a partition attached, detached or dropped changes the list."""
    # (pg_partition_tree has no row for a table that is not partitioned)
    row = conn.execute(
        "SELECT c.oid, (SELECT string_agg(t.relid::oid::text || ':' || "
        "coalesce(pg_relation_filenode(t.relid), 0)::text, ',' ORDER BY t.relid) "
        "FROM (SELECT c.oid::regclass AS relid "
        "UNION SELECT relid FROM pg_partition_tree(c.oid)) t) "
        "FROM pg_class c WHERE c.oid = to_regclass(%s)",
        (table.regclass,),
    ).fetchone()
    if row is None:
        raise SnapshotError(
            f"table {table.qualified} was dropped while the snapshot read it: run `cdc "
            "snapshot` again (it resumes; take the table out of pipeline.tables if it names it)"
        )
    return int(row[0]), str(row[1])


def _truncate_logged(conn: Any, relid: int, xmin: int) -> bool:
    """Whether any TRUNCATE of relation `relid` since the snapshot (whose xmin, an xid8, is
    `xmin`) is in the log: its trigger (cdc_record_truncate) was made by a transaction
    older than any the snapshot saw in progress, so before the snapshot (a TRUNCATE and
    CREATE TRIGGER wait for each other's lock: none since slipped past it). A trigger
    frozen over 2^31 transactions ago counts as not logged (a needless cut)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s AND tgname = %s "
        "AND ((%s - xmin::text::bigint + 4294967296) %% 4294967296) BETWEEN 1 AND 2147483647)",
        (relid, TRUNCATE_TRIGGER, xmin % 2**32),
    ).fetchone()
    return bool(row and row[0])


def _resume(
    settings: Settings,
    tables: list[Table],
    point: SnapshotPoint,
    ranges: list[ReadRange],
    xmin: int,
    console: Console,
    say: Say,
    started: float,
    earlier: int | None = None,
    spark: Any = None,
) -> SnapshotResult:
    """Finish an interrupted snapshot: the rows it had not written (unread_rows) into the
    log, and stream from its slot's consistent point; then mark it done, as a run that
    was not interrupted does.

    Before the connector exists, Spark reads those of them that no transaction wrote
    since the snapshot (unchanged_unread_rows: each is the row the snapshot saw) and
    writes them as the consistent point's snapshot events, before any change streamed
    after the point (_read_rest). The row versions written since (newer_rows), where
    there are any, are then backfilled by Debezium's watermarked incremental snapshot, as
    `cdc backfill` does: each at the position of the commit it was read after, so no
    store or history holds a later value at the snapshot's position. So are all of them
    once the connector streams (a resume interrupted after it started), and a table
    rewritten during Spark's read.

    A table whose written rows may not all be its own rows now (relation_kept: created
    again, a partition gone) is cut first, as `cdc setup` cuts one (every store drops
    what it held of it), and backfilled whole by Debezium. The cut commits before the
    backfill's signal, so it sits in the log before every row the backfill writes; a run
    stopped after it cuts again (a second cut before a whole backfill changes nothing)."""
    pipe = settings.pipeline
    lsn = int_to_lsn(point.lsn)
    topics = [change_topic(pipe, t.qualified) for t in tables]
    written = {t: sum(p.values()) for t, p in end_offsets(settings.kafka, topics).items()}
    plans: dict[str, str] = {}  # what Debezium backfills, per table
    here: dict[str, str] = {}  # what Spark reads first, per table
    cuts: list[str] = []
    streams = connect_client(settings).connectors().get(pipe.connector) is not None
    with admin_connection(settings) as conn:
        conn.autocommit = True
        for table in tables:
            relid, files = _identity(conn, table)
            mine = [r for r in ranges if r.relid == relid]
            read = [(r.first, r.end) for r in mine if r.files == files]
            where = unread_rows(read, xmin)
            if not relation_kept(mine, files, _truncate_logged(conn, relid, xmin)):
                cuts.append(table.qualified)
                plans[table.qualified] = "true"  # a cut is followed by the whole table
            elif streams and where is not None:
                plans[table.qualified] = where
            elif not streams:
                unchanged = unchanged_unread_rows(read, xmin)
                if unchanged is not None:
                    here[table.qualified] = unchanged
                plans[table.qualified] = newer_rows(xmin)  # if there are any (below)
        with conn.transaction():
            cut_ids = [pending.cut(conn, name) for name in cuts]
    say(
        f"resuming the snapshot at LSN {lsn}: {len(ranges)} range(s) were written whole; "
        + (f"reading the rest of {len(here)} table(s), then " if here else "")
        + f"streaming from slot {pipe.slot}"
        + (f"; cut first in every store: {', '.join(cuts)}" if cuts else "")
    )
    rows = {change_topic(pipe, t.qualified): 0 for t in tables}
    if here:
        read_here, changed = _read_rest(
            settings, spark, [t for t in tables if t.qualified in here], point, here, console
        )
        rows.update({change_topic(pipe, name): n for name, n in read_here.items()})
        if changed:
            say(f"changed while the rest was read: {', '.join(changed)}; backfilled whole")
        plans.update({name: "true" for name in changed})
    if not streams:  # the row versions written since the snapshot, where there are any
        with admin_connection(settings) as conn:
            named = {t.qualified: t for t in tables}
            plans = {n: w for n, w in plans.items() if w == "true" or _any(conn, named[n], w)}
    if plans:
        say(f"backfilling {len(plans)} table(s): {', '.join(plans)}")
    register_connector(settings, tables, start_lsn=point.lsn, start_ts_ms=point.ts_ms)
    if cut_ids:
        _await_cuts(settings, cut_ids, say)
    with Progress(
        TextColumn("{task.description}", markup=False),  # names, not markup
        BarColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        for name, where in plans.items():
            signal, offset = start_backfill(
                settings, name, None if where == "true" else where, acknowledge=False
            )
            task = bar.add_task(name, total=1.0, detail="waiting for Debezium")

            def show(p: Any, task: Any = task) -> None:
                detail = p.state.lower().replace("_", " ")
                if p.rows_scanned is not None:
                    detail += f", {p.rows_scanned:,} rows"
                bar.update(task, completed=p.fraction or 0.0, detail=detail)

            done = watch_backfill(settings, offset, show, signal_id=signal)
            bar.update(task, completed=1.0, detail=f"{done.rows_scanned or 0:,} rows read")
            rows[change_topic(pipe, name)] += done.rows_scanned or 0
    record_generation(settings, point.lsn, point.ts_ms, topics, earlier=earlier)
    record_schemas(settings, tables)
    total = {t.qualified: written.get(change_topic(pipe, t.qualified), 0) for t in tables}
    for table in tables:
        total[table.qualified] += rows[change_topic(pipe, table.qualified)]
    with admin_connection(settings) as conn:
        conn.autocommit = True
        mark_done(conn, pipe.name, lsn, point.ts_ms, sum(total.values()))
        sync_truncate_triggers(conn)
    say(f"snapshot at LSN {lsn} done: the rest written; streaming from slot {pipe.slot}")
    return SnapshotResult(lsn=lsn, rows=total, seconds=time.monotonic() - started, continued=True)


def _any(conn: Any, table: Table, where: str) -> bool:
    """Whether any row of `table` matches `where`."""
    row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table.regclass} WHERE {where})").fetchone()
    return bool(row and row[0])


def _read_rest(
    settings: Settings,
    spark: Any,
    tables: list[Table],
    point: SnapshotPoint,
    rest: dict[str, str],
    console: Console,
) -> tuple[dict[str, int], list[str]]:
    """The rows of each table that match its filter in `rest` (unchanged_unread_rows),
    read by Spark under one snapshot exported now and written as snapshot events of
    `point` at position (consistent point, 1); returns rows per table and the tables
    rewritten meanwhile (as _copy_tables).

    Each row is the one the snapshot saw: no transaction since wrote it. The connector is
    not streaming yet, so every change after the point follows these rows in its key's
    partition: an UPDATE's placeholder for an unchanged TOAST value finds the value in
    the store, as after an uninterrupted snapshot. Their position is after the first
    run's rows (one the killed run wrote to Kafka without recording its range is read
    again, the same row: a history takes it as a second version, never two versions at
    one position) and before every streamed change (position (commit >= point, its LSN))."""
    with admin_connection(settings) as conn:  # before the snapshot: a rewrite from here on
        identities = {t.qualified: _identity(conn, t) for t in tables}
    with psycopg.connect(replication_dsn(settings), connect_timeout=10) as held:
        held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        row = held.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        now = SnapshotPoint(point.lsn, point.ts_ms, str(row[0]), order=1)
        spark = spark or spark_session(settings, f"cdc-snapshot-{settings.pipeline.name}")
        return _copy_tables(settings, spark, tables, now, console, identities, rest=rest)


def _await_cuts(settings: Settings, ids: list[int], say: Say) -> None:
    """Return once the connector has written the cuts `ids` (rows of cdc.truncations) to
    the log, having streamed every change committed before them. A backfill signal sent
    earlier could be taken while the connector still reads the WAL before the cut, and
    a read-only backfill's chunk window (every event processed after the chunk's read:
    sql/pipeline_schema.sql) would drop from the chunk the keys changed there; the cut
    would then remove those keys from every store. A failed connector task raises."""
    pipe = settings.pipeline
    topic = change_topic(pipe, TRUNCATIONS_TABLE)
    client = connect_client(settings)
    wanted, told = set(ids), time.monotonic()
    say("waiting for the connector to stream the WAL since the snapshot's point to the cut")
    while True:
        seen = {
            ((r.value or {}).get("after") or {}).get("id")
            for r in read_topic(settings.kafka, topic)
        }
        if wanted <= seen:
            return
        client.wait_running(pipe.connector, timeout=300)  # a failed task raises
        if time.monotonic() - told > 60:
            say("still waiting for the connector to stream the WAL up to the cut")
            told = time.monotonic()
        time.sleep(1.0)


def _copy_tables(
    settings: Settings,
    spark: Any,
    tables: list[Table],
    point: SnapshotPoint,
    console: Console,
    identities: dict[str, tuple[int, str]],
    stores: _IntoStores | None = None,
    rest: dict[str, str] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Write every table's snapshot events to its change topic; returns rows per table,
    and the tables whose files (`identities`: as they were before the snapshot) changed
    before the last of their ranges was read: their copy stopped there, and what was read
    of them may miss rows (a rewrite moved them into pages read before, or out of the
    snapshot's sight), so they are to be backfilled whole. A table dropped (and created
    again) meanwhile stops the run: the one after it resumes with the relation as the
    publication and the capture set hold it then. `stores`: each group, once in Kafka,
    also into the stores that take it (module doc), in their thread (the caller waits
    for it). `rest` (a resumed snapshot's, _read_rest): only the rows of each table that
    match its filter, in no recorded range (a run after this one reads them again)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    pipe, pg = settings.pipeline, settings.postgres
    url = f"jdbc:postgresql://{pg.host}:{pg.port}/{pg.database}"
    init = (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
        f"SET TRANSACTION SNAPSHOT '{point.snapshot_name}'; SET intervalstyle = 'iso_8601'"
    )
    props = {
        "user": pipe.replication_user,
        "password": replication_password(settings).get_secret_value(),
        "driver": "org.postgresql.Driver",
        "sessionInitStatement": init,
        "fetchsize": "10000",
        **jdbc_ssl_options(settings),
    }
    now_ms = int(time.time() * 1000)
    pieces: list[tuple[Table, ReadRange, Any, int]] = []  # each CTID range: its events, pages
    wraps: dict[str, tuple[str, str]] = {}  # topic -> the envelope's text around `after`
    with admin_connection(settings) as conn:
        for table in tables:
            query = event_query(table).as_string(conn)
            topic = change_topic(pipe, table.qualified)
            wraps[topic] = envelope(table, point, pipe.topic_prefix, pg.database, now_ms)
            rows = f" AND ({table.row_filter})" if table.row_filter else ""
            if rest is not None:
                rows += f" AND {rest[table.qualified]}"
            relid, files = identities[table.qualified]
            for first, end in page_ranges(table.pages, pipe.snapshot_pages_per_reader):
                subquery = f"({query} WHERE {ctid_clause(first, end)}{rows}) AS snapshot_rows"
                frame = spark.read.jdbc(url, subquery, properties=props).select(
                    "key", "after", F.lit(topic).alias("topic")
                )
                pages = (end if end is not None else max(table.pages, first + 1)) - first
                pieces.append((table, ReadRange(relid, files, first, end), frame, pages))
    # a few ranges per Spark job (one range per task slot: one wave of tasks; small
    # tables share one), each group recorded once in Kafka: a run after a crash reads
    # only the rest
    slots = max(1, int(spark.sparkContext.defaultParallelism))
    group_pages = slots * pipe.snapshot_pages_per_reader
    groups: list[list[tuple[Table, ReadRange, Any]]] = [[]]
    held = 0
    for table, read, frame, pages in pieces:
        if held >= group_pages:
            groups.append([])
            held = 0
        groups[-1].append((table, read, frame))
        held += max(1, pages)
    topics = {change_topic(pipe, t.qualified): t for t in tables}
    start = {t: sum(p.values()) for t, p in end_offsets(settings.kafka, list(topics)).items()}

    done = threading.Event()
    with Progress(
        TextColumn("{task.description}", markup=False),  # names, not markup
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} rows/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks = {
            topic: progress.add_task(table.qualified, total=table.estimated_rows or None, rate="–")
            for topic, table in topics.items()
        }
        began = time.monotonic()

        def poll() -> None:
            while not done.wait(1.0):
                _update(progress, tasks, start, settings, began)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        changed: list[str] = []
        stores = stores or _IntoStores(None)
        for chunk in groups:
            chunk = [(t, r, f) for t, r, f in chunk if t.qualified not in changed]
            if not chunk:
                continue
            rows = reduce(lambda a, b: a.unionAll(b), [f for _, _, f in chunk])
            if stores.into is None:
                _write(settings, _events(rows, wraps))
            else:  # read once (kept on disk): the same rows go to Kafka, then into the stores
                rows = rows.persist(StorageLevel.DISK_ONLY)  # the heap is for the collect
                try:
                    before = _ends(settings, list(topics))
                    _write(settings, _events(rows, wraps))
                    after = _ends(settings, list(topics))
                except BaseException:
                    rows.unpersist()
                    raise
                records = _as_records(settings, rows, wraps, point, after)
                stores.put(rows, records, after, before)
            with admin_connection(settings) as conn:
                conn.autocommit = True
                if rest is None:
                    record_ranges(conn, pipe.name, [r for _, r, _ in chunk])
                # no lock is held between two groups: a rewrite there (VACUUM FULL,
                # CLUSTER, pg_repack) moves unread rows into pages read, or out of the
                # snapshot's sight. A table whose identity, read after the group, is still
                # the one from before the snapshot was not rewritten before the group's
                # reads ended (a rewrite waits for the readers' locks): every row of the
                # ranges read so far was read.
                for table in {t.qualified: t for t, _, _ in chunk}.values():
                    relid, files = _identity(conn, table)
                    if relid != identities[table.qualified][0]:
                        raise SnapshotError(
                            f"table {table.qualified} was dropped and created again while "
                            "the snapshot read it: run `cdc snapshot` again (it resumes, "
                            "and cuts the table in every store before it backfills it)"
                        )
                    if files != identities[table.qualified][1]:
                        changed.append(table.qualified)
        done.set()
        poller.join()
        written = _update(progress, tasks, start, settings, began, final=True)
    return {topics[t].qualified: n for t, n in written.items()}, changed


class _IntoStores:
    """The groups into the stores (`into`), one at a time in a thread of their own, each
    once it is in Kafka: the next group's read and write to Kafka go on meanwhile, and
    the connector starts while the last ones are written. A group whose write failed
    stops every later one (what a store holds is recorded as offsets below which it
    holds every record) and the copy at its next group. `close` waits for the thread,
    however the snapshot ends."""

    def __init__(self, into: IntoStores | None) -> None:
        self.into = into
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="into-stores") if into else None
        self.failed: BaseException | None = None

    def put(self, rows: Any, records: Any, after: dict[str, int], before: dict[str, int]) -> None:
        """Write a group (its cached `rows`, as `records`) into the stores, after the one
        before it; `before`/`after`: each partition's end offset around its Kafka write."""
        assert self.into is not None and self.pool is not None
        self.check()
        into, count = self.into, sum(after.values()) - sum(before.values())

        def write() -> None:
            try:
                if self.failed is None:
                    into(records, after, count)
            except BaseException as exc:
                self.failed = exc
            finally:
                rows.unpersist()

        self.pool.submit(write)

    def check(self) -> None:
        """Raise the failure of a group written so far, if one failed."""
        if self.failed is not None:
            raise self.failed

    def done(self, say: Say) -> None:
        """Wait for the last group. A group that failed is said, not raised: the snapshot
        is whole in Kafka, and the store's apply reads the groups it lacks from there."""
        if self.pool is None:
            return
        say("the snapshot's last groups go into the stores that take them")
        self.close()
        if self.failed is not None:
            why = (str(self.failed).strip().splitlines() or [type(self.failed).__name__])[0]
            say(
                f"a group of the snapshot did not go into the stores itself ({why[:200]}): "
                "their apply reads the rest of it from Kafka"
            )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _ends(settings: Settings, topics: list[str]) -> dict[str, int]:
    """The end offset of each "topic:partition" of `topics`."""
    ends = end_offsets(settings.kafka, topics)
    return {f"{t}:{p}": end for t, parts in ends.items() for p, end in parts.items()}


def _events(rows: Any, wraps: dict[str, tuple[str, str]]) -> Any:
    """A group's rows (key, after, topic) as their snapshot events (key, value, topic):
    `after` in its table's envelope (`wraps`: per topic, the text before and after it)."""

    return rows.select("key", _event_value(wraps).alias("value"), "topic")


def _event_value(wraps: dict[str, tuple[str, str]]) -> Any:
    """A row's snapshot event, from its `after` and `topic` (`_events`)."""
    from pyspark.sql import functions as F

    def text(at: int) -> Any:
        pairs = [x for t, w in sorted(wraps.items()) for x in (F.lit(t), F.lit(w[at]))]
        return F.create_map(*pairs)[F.col("topic")]

    return F.concat(text(0), F.col("after"), text(1))


def _as_records(
    settings: Settings,
    rows: Any,
    wraps: dict[str, tuple[str, str]],
    point: SnapshotPoint,
    ends: dict[str, int],
) -> Any:
    """A group's rows (key, after, topic) as the Kafka records their events are now
    (`ends`: each "topic:partition"'s end offset once the group is in), for a store:
    key and value as bytes, the partition Kafka's producers picked for the key, and as
    offset the last one of that partition, no lower than the record's own (a store takes
    a record of that partition at or below it as one it holds). The value is the event
    with only what a store reads of it (op, after, and the source's time, position and
    snapshot flag): a third of the bytes to move. A record held back as oversized
    (kafka.oversized = dead_letter) is not among them."""
    from pyspark.sql import functions as F

    counts: dict[str, int] = {}
    for where in ends:
        topic = where.rpartition(":")[0]
        counts[topic] = counts.get(topic, 0) + 1
    partition = None
    for topic, n in sorted(counts.items()):
        mine = F.col("topic") == topic
        p = key_partition(F.col("key"), n)
        partition = F.when(mine, p) if partition is None else partition.when(mine, p)
    last = F.create_map(*[x for w, end in sorted(ends.items()) for x in (F.lit(w), F.lit(end - 1))])
    if (over := _oversized(settings, _event_value(wraps))) is not None:  # as Kafka was sent it
        rows = rows.where(~over)
    source = json.dumps(
        {"ts_ms": point.ts_ms, **point.source_position(), "snapshot": "true"},
        separators=(",", ":"),
    )
    value = F.concat(F.lit('{"op":"r","after":'), F.col("after"), F.lit(f',"source":{source}}}'))
    records = rows.withColumn("partition", partition).where(F.col("partition").isNotNull())
    return records.select(
        F.col("key").cast("binary").alias("key"),
        value.cast("binary").alias("value"),
        "topic",
        "partition",
        F.element_at(
            last, F.concat(F.col("topic"), F.lit(":"), F.col("partition").cast("string"))
        ).alias("offset"),
    )


def _write(settings: Settings, events: Any) -> None:
    """Write snapshot events to their topics, and return once Kafka has them all."""
    if settings.kafka.oversized == "dead_letter":
        events = _hold_oversized(events, settings)
    (
        events.write.format("kafka")
        .options(**kafka_options(settings))
        .option("kafka.acks", "all")
        .option("kafka.enable.idempotence", "true")
        .option("kafka.linger.ms", "20")
        .option("kafka.batch.size", "524288")
        .option("kafka.compression.type", "lz4")
        # a row as large as kafka.max_message_bytes (the topics take it too)
        .option("kafka.max.request.size", str(settings.kafka.max_message_bytes))
        .option(
            "kafka.buffer.memory",
            str(max(32 * 1024 * 1024, 2 * settings.kafka.max_message_bytes)),
        )
        .save()
    )


def _hold_oversized(events: Any, settings: Settings) -> Any:
    """kafka.oversized = "dead_letter": a snapshot row larger than Kafka takes goes to the
    dead-letter topic as a letter (its table's topic, key and size), as the connector's
    transform sends a change (jvm/transforms HoldOversized); the others are as they were."""
    from pyspark.sql import functions as F

    limit = settings.kafka.max_message_bytes
    size = _size()
    over = size > F.lit(limit)
    error = F.concat(
        F.lit("a change event of "),
        size.cast("string"),
        F.lit(
            f" bytes is larger than kafka.max_message_bytes ({limit} bytes): held back "
            "(kafka.oversized = dead_letter)"
        ),
    )
    letter = F.to_json(
        F.struct(
            F.lit("capture").alias("store"),
            error.alias("error"),
            F.col("topic"),
            F.lit(-1).alias("partition"),
            F.lit(-1).alias("offset"),
            F.col("key"),
            F.lit(None).cast("string").alias("value"),
            size.alias("size"),
            F.struct(F.lit("r").alias("op")).alias("position"),
        )
    )
    return events.select(
        "key",
        F.when(over, letter).otherwise(F.col("value")).alias("value"),
        F.when(over, F.lit(dead_letter_topic(settings.pipeline)))
        .otherwise(F.col("topic"))
        .alias("topic"),
    )


def _size(value: Any = "value") -> Any:
    """A snapshot event's size as Kafka counts it against max.message.bytes, with framing
    (`value`: the event's column or expression)."""
    from pyspark.sql import functions as F

    return F.octet_length("key") + F.octet_length(value) + F.lit(1024)


def _oversized(settings: Settings, value: Any) -> Any | None:
    """Whether _hold_oversized sends a row's event (`value`) to the dead-letter topic
    (None: it sends none there)."""
    from pyspark.sql import functions as F

    if settings.kafka.oversized != "dead_letter":
        return None
    return _size(value) > F.lit(settings.kafka.max_message_bytes)


def _update(
    progress: Progress,
    tasks: Any,
    start: Any,
    settings: Settings,
    began: float,
    final: bool = False,
) -> dict[str, int]:
    ends = end_offsets(settings.kafka, list(tasks))
    written = {t: sum(p.values()) - start[t] for t, p in ends.items()}
    elapsed = max(time.monotonic() - began, 1e-3)
    for topic, task in tasks.items():
        n = written[topic]
        total = n if final else max(progress.tasks[task].total or 0, n) or None
        progress.update(task, completed=n, total=total, rate=f"{n / elapsed:,.0f}")
    return written
