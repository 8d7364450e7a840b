"""The source's rows as verify reads them: its columns as the stores hold them (masked
where masked), each value normalized to the decoder's terms (cdc.types.decode). Read by
verify in the `cdc` process and by its tasks on Spark's executors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv6Address
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from cdc.capture.masks import masked_value
from cdc.core.catalog import Table
from cdc.core.errors import VerifyError
from cdc.types.decode import parse_interval
from cdc.types.store_forms import read_as_interval

__all__ = ["normalize", "read_rows", "selected", "selected_columns"]


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


def selected(table: Table, name: str) -> sql.Composable:
    """A column as the stores hold it: its value, or the masked text (cdc/capture/masks.py)."""
    masked = masked_value(table, name)
    if masked is None:
        return sql.Identifier(name)
    return sql.SQL("{} AS {}").format(masked, sql.Identifier(name))


def selected_columns(table: Table) -> sql.Composable:
    """The table's columns in a SELECT, as the stores hold them (masked where masked)."""
    return sql.SQL(", ").join(selected(table, c.name) for c in table.columns)


def read_rows(
    conn: psycopg.Connection[Any], table: Table, query: sql.Composed
) -> Iterator[dict[str, Any]]:
    """The rows `query` reads (`table`'s columns, on a connection set up by read_as_text),
    each value normalized as verify compares it."""
    intervals = {c.name for c in table.columns if read_as_interval(c)}
    with conn.cursor(name="verify") as cursor:
        cursor.itersize = 5000
        cursor.execute(query)
        names = [d.name for d in cursor.description or []]
        for record in _records(cursor, table):
            values = dict(zip(names, record, strict=True))
            for name, value in values.items():
                kind = type(value)
                if kind in _AS_READ or (kind is str and name not in intervals):
                    continue  # most values: nothing to do (this runs for every value)
                if name in intervals and value is not None:
                    value = (
                        [parse_interval(v) for v in value]
                        if isinstance(value, list)
                        else parse_interval(value)
                    )
                values[name] = normalize(value)
            yield values


# what psycopg reads that is already in the decoder's terms (an interval is read as text)
_AS_READ = frozenset({int, float, bool, type(None)})


def _records(cursor: Any, table: Table) -> Iterator[Any]:
    """The cursor's records; a value Python has no form for (an infinite, BC or
    after-9999 time, 24:00) is one line of VerifyError, not a traceback."""
    try:
        yield from cursor
    except psycopg.DataError as exc:
        raise VerifyError(
            f"cannot verify {table.qualified}: it holds a value verify cannot read yet "
            f"({str(exc).splitlines()[0]}); infinite, BC and after-9999 times and 24:00 "
            "are not compared yet: name the other tables (cdc verify --table ...)"
        ) from None
