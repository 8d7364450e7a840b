"""Change-event values back to PostgreSQL's input text.

What `%s::<the column's type>` reads as the value the source holds, for a value of a
change event's JSON `after` image (Debezium's encoding, cdc/types/decode.py). The apply job
hands a row's values back to PostgreSQL this way to compute its generated columns
(cdc/log/generated_columns.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from datetime import date, datetime, time
from typing import Any

from cdc.core.catalog import Column
from cdc.core.errors import ValueDecodeError
from cdc.types.decode import Interval, bits_text, decode_value

__all__ = ["postgres_text"]

# an ISO 8601 date (or timestamp) with an astronomical year: 0000 is 1 BC, -0043 is 44 BC
_EXPANDED_YEAR = re.compile(r"^(?P<y>[+-]?\d{4,})-(?P<rest>\d\d-\d\d.*)$")


def _era(text: str) -> str:
    """ISO 8601 text with java.time's expanded years as PostgreSQL reads them ('BC')."""
    match = _EXPANDED_YEAR.match(text)
    if not match:
        return text
    year = int(match["y"])
    if year > 0:
        return f"{year:04d}-{match['rest']}"
    return f"{1 - year:04d}-{match['rest']} BC"


def _quoted(element: str | None) -> str:
    if element is None:
        return "NULL"
    return '"' + element.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _element_text(column: Column, raw: Any) -> str | None:
    if raw is None:
        return None
    base = column.base
    if base in ("json", "jsonb", "interval"):  # PostgreSQL's own text; ISO 8601 durations
        return str(raw)
    if base in ("bit", "varbit"):
        return bits_text(column, raw)
    if base == "hstore":
        pairs = (json.loads(raw) if isinstance(raw, str) else raw).items()
        return ", ".join(f"{_quoted(k)}=>{_quoted(v)}" for k, v in pairs)
    value = decode_value(column, raw)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Interval):
        return f"{value.months} mons {value.days} days {value.microseconds} microseconds"
    if isinstance(value, str) and base in ("date", "timestamp", "timestamptz"):
        return _era(value)
    return str(value)


def postgres_text(column: Column, raw: Any) -> str | None:
    """The input text of a change event's value for its column (None for NULL). Raises
    ValueDecodeError for a value the column's encoding cannot be."""
    if raw is None:
        return None
    try:
        if column.is_array:
            element = replace(column, is_array=False)
            return "{" + ",".join(_quoted(_element_text(element, e)) for e in raw) + "}"
        return _element_text(column, raw)
    except ValueDecodeError:
        raise
    except (ValueError, TypeError, AttributeError, ArithmeticError, RecursionError) as exc:
        # not what the column's encoding can be (bits that are not base64, an hstore that
        # is not a JSON object of texts, a scalar for an array)
        raise ValueDecodeError(column.name, raw, str(exc) or type(exc).__name__) from None
