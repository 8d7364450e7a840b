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
(cdc/capture/snapshot/held.py).

Between two groups the snapshot holds no lock: a rewrite (VACUUM FULL, CLUSTER, pg_repack,
ALTER TABLE … TYPE) may run there and move rows the copy has not read into pages it has
read. After each group the identity of its tables is read again; the copy of a table
whose files changed stops, and the run ends as a resumed one does, so that table is
backfilled whole. A table dropped meanwhile (and created again) stops the run with an
error: the rerun resumes, with the publication set up for the new relation, and cuts it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from cdc.capture import pending
from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import register_connector
from cdc.capture.generation import record_generation
from cdc.capture.rewrites import record_schemas
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
from cdc.capture.snapshot.held import forget_held
from cdc.capture.snapshot.ranges import (
    newer_rows,
    relation_identity,
    relation_kept,
    unchanged_unread_rows,
    unread_rows,
)
from cdc.capture.snapshot.record import (
    ReadRange,
    mark_done,
    mark_point,
    mark_running,
    read_ranges,
    read_state,
    resume_point,
)
from cdc.capture.snapshot.table_copy import IntoStores, StoresThread, copy_tables
from cdc.capture.source_setup import (
    TRUNCATE_TRIGGER,
    prepare_source,
    replication_dsn,
    sync_truncate_triggers,
)
from cdc.core.catalog import TRUNCATIONS_TABLE, Table, unstreamed_note
from cdc.core.errors import ConnectorError, SnapshotError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.spark import spark_session
from cdc.core.topics import (
    change_topic,
    change_topic_spec,
    end_offsets,
    ensure_topics,
    pipeline_topic_specs,
    read_topic,
    truncate_topics,
)

__all__ = ["SnapshotInto", "SnapshotResult", "run_snapshot"]


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
    for table in tables:
        if note := unstreamed_note(table):
            say(note)
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
    # after the copy's next group of its ranges (copy_tables)
    with admin_connection(settings) as conn:
        identities = {t.qualified: relation_identity(conn, t) for t in tables}
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
            stores = StoresThread(write_into)
            stack.callback(stores.close)  # its thread ends before the stores' locks do
            rows, changed = copy_tables(settings, spark, tables, point, console, identities, stores)
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
            relid, files = relation_identity(conn, table)
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
    rewritten meanwhile (as copy_tables).

    Each row is the one the snapshot saw: no transaction since wrote it. The connector is
    not streaming yet, so every change after the point follows these rows in its key's
    partition: an UPDATE's placeholder for an unchanged TOAST value finds the value in
    the store, as after an uninterrupted snapshot. Their position is after the first
    run's rows (one the killed run wrote to Kafka without recording its range is read
    again, the same row: a history takes it as a second version, never two versions at
    one position) and before every streamed change (position (commit >= point, its LSN))."""
    with admin_connection(settings) as conn:  # before the snapshot: a rewrite from here on
        identities = {t.qualified: relation_identity(conn, t) for t in tables}
    with psycopg.connect(replication_dsn(settings), connect_timeout=10) as held:
        held.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        row = held.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        now = SnapshotPoint(point.lsn, point.ts_ms, str(row[0]), order=1)
        spark = spark or spark_session(settings, f"cdc-snapshot-{settings.pipeline.name}")
        return copy_tables(settings, spark, tables, now, console, identities, rest=rest)


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
