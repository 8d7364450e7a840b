"""A value in the form each store holds it: the cache's text (`cache_text`, json and
jsonb as their source text), the search document's value and its field's mapping
(`document_value`, `field_mapping`), and the warehouse's value in one comparable form
(`warehouse_value`); and the families of types the checks and commands ask about."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from datetime import time as clock
from decimal import Decimal
from typing import Any

from cdc.core.catalog import Column, Table
from cdc.types.decode import Interval, decode_value, parse_interval
from cdc.types.keys import shortest_real

__all__ = [
    "INTEGER_TYPES",
    "JSON_TYPES",
    "JSON_VALUE",
    "SUMMED_TYPES",
    "cache_field_text",
    "cache_form",
    "cache_text",
    "document_form",
    "document_value",
    "field_mapping",
    "json_field",
    "json_text",
    "plain_value",
    "read_as_interval",
    "read_as_text",
    "row_form",
    "warehouse_value",
]

JSON_TYPES = frozenset({"json", "jsonb"})  # each store keeps their source's text
INTEGER_TYPES = frozenset({"int2", "int4", "int8"})
# summed by the warehouse's aggregate check: exact on both sides (a float's sum depends
# on the order of its additions, so reals and doubles are left out)
SUMMED_TYPES = INTEGER_TYPES | {"numeric"}


def read_as_text(conn: Any) -> None:
    """Set a psycopg connection to read, as text, the values verify compares as text:
    intervals in ISO 8601 (the form Debezium sends, parsed by `parse_interval`), and
    json and jsonb as PostgreSQL prints them (JSON_TEXT: json's key order and spaces are
    data)."""
    from psycopg.types.string import TextLoader

    conn.execute("SET intervalstyle = iso_8601")
    for name in ("interval", *sorted(JSON_TYPES)):
        conn.adapters.register_loader(name, TextLoader)


def read_as_interval(column: Column) -> bool:
    """Whether verify reads the column's source values as interval text to parse
    (`parse_interval`: ISO 8601, the form Debezium sends)."""
    return column.base == "interval"


def json_text(column: Column, raw: Any) -> str:
    """A json/jsonb value as the cache holds it: the text Debezium sent, which is
    PostgreSQL's own (for `json`, key order, spaces and duplicate keys are data; for
    `jsonb`, number digits a float would round); an array joins its elements' texts."""
    decode_value(column, raw)  # raises ValueDecodeError unless it is JSON
    if column.is_array:
        return "[" + ", ".join("null" if e is None else e for e in raw) + "]"
    return str(raw)


def cache_text(value: Any) -> str:
    """A decoded value as the text a cache reader gets."""
    kind = type(value)
    if kind is str:  # the common cases first: this runs for every column of every row
        text: str = value
        return text
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, bool | int | float | list | dict):
        return json.dumps(value, default=cache_text, ensure_ascii=False)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode()
    if isinstance(value, Interval):
        return json.dumps(value.__dict__)
    return str(value)


def cache_field_text(column: Column, raw: Any) -> str:
    """A change event's value (Debezium's JSON) as the cache's hash holds it."""
    if column.base in JSON_TYPES:
        return json_text(column, raw)
    return cache_text(decode_value(column, raw))


def cache_form(table: Table, row: dict[str, Any]) -> dict[str, str]:
    """A source row as its hash holds it: the non-NULL columns' texts."""
    json_columns = {c.name: c for c in table.columns if c.base in JSON_TYPES}
    return {
        name: json_text(json_columns[name], value) if name in json_columns else cache_text(value)
        for name, value in row.items()
        if value is not None
    }


_NUMERIC = {
    # integers as long and floats as double: widening a column's type in PostgreSQL
    # never conflicts with the index's mapping
    "int2": "long",
    "int4": "long",
    "int8": "long",
    "oid": "long",
    "float4": "double",
    "float8": "double",
    "numeric": "double",
    "money": "double",
}


def field_mapping(column: Column) -> dict[str, Any]:
    """The OpenSearch field for a column (arrays map to their element's field)."""
    base = column.base
    # ignore_malformed: a value the field type cannot index (infinity dates, NaN
    # numerics, which the document holds as text) is kept in _source, not refused
    if base in _NUMERIC:
        return {"type": _NUMERIC[base], "ignore_malformed": True}
    if base == "bool":
        return {"type": "boolean"}
    if base in ("date", "timestamp", "timestamptz"):
        return {"type": "date", "ignore_malformed": True}
    if base in JSON_TYPES:
        return {"type": "flat_object"}
    if base == "bytea":
        return {"type": "binary"}
    if base in ("text", "varchar", "bpchar", "name", "citext"):
        return {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
    return {"type": "keyword"}  # uuid, enums, time, interval, inet...


# a flat_object field holds JSON objects only: any other JSON value (an array, a string, a
# number, a boolean) is indexed as the object {"_value": value}
JSON_VALUE = "_value"


def _json_object(value: Any) -> Any:
    return value if value is None or isinstance(value, dict) else {JSON_VALUE: value}


def json_field(column: Column, value: Any) -> Any:
    """A json/jsonb column's decoded value as its flat_object field holds it."""
    if column.is_array and isinstance(value, list):
        return [_json_object(v) for v in value]
    return _json_object(value)


def document_value(column: Column, raw: Any) -> Any:
    value = decode_value(column, raw)
    if column.base in JSON_TYPES:
        return json_field(column, value)
    if value is None or isinstance(value, bool | int | str | dict):
        return value
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    return plain_value(value)


def plain_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return cache_text(value)  # "NaN", "Infinity": JSON has no number for them
    if value is None or isinstance(value, bool | int | float | str | dict):
        return value
    return cache_text(value)


def document_form(column: Column, value: Any) -> Any:
    """A source value (as verify reads it from PostgreSQL) as the document holds it."""
    if column.base in JSON_TYPES:  # the source's text (JSON_TEXT), parsed
        if isinstance(value, list):
            return json_field(column, [None if v is None else json.loads(v) for v in value])
        return json_field(column, None if value is None else json.loads(value))
    if isinstance(value, list):
        return [document_form(column, v) for v in value]
    return plain_value(value)


def warehouse_value(column: Column, value: Any) -> Any:
    """A value from either side (psycopg's, Delta's) in one form: text for most types."""
    if value is None:
        return None
    if isinstance(value, list):
        return [warehouse_value(column, v) for v in value]
    base = column.base
    if base in JSON_TYPES:  # text on both sides, compared as such (JSON_TEXT)
        return value
    if base == "interval":
        parsed = parse_interval(value) if isinstance(value, str) else value
        return json.dumps(parsed.__dict__) if isinstance(parsed, Interval) else str(parsed)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, clock):
        return value.strftime("%H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if base == "float4":
        return shortest_real(value)
    if isinstance(value, Decimal):
        return str(value)
    return str(value) if not isinstance(value, bool | int | float) else value


_OWN_FORM = frozenset({int, str, bool, type(None)})


def row_form(
    table: Table,
    row: dict[str, Any],
    value_form: Callable[[Column, Any], Any],
    converted: frozenset[str],
) -> dict[str, Any]:
    """A source row in a store's comparison form: each column's value by `value_form`
    (column, value). An int, str, bool or NULL is taken as it is (skipping
    `value_form`'s tests, as this runs for every value of every row) unless its column's
    type is one of `converted`, whose such values `value_form` changes."""
    form = {}
    for column in table.columns:
        value = row.get(column.name)
        if type(value) not in _OWN_FORM or column.base in converted:
            value = value_form(column, value)
        form[column.name] = value
    return form
