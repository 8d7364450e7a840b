"""A column's Debezium JSON value read and converted in Arrow, as the warehouse holds it
(the same values spark_types.py gives in Spark): the Arrow type it is read as
(`json_type`; None for a type only Spark decodes), and its conversion (`convert`)."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from cdc.core.catalog import Column
from cdc.types.decode import (
    DATE_INFINITY,
    INFINITY,
    MICROS_INFINITY,
    MILLIS_INFINITY,
    NEGATIVE_INFINITY,
    NUMERIC_SPECIAL,
)
from cdc.types.spark_types import PG_MIN_US, decimal_of

__all__ = ["TIMESTAMP_TZ", "convert", "decodable", "json_type"]

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# the bases whose Debezium JSON value is a string the warehouse keeps as it is
_TEXT_FAMILY = frozenset(
    {"text", "varchar", "bpchar", "name", "uuid", "json", "jsonb", "xml", "inet", "cidr"}
    | {"macaddr", "macaddr8", "interval", "citext", "tsvector", "tsquery", "ltree"}
)
TIMESTAMP_TZ = pa.timestamp("us", tz="UTC")  # Spark's TimestampType (session zone UTC)


def json_type(column: Column) -> pa.DataType | None:
    """The Arrow type the column's Debezium JSON value is read as (spark_types.py's json_type),
    None for a column decoded by Spark alone. An array's elements are kept as they are
    read: arrays of integers, float8, booleans and the text family."""
    if column.is_array:
        element = _element_type(column)
        if element is None or column.base in ("date", "timestamp", "numeric", "money"):
            return None
        if column.base == "timestamptz":
            return None
        return pa.list_(pa.field("element", element))  # Spark's Arrow name for it
    return _element_type(column)


def _element_type(column: Column) -> pa.DataType | None:
    base = column.base
    if base in ("int2", "int4", "date"):
        return pa.int32()
    if base in ("int8", "oid", "timestamp"):
        return pa.int64()
    if base == "float8":
        return pa.float64()
    if base == "bool":
        return pa.bool_()
    if base in ("numeric", "money", "timestamptz") or base in _TEXT_FAMILY:
        return pa.string()
    if column.category == "E":  # an enum: its label
        return pa.string()
    return None


def decodable(columns: Iterable[Column]) -> bool:
    """Whether every one of a table's columns decodes here (module doc)."""
    return all(json_type(c) is not None for c in columns)


def convert(column: Column, raw: pa.Array) -> pa.Array | None:
    """The column's JSON values as the warehouse holds them (spark_types.py's _convert), None
    where one converts to NULL in Spark (a value the warehouse cannot hold)."""
    base = column.base
    if base == "date":
        days = pc.if_else(
            pc.equal(raw, DATE_INFINITY[0]),
            _INT_MAX,
            pc.if_else(pc.equal(raw, DATE_INFINITY[1]), _INT_MIN, raw),
        )
        return pc.cast(days, pa.int32()).cast(pa.date32())
    if base == "timestamp":
        if column.precision is not None and column.precision <= 3:
            words, millis = MILLIS_INFINITY, _LONG_MAX // 1000
            held = pc.and_(pc.greater_equal(raw, -millis), pc.less_equal(raw, millis))
            micros = pc.multiply(pc.if_else(held, raw, 0), 1000)
        else:
            words = MICROS_INFINITY
            held = pc.and_(pc.greater_equal(raw, PG_MIN_US), pc.less(raw, _LONG_MAX))
            micros = raw
        special = pc.or_(pc.equal(raw, words[0]), pc.equal(raw, words[1]))
        if not pc.all(pc.or_kleene(pc.invert(pc.is_valid(raw)), pc.or_(held, special))).as_py():
            return None
        micros = pc.if_else(
            pc.equal(raw, words[0]),
            _LONG_MAX,
            pc.if_else(pc.equal(raw, words[1]), _LONG_MIN, micros),
        )
        return pc.cast(micros, pa.int64()).cast(pa.timestamp("us"))
    if base == "timestamptz":
        infinite = pc.is_in(raw, pa.array([INFINITY, NEGATIVE_INFINITY]))
        finite = pc.if_else(infinite, pa.scalar(None, pa.string()), raw)
        try:
            instants = pc.cast(
                pc.cast(finite, pa.timestamp("us", tz="UTC")), pa.int64()
            )  # ISO 8601 with Z, as ZonedTimestamp writes it
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        micros = pc.if_else(
            pc.equal(raw, INFINITY),
            _LONG_MAX,
            pc.if_else(pc.equal(raw, NEGATIVE_INFINITY), _LONG_MIN, instants),
        )
        return pc.cast(micros, pa.int64()).cast(TIMESTAMP_TZ)
    if base in ("numeric", "money"):
        held = decimal_of(column) if base == "numeric" else None
        if held is None:  # unbounded: its exact text, specials as PostgreSQL writes them
            text = raw
            for word, written in NUMERIC_SPECIAL.items():
                text = pc.if_else(pc.equal(raw, word), written, text)
            return text
        try:
            return pc.cast(raw, pa.decimal128(*held))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None  # NaN, an infinity, a value over the precision: Spark's dead letter
    return raw
