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
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv6Address
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from cdc.capture.masks import masked_value
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.errors import VerifyError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.settings.views import TableJoin
from cdc.core.topics import CUT_MESSAGE_PREFIX, change_topic
from cdc.log.progress import Progress, read_progress
from cdc.stores.base import Rows, StoreReader, ViewReader
from cdc.stores.registry import make_reader, reader_with
from cdc.types.decode import parse_interval
from cdc.types.keys import key_text
from cdc.types.store_forms import read_as_interval, read_as_text

__all__ = [
    "Drift",
    "consistent_cut",
    "normalize",
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


def normalize(value: Any) -> Any:
    """psycopg's value of a column in the decoder's terms (cdc.types.decode)."""
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, UUID | IPv4Address | IPv6Address):
        return str(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def _selected(table: Table, name: str) -> sql.Composable:
    """A column as the stores hold it: its value, or the masked text (cdc/capture/masks.py)."""
    masked = masked_value(table, name)
    if masked is None:
        return sql.Identifier(name)
    return sql.SQL("{} AS {}").format(masked, sql.Identifier(name))


def _stored_source(table: Table, alias: str) -> sql.Composable:
    """The table in a FROM clause as the stores hold it: its filtered rows, masked."""
    if not table.masks:
        return table.source(alias)
    return sql.SQL("(SELECT {} FROM {}) AS {}").format(
        sql.SQL(", ").join(_selected(table, c.name) for c in table.columns),
        table.source(),
        sql.Identifier(alias),
    )


def source_rows(
    settings: Settings,
    table: Table,
    keys: list[str] | None = None,
    query: sql.Composed | None = None,
) -> dict[str, dict[str, Any]]:
    """The table's rows now (or only those with `keys`), by key text, values normalized;
    `query` (selecting the table's columns) reads them instead of the table itself."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        read_as_text(conn)
        query = query or sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(_selected(table, c.name) for c in table.columns),
            table.source(),  # the rows the pipeline captures (its row filter)
        )
        intervals = {c.name for c in table.columns if read_as_interval(c)}
        result = {}
        with conn.cursor(name="verify") as cursor:
            cursor.itersize = 5000
            cursor.execute(query)
            names = [d.name for d in cursor.description or []]
            for record in cursor:
                values = {}
                for name, value in zip(names, record, strict=True):
                    if name in intervals and value is not None:
                        value = (
                            [parse_interval(v) for v in value]
                            if isinstance(value, list)
                            else parse_interval(value)
                        )
                    values[name] = normalize(value)
                result[key_text(table, values)] = values
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


def _digest(form: dict[str, Any]) -> bytes:
    text = json.dumps(form, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(text.encode()).digest()


RowForm = Callable[[Table, dict[str, Any]], dict[str, Any]]


def _compare(store: str, form: RowForm, table: Table, source: Rows, held: Rows) -> Drift:
    """`store`'s rows `held` (in its comparison form) against the source's rows: each
    row's content hash on either side, compared key by key."""
    drift = Drift(store, table.qualified, len(source), len(held))
    mine = {k: _digest(form(table, row)) for k, row in source.items()}
    theirs = {k: _digest(row) for k, row in held.items()}
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
) -> list[Drift]:
    """Each (store, table)'s drift from the source; an empty difference means in sync.
    `say` hears of each table compared."""
    opened = {name: make_reader(settings, name) for name in stores}
    try:
        return _verify(settings, tables, opened, timeout, rounds, say)
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
) -> list[Drift]:
    consistent_cut(settings, tables, list(stores), timeout)
    results = []
    for table in tables:
        source = source_rows(settings, table)
        for name, store in stores.items():
            results.append(_compare(name, store.form, table, source, store.rows(table)))
        say(f"{table.qualified}: {len(source):,} rows compared with {', '.join(stores)}")
    for _ in range(rounds - 1):  # what differs may have changed since: look again
        suspects = [d for d in results if not d.ok]
        if not suspects:
            break
        say(f"{len(suspects)} (store, table) pairs differ; looking at them again")
        time.sleep(1)
        consistent_cut(settings, tables, list(stores), timeout)
        for drift in suspects:
            table = next(t for t in tables if t.qualified == drift.table)
            store = stores[drift.store]
            keys = drift.missing + drift.extra + drift.different
            source = source_rows(settings, table, keys)
            held = store.rows(table)
            again = _compare(
                drift.store, store.form, table, source, {k: held[k] for k in keys if k in held}
            )
            drift.missing, drift.extra, drift.different = (
                again.missing,
                again.extra,
                again.different,
            )
    return results


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
