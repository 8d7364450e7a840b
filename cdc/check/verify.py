"""Reconcile each store with the source at a consistent cut.

The cut: note PostgreSQL's current LSN, wait until the slot has confirmed it (every
change before it is in Kafka), note the change topics' end offsets, and wait until
each store has applied up to them. Then each table is read from the source and from
each store, every row brought to one canonical form per store, and compared by its
content hash, key by key. A key
that differs is compared again after a fresh cut (the source may have moved on since
it was read); only what still differs is drift.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from cdc.check.keyed import keyed, source_rows_of, store_rows_of
from cdc.check.source_read import normalize, read_rows, selected_columns
from cdc.check.spark_verify import compare_in_spark, heap_pages
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.errors import VerifyError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.settings.views import TableJoin
from cdc.core.topics import CUT_MESSAGE_PREFIX, change_topic
from cdc.log.progress import Progress, read_progress
from cdc.stores.base import DigestReader, RowForm, Rows, StoreReader, ViewReader, row_digest
from cdc.stores.registry import make_reader, reach, reader_with
from cdc.types.keys import key_text
from cdc.types.store_forms import read_as_text

__all__ = [
    "Drift",
    "consistent_cut",
    "normalize",
    "source_digests",
    "source_rows",
    "verify",
    "verify_join",
    "view_table",
]


@dataclass
class Drift:
    """One store's differences from the source for one table."""

    store: str
    table: str
    source_rows: int
    store_rows: int
    missing: list[str] = field(default_factory=list)  # keys the store lacks
    extra: list[str] = field(default_factory=list)  # keys only the store has
    different: list[str] = field(default_factory=list)  # keys whose values differ

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)


def _stored_source(table: Table, alias: str) -> sql.Composable:
    """The table in a FROM clause as the stores hold it: its filtered rows, masked."""
    if not table.masks:
        return table.source(alias)
    return sql.SQL("(SELECT {} FROM {}) AS {}").format(
        selected_columns(table),
        table.source(),
        sql.Identifier(alias),
    )


