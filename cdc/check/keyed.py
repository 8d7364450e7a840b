"""Verify's look at a few keys of a large table: the source's rows of only those keys
(a WHERE on the key), and each key's name in the stores, so that a store reads only
those rows (StoreReader.held_keys). A key's name in a store is its change events' key,
Debezium's JSON of the key columns; PostgreSQL writes it from the key's values by the
SQL the snapshot writes its records' keys by (snapshot and streamed records share a
key: compaction depends on it).

Verify looks so at what a comparison found different (its rounds), and, after a
repair, at what the repair mended: reading every row of every store again would take
as long as the first comparison (a table of a million rows, three stores: about a
minute and a half on two cores), where a few thousand keys take a second or two."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

from cdc.capture.snapshot.events import key_json
from cdc.check.source_read import read_rows, selected_columns
from cdc.core.catalog import Table
from cdc.stores.base import Rows, StoreReader
from cdc.types.keys import key_text

__all__ = ["KEYED_MAX", "key_filters", "keyed", "source_rows_of", "store_rows_of"]

# the most keys of one (store, table) looked at key by key; more are read whole
KEYED_MAX = 100_000
# one WHERE clause's keys at most (a few thousand keys; also one backfill signal's filter)
FILTER_CHARS = 64 * 1024
_NAMES_CHUNK = 5_000  # keys named by one query


def keyed(table: Table, keys: list[str]) -> bool:
    """Whether `keys` of `table` are looked at one by one: few enough of them, and a key
    the stores hold as its values (a masked key column holds a hash the filter cannot
    find the row by)."""
    return len(keys) <= KEYED_MAX and not any(table.mask(k) for k in table.key)


def key_filters(table: Table, keys: list[str], limit: int = FILTER_CHARS) -> list[str]:
    """WHERE clauses that together match exactly these keys (key texts as verify reports
    them), each at most `limit` long (a single key longer than that gets a clause of
    its own)."""
    head = _key_columns(table)
    filters: list[str] = []
    rows: list[str] = []
    size = len(head) + 1
    for key in keys:
        row = _key_row(table, key)
        if rows and size + len(row) + 2 > limit:
            filters.append(f"{head}{', '.join(rows)})")
            rows, size = [], len(head) + 1
        rows.append(row)
        size += len(row) + 2
    if rows:
        filters.append(f"{head}{', '.join(rows)})")
    return filters


def _key_columns(table: Table) -> str:
    columns = sql.SQL(", ").join(sql.Identifier(k) for k in table.key).as_string(None)
    return f"({columns}) IN ("


def _key_row(table: Table, key: str) -> str:
    values = json.loads(key)
    return (
        sql.SQL("({})")
        .format(sql.SQL(", ").join(sql.Literal(values[c]) for c in table.key))
        .as_string(None)
    )


def source_rows_of(
    conn: psycopg.Connection[Any], table: Table, keys: list[str]
) -> dict[str, dict[str, Any]]:
    """The source's rows of `keys` now (on a connection set up by read_as_text), by key
    text, values normalized, as verify's source_rows gives them."""
    wanted = set(keys)
    found: dict[str, dict[str, Any]] = {}
    for where in key_filters(table, sorted(wanted)):
        query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
            selected_columns(table), table.source(), sql.SQL(where)
        )
        for values in read_rows(conn, table, query):
            key = key_text(table, values)
            if key in wanted:
                found[key] = values
    return found


def store_names(conn: psycopg.Connection[Any], table: Table, keys: list[str]) -> dict[str, str]:
    """Each key text's name in the stores: its change events' key (module doc)."""
    alias = [sql.Identifier("_cdc_text"), *(sql.Identifier(k) for k in table.key)]
    names: dict[str, str] = {}
    for at in range(0, len(keys), _NAMES_CHUNK):
        rows = []
        for key in keys[at : at + _NAMES_CHUNK]:
            values = json.loads(key)
            typed = [
                sql.SQL("{}::{}").format(sql.Literal(values[c]), sql.SQL(table.column(c).type))
                for c in table.key
            ]
            rows.append(sql.SQL("({})").format(sql.SQL(", ").join([sql.Literal(key), *typed])))
        query = sql.SQL("SELECT _cdc_text, {} FROM (VALUES {}) AS k({})").format(
            key_json(table), sql.SQL(", ").join(rows), sql.SQL(", ").join(alias)
        )
        names.update(conn.execute(query).fetchall())
    return names


def store_rows_of(
    conn: psycopg.Connection[Any],
    store: StoreReader,
    table: Table,
    keys: list[str],
    source: dict[str, Any],
    removed: set[str] | frozenset[str] = frozenset(),
) -> Rows:
    """`store`'s live rows of `keys` (in its comparison form), by key text; `source`: the
    source's rows of them. Read key by key when `keyed` and the store reads rows by
    their names; the whole table is read when not, when PostgreSQL cannot name a key (a
    value its type refuses), and when a key the source holds is not found so (the store
    may hold it under another name). A key the source lacks and its name does not find
    is looked for among every name the store holds (StoreReader.key_texts: a row
    another writer put there under a name of its own is still one only the store has);
    one found so is given as an empty row, as all that tells is that it is there. The
    keys of `removed` a repair removed under every name they had: not found by their
    names, they are not there."""
    wanted = set(keys)
    if store.reads_by_name and keyed(table, keys):
        try:
            names = store_names(conn, table, sorted(wanted))
        except psycopg.Error:
            conn.rollback()
        else:
            held = dict(store.held_keys(table, names))
            if all(k in held for k in wanted if k in source):
                unfound = {k for k in wanted if k not in held and k not in removed}
                if unfound:
                    held.update({k: {} for k in store.key_texts(table, unfound)})
                return held
    return {k: row for k, row in store.held(table) if k in wanted}
