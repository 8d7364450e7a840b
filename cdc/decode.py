"""Debezium change-event values back to Python values, by the column's PostgreSQL type.

The inverse of the connector's encoding under the project's settings (and of
snapshot/encoding.py, which writes the same encoding for snapshot rows).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc.catalog import Column, Table

__all__ = ["UNAVAILABLE", "Interval", "decode_row", "decode_value", "parse_interval"]

# Debezium's placeholder for an unchanged TOASTed value that the WAL did not carry
UNAVAILABLE = "__debezium_unavailable_value"
_EPOCH = datetime(1970, 1, 1)
_EPOCH_DATE = date(1970, 1, 1)


@dataclass(frozen=True)
class Interval:
    """A PostgreSQL interval, kept exact: months, days and microseconds apart."""

    months: int
    days: int
    microseconds: int


_ISO_INTERVAL = re.compile(
    r"^(?P<sign>-)?P(?:(?P<y>-?\d+)Y)?(?:(?P<mo>-?\d+)M)?(?:(?P<w>-?\d+)W)?(?:(?P<d>-?\d+)D)?"
    r"(?:T(?:(?P<h>-?\d+)H)?(?:(?P<mi>-?\d+)M)?(?:(?P<s>-?\d+(?:\.\d+)?)S)?)?$"
)


def parse_interval(text: str) -> Interval:
    """ISO 8601 duration ("P1Y2M3DT4H5M6.78S", PostgreSQL's or Debezium's) to an Interval."""
    match = _ISO_INTERVAL.match(text)
    if not match:
        raise ValueError(f"not an ISO 8601 interval: {text!r}")
    g = {k: v for k, v in match.groupdict().items() if v is not None}
    months = int(g.get("y", 0)) * 12 + int(g.get("mo", 0))
    days = int(g.get("w", 0)) * 7 + int(g.get("d", 0))
    micros = (int(g.get("h", 0)) * 3600 + int(g.get("mi", 0)) * 60) * 1_000_000
    micros += int(Decimal(g.get("s", "0")) * 1_000_000)
    if g.get("sign"):
        months, days, micros = -months, -days, -micros
    return Interval(months, days, micros)


def _float(value: Any) -> float:
    return float(value)  # numbers, and "NaN" / "Infinity" / "-Infinity" strings


def _element(column: Column, value: Any) -> Any:
    if value is None:
        return None
    base = column.base
    if base in ("int2", "int4", "int8", "oid", "bool"):
        return value
    if base in ("float4", "float8"):
        return _float(value)
    if base in ("numeric", "money"):
        return Decimal(value)
    if base in ("json", "jsonb"):
        return json.loads(value)
    if base == "bytea":
        return base64.b64decode(value)
    if base == "date":
        return _EPOCH_DATE + timedelta(days=value)
    if base == "time":
        return (datetime.min + timedelta(microseconds=value)).time()
    if base == "timestamp":
        unit = 1000 if column.precision is not None and column.precision <= 3 else 1
        return _EPOCH + timedelta(microseconds=value * unit)
    if base == "timestamptz":
        return datetime.fromisoformat(value).astimezone(UTC)
    if base == "timetz":
        return time.fromisoformat(value.replace("Z", "+00:00"))
    if base == "interval":
        return parse_interval(value)
    return value


def decode_value(column: Column, value: Any) -> Any:
    """One column's value from a change event; UNAVAILABLE passes through untouched."""
    if value is None or value == UNAVAILABLE:
        return value
    if column.is_array:
        return [_element(column, v) for v in value]
    return _element(column, value)


def decode_row(table: Table, image: dict[str, Any]) -> dict[str, Any]:
    """A before/after image decoded column by column (columns the table lacks are dropped)."""
    by_name = {c.name: c for c in table.columns}
    return {k: decode_value(by_name[k], v) for k, v in image.items() if k in by_name}