def source_rows(
    settings: Settings,
    table: Table,
    keys: list[str] | None = None,
    query: sql.Composed | None = None,
) -> dict[str, dict[str, Any]]:
    """The table's rows now (or only those with `keys`: a few are read by a WHERE on the
    key, cdc/check/keyed.py), by key text, values normalized; `query` (selecting the
    table's columns) reads them instead of the table itself."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        read_as_text(conn)
        if keys is not None and query is None and keyed(table, keys):
            return source_rows_of(conn, table, keys)
        query = query or sql.SQL("SELECT {} FROM {}").format(
            selected_columns(table),
            table.source(),  # the rows the pipeline captures (its row filter)
        )
        result = {key_text(table, values): values for values in read_rows(conn, table, query)}
    if keys is not None:
        wanted = set(keys)
        result = {k: v for k, v in result.items() if k in wanted}
    return result


# ---- the cut and the comparison -----------------------------------------------------


def consistent_cut(
    settings: Settings, tables: list[Table], stores: list[str], timeout: float
) -> None:
    """Wait until every store has applied every change committed before now."""
    from cdc.core.topics import end_offsets

    deadline = time.monotonic() + timeout
    with admin_connection(settings) as conn:
        conn.autocommit = True
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        _mark_cut(conn)
        while True:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (lsn, settings.pipeline.slot),
            ).fetchone()
            if row is None:
                raise VerifyError(
                    f"pipeline {settings.pipeline.name} has no slot {settings.pipeline.slot}: "
                    "run `cdc snapshot` first"
                )
            if row[0]:
                break
            if time.monotonic() > deadline:
                raise VerifyError(
                    f"the connector has not confirmed LSN {lsn} within {timeout:.0f}s: "
                    "check `cdc status` (is Kafka Connect running?)"
                )
            time.sleep(_POLL_S)
    topics = [change_topic(settings.pipeline, t.qualified) for t in tables]
    topics.append(change_topic(settings.pipeline, TRUNCATIONS_TABLE))
    ends = end_offsets(settings.kafka, topics)
    for store in stores:
        while True:
            behind = (read_progress(settings, store) or Progress()).behind(ends)
            if not behind:
                break
            if time.monotonic() > deadline:
                raise VerifyError(
                    f"store {store} has not applied up to the cut within {timeout:.0f}s "
                    f"({len(behind)} partitions behind, e.g. {behind[0]}): is `cdc apply` "
                    "running? (`cdc apply --once` applies what the topics hold)"
                )
            time.sleep(_POLL_S)


_POLL_S = 0.1  # how often the cut looks at the slot and the stores' progress


def _mark_cut(conn: psycopg.Connection[Any]) -> None:
    """Write a logical decoding message (CUT_MESSAGE_PREFIX) after the cut's LSN.

    The connector confirms a position to the slot only with a record it has passed on:
    WAL that holds no captured change (a checkpoint, a write to a table no pipeline
    captures) is confirmed at its next heartbeat (pipeline.heartbeat_interval_ms, 10 s).
    The message is a record (on `<prefix>.message`, which the apply job does not read),
    confirmed within Connect's offset flush interval (1 s). A user not allowed to write
    one (pg_logical_emit_message) waits for the heartbeat instead."""
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", (CUT_MESSAGE_PREFIX,))


def source_digests(
    settings: Settings, table: Table, forms: dict[str, RowForm]
) -> dict[str, dict[str, bytes]]:
    """The table's rows now, read once: for each store of `forms`, each row's content
    hash in that store's form, by key text (the rows themselves are not kept: a million
    rows cost their hashes, not the rows)."""
    digests: dict[str, dict[str, bytes]] = {name: {} for name in forms}
    with psycopg.connect(settings.postgres.dsn()) as conn:
        read_as_text(conn)
        query = sql.SQL("SELECT {} FROM {}").format(selected_columns(table), table.source())
        for values in read_rows(conn, table, query):
            key = key_text(table, values)
            for name, form in forms.items():
                digests[name][key] = row_digest(form(table, values))
    return digests


def _compare(store: str, form: RowForm, table: Table, source: Rows, held: Rows) -> Drift:
    """`store`'s rows `held` (in its comparison form) against the source's rows: each
    row's content hash on either side, compared key by key."""
    mine = {k: row_digest(form(table, row)) for k, row in source.items()}
    theirs = {k: row_digest(row) for k, row in held.items()}
    return _digest_drift(store, table, len(source), mine, theirs)


def _digest_drift(
    store: str, table: Table, rows: int, mine: dict[str, bytes], theirs: dict[str, bytes]
) -> Drift:
    """The drift of `store`'s row hashes `theirs` from the source's `mine` (of `rows`
    rows), key by key."""
    drift = Drift(store, table.qualified, rows, len(theirs))
    if mine == theirs:
        return drift
    drift.missing = sorted(mine.keys() - theirs.keys())
    drift.extra = sorted(theirs.keys() - mine.keys())
    drift.different = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
    return drift


def verify(
    settings: Settings,
    tables: list[Table],
    stores: list[str],
    timeout: float = 120.0,
    rounds: int = 3,
    say: Say = quiet,
    again: list[Drift] | None = None,
) -> list[Drift]:
    """Each (store, table)'s drift from the source; an empty difference means in sync.
    `say` hears of each table compared. `again`: the drifts an earlier comparison
    found, which a repair then mended: only their keys are looked at (every other key
    was equal then, and a repair changes no other key), in `rounds` looks."""
    opened = {name: make_reader(settings, name) for name in stores}
    try:
        for store in opened.values():
            reach(store)
        return _verify(settings, tables, opened, timeout, rounds, say, again)
    finally:
        for store in opened.values():
            store.close()


