"""A row's key as one text, whichever side it comes from: the source (psycopg's values),
a change event's key (Debezium's JSON: a cache key's tail, a document's _id) or a Delta
row. Verify compares rows by it; a store reports and removes keys by it."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import struct
from datetime import UTC, date, datetime
from datetime import time as clock
from typing import Any

import orjson

from cdc.core.catalog import Column, Table
from cdc.core.errors import ValueDecodeError
from cdc.types.decode import decode_value

__all__ = ["integer_values", "key_text", "shortest_real", "store_key_text"]


def key_text(table: Table, row: dict[str, Any]) -> str:
    """The row's key in one form whichever side it comes from (psycopg's values, a change
    event's key decoded, a Delta row): compact JSON, key columns in order, each value as
    PostgreSQL reads it back in a filter (times in ISO 8601, a timestamptz in UTC, bytea
    as `\\x` hex, a real at the digits that tell it apart)."""
    key = {}
    for name in table.key:
        key[name] = _key_value(table.column(name), row[name])
    if not any(type(v) is float for v in key.values()):
        # orjson's compact text is json's for strings, integers, booleans and null (and a
        # tenth of its time); json's is kept for floats (its exponents differ: 1e-07), and
        # for what orjson refuses (integers past 64 bits, lone surrogates)
        try:
            return orjson.dumps(key).decode()
        except orjson.JSONEncodeError:
            pass
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False)


def _key_value(column: Column, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, datetime):
        if column.base == "timestamptz":  # a Delta timestamp is UTC without its zone
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        return value.isoformat()
    if isinstance(value, date | clock):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, float) and column.base == "float4":
        return shortest_real(value)
    if isinstance(value, float):
        return value
    return str(value)


def shortest_real(value: float) -> float:
    """The shortest decimal of a real's binary value: psycopg reads a real's text into a
    double, Delta's float holds the binary; the same real gives the same number, and
    reals that differ in any bit differ."""
    if value != value or value in (float("inf"), float("-inf")):
        return value
    packed = struct.pack("<f", value)
    # from the real's own binary value, so that the form depends on its bits alone: a
    # subnormal read as text (1e-45) and from Delta (1.401298464324817e-45) are one real
    exact: float = struct.unpack("<f", packed)[0]
    for digits in range(1, 10):
        short = float(f"{exact:.{digits}g}")
        with contextlib.suppress(OverflowError):  # rounded up past the largest real
            if struct.pack("<f", short) == packed:
                return short
    return exact


def store_key_text(table: Table, key: str) -> str:
    """A change event's key (Debezium's JSON: a cache key's tail, a document's _id) in
    key_text's form. A key no change event can have (written by someone else under the
    pipeline's prefix) stays as it is: no row of the source has it, so verify names it
    as a key only the store holds."""
    integers = _integer_form(table)
    if integers is not None and integers.fullmatch(key):
        return key  # already key_text's form (read for every row a store holds)
    try:
        raw = _parsed(key)
        if not isinstance(raw, dict):
            return key
        return key_text(table, {c: decode_value(table.column(c), raw.get(c)) for c in table.key})
    except (ValueError, ValueDecodeError, RecursionError):  # not JSON, or not the key's types
        return key


def integer_values(table: Table, keys: list[str]) -> list[dict[str, int]] | None:
    """The values of `keys` (key texts) of a table whose key columns are all integers,
    each read from its text; None where a column is not an integer or a text is not
    key_text's form of integers (its values are then found some other way)."""
    form = _integer_form(table)
    if form is None or not all(form.fullmatch(k) for k in keys):
        return None
    return [orjson.loads(k) for k in keys]


def _integer_form(table: Table) -> re.Pattern[str] | None:
    """_integer_key's pattern for a table whose key columns are all integers, else None."""
    columns = [table.column(name) for name in table.key]
    if all(c.base in _INTEGERS and not c.is_array for c in columns):
        return _integer_key(table.key)
    return None


_INTEGERS = frozenset({"int2", "int4", "int8"})


@functools.lru_cache(maxsize=256)
def _integer_key(columns: tuple[str, ...]) -> re.Pattern[str]:
    """The names of integer keys of `columns` that are key_text's form of themselves:
    compact JSON, the columns in order, each an integer without a leading zero or -0, of
    at most 18 digits (within 64 bits: a longer one is parsed as before)."""
    values = [
        re.escape(orjson.dumps(name).decode()) + ":(?:0|-?[1-9][0-9]{0,17})" for name in columns
    ]
    return re.compile(r"\{" + ",".join(values) + r"\}")


def _parsed(text: str) -> Any:
    """JSON text parsed: by orjson, or by json where orjson refuses it (NaN, integers
    past 64 bits), raising ValueError where neither reads it."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