def _verify(
    settings: Settings,
    tables: list[Table],
    stores: dict[str, StoreReader],
    timeout: float,
    rounds: int,
    say: Say,
    again: list[Drift] | None = None,
) -> list[Drift]:
    spark = _SparkRun(settings, stores)
    in_spark: set[str] = set()  # the tables compared on Spark's executors
    if again is not None:
        results = _named_again(settings, tables, again)
        keys, pairs = sum(len(d.missing) for d in results), sum(not d.ok for d in results)
        say(f"looking again at the {keys:,} keys of {pairs} (store, table) pairs")
        # what the repair removed it removed under every name (StoreReader.remove)
        gone = {(d.store, d.table): set(d.extra) for d in again}
        results = _look_again(
            settings, tables, stores, timeout, rounds, say, results, spark, in_spark, gone
        )
        for drift in results:  # every key not named was equal
            drift.store_rows = drift.source_rows - len(drift.missing) + len(drift.extra)
        return results
    consistent_cut(settings, tables, list(stores), timeout)
    results = []
    for table in tables:
        compared = {}
        if spark.readers and spark.wanted(table):
            in_spark.add(table.qualified)
            compared = spark.compare(table)
        rest: dict[str, RowForm] = {
            name: store.form for name, store in stores.items() if name not in compared
        }
        hashed = source_digests(settings, table, rest) if rest else {}
        for name, store in stores.items():
            if name in compared:
                c = compared[name]
                results.append(
                    Drift(
                        name, table.qualified, c.source_rows, c.store_rows, c.missing, c.extra,
                        c.different,
                    )
                )  # fmt: skip
            else:
                theirs = {key: row_digest(row) for key, row in store.held(table)}
                mine = hashed[name]
                results.append(_digest_drift(name, table, len(mine), mine, theirs))
        rows = next(d.source_rows for d in results if d.table == table.qualified)
        say(f"{table.qualified}: {rows:,} rows compared with {', '.join(stores)}")
    # what differs may have changed since: look again
    return _look_again(settings, tables, stores, timeout, rounds - 1, say, results, spark, in_spark)


def _named_again(settings: Settings, tables: list[Table], again: list[Drift]) -> list[Drift]:
    """The drifts `again` as suspects of a new look: every key they name, and the
    source's rows now (a count)."""
    by_name = {t.qualified: t for t in tables}
    counts: dict[str, int] = {}
    with psycopg.connect(settings.postgres.dsn()) as conn:
        for name in sorted({d.table for d in again}):
            found = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(by_name[name].source())
            ).fetchone()
            counts[name] = int(found[0]) if found else 0
    return [
        Drift(
            d.store,
            d.table,
            counts[d.table],
            counts[d.table],
            missing=sorted({*d.missing, *d.extra, *d.different}),
        )
        for d in again
    ]


def _look_again(
    settings: Settings,
    tables: list[Table],
    stores: dict[str, StoreReader],
    timeout: float,
    rounds: int,
    say: Say,
    results: list[Drift],
    spark: _SparkRun,
    in_spark: set[str],
    gone: dict[tuple[str, str], set[str]] | None = None,
) -> list[Drift]:
    """Up to `rounds` looks, each after a new cut, at the keys `results` name: a few keys
    of a (store, table) read key by key (cdc/check/keyed.py), more on Spark's executors
    where the table was compared there, else every row read again. `gone`: per (store,
    table), the keys a repair removed from it under every name (the caller announced
    the first look)."""
    gone = gone or {}
    for look in range(rounds):
        suspects = [d for d in results if not d.ok]
        if not suspects:
            break
        if look or not gone:
            say(f"{len(suspects)} (store, table) pairs differ; looking at them again")
            time.sleep(1)
        consistent_cut(settings, tables, list(stores), timeout)
        again: dict[tuple[str, str], tuple[list[str], list[str], list[str]]] = {}
        for table in tables:
            drifts = [d for d in suspects if d.table == table.qualified]
            if table.qualified in in_spark:
                only = {
                    d.store: d.missing + d.extra + d.different
                    for d in drifts
                    if d.store in spark.readers
                    and not keyed(table, d.missing + d.extra + d.different)
                }
                for name, c in (spark.compare(table, only) if only else {}).items():
                    again[(name, table.qualified)] = (c.missing, c.extra, c.different)
            rest = [d for d in drifts if (d.store, d.table) not in again]
            if not rest:
                continue
            keys_of = {d.store: d.missing + d.extra + d.different for d in rest}
            source = source_rows(
                settings, table, sorted({k for ks in keys_of.values() for k in ks})
            )
            with psycopg.connect(settings.postgres.dsn()) as conn:
                for drift in rest:
                    started = time.monotonic()
                    store, keys = stores[drift.store], keys_of[drift.store]
                    mine = {k: source[k] for k in keys if k in source}
                    removed = gone.get((drift.store, drift.table), set())
                    held = store_rows_of(conn, store, table, keys, mine, removed)
                    d = _compare(drift.store, store.form, table, mine, held)
                    again[(drift.store, drift.table)] = (d.missing, d.extra, d.different)
                    say(
                        f"{table.qualified}: {len(keys):,} keys looked at in {drift.store} "
                        f"({time.monotonic() - started:.1f} s)"
                    )
        for drift in suspects:
            drift.missing, drift.extra, drift.different = again[(drift.store, drift.table)]
    return results


class _SparkRun:
    """Verify's Spark side (cdc/check/spark_verify.py): the stores it reads on the
    executors, which tables it compares there (verify.engine), and its session, started
    the first time a table needs it (the warehouse's, when it is one of the stores)."""

    def __init__(self, settings: Settings, stores: dict[str, StoreReader]) -> None:
        self.settings = settings
        engine = settings.verify.engine
        self.readers: dict[str, DigestReader] = (
            {}
            if engine == "python"
            else {n: s for n, s in stores.items() if isinstance(s, DigestReader)}
        )
        self.stores = stores
        self._spark: Any = None

    def wanted(self, table: Table) -> bool:
        """Whether `table` is compared in Spark: verify.engine spark, or auto and a heap
        larger than verify.python_max_bytes."""
        if self.settings.verify.engine == "spark":
            return True
        with psycopg.connect(self.settings.postgres.dsn()) as conn:
            size, _ = heap_pages(conn, table)
        return size > self.settings.verify.python_max_bytes

    def compare(self, table: Table, only: dict[str, list[str]] | None = None) -> Any:
        if self._spark is None:
            found = [getattr(s, "spark", None) for s in self.stores.values()]
            self._spark = next((s for s in found if s is not None), None)
            if self._spark is None:
                from cdc.core.spark import spark_session

                self._spark = spark_session(
                    self.settings, f"cdc-verify-{self.settings.pipeline.name}"
                )
        parts = self.settings.verify.partitions or int(self._spark.sparkContext.defaultParallelism)
        return compare_in_spark(self.settings, self._spark, table, self.readers, parts, only)


def view_table(join: TableJoin, tables: dict[str, Table]) -> Table:
    """A join view as a table: the left table's columns and key, then the referenced
    table's columns under their prefix."""
    left, right = tables[join.table], tables[join.references]
    carried = tuple(
        replace(right.column(c), name=join.column_prefix + c, not_null=False) for c in join.columns
    )
    return Table("_views", join.name, (*left.columns, *carried), left.key, "d", 0, 0)


def _view_query(join: TableJoin, tables: dict[str, Table]) -> sql.Composed:
    """The view as PostgreSQL computes it: a LEFT JOIN on the referenced primary key."""
    left, right = tables[join.table], tables[join.references]
    (ref,) = right.key
    return sql.SQL("SELECT {}, {} FROM {} LEFT JOIN {} ON r.{} = l.{}").format(
        sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(c.name)) for c in left.columns),
        sql.SQL(", ").join(
            sql.SQL("r.{} AS {}").format(sql.Identifier(c), sql.Identifier(join.column_prefix + c))
            for c in join.columns
        ),
        _stored_source(left, "l"),
        _stored_source(right, "r"),
        sql.Identifier(ref),
        sql.Identifier(join.on),
    )


def verify_join(
    settings: Settings, join: TableJoin, tables: dict[str, Table], rounds: int = 3
) -> Drift:
    """The join view in the store that keeps the views against the same join computed by
    PostgreSQL, after a cut on both tables (a row that differs is looked at again after a
    fresh cut)."""
    store = reader_with(settings, "views")
    assert isinstance(store, ViewReader)
    view = view_table(join, tables)
    sides = [tables[join.table], tables[join.references]]
    drift = Drift(store.name, f"view {join.name}", 0, 0)
    for _ in range(rounds):
        consistent_cut(settings, sides, [store.name], 120.0)
        source = source_rows(settings, view, query=_view_query(join, tables))
        held = store.view_rows(view, join.name)
        drift = _compare(store.name, store.form, view, source, held)
        drift.table = f"view {join.name}"
        if drift.ok:
            break
        time.sleep(1)
    return drift
