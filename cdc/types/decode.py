"""Debezium change-event values back to Python values, by the column's PostgreSQL type.

The inverse of the connector's encoding under the project's settings (and of
cdc/capture/snapshot/events.py, which writes the same encoding for snapshot rows).

Every value a column can hold decodes, and never raises:

- `infinity` / `-infinity` (date, timestamp, timestamptz) decode to the text
  'infinity' / '-infinity', PostgreSQL's own spelling: neither date nor datetime can
  hold them, and a date.max stand-in would be taken for a real 9999-12-31.
- Dates and times outside 0001..9999 (BC, or after year 9999) decode to their ISO 8601
  text with an expanded year, as java.time writes it and Debezium sends it: astronomical
  years (1 BC is 0000, 44 BC is -0043), a sign beyond four digits ('+12345-06-07',
  '-0043-03-15T12:34:56.123456', '+12345-06-07T01:02:03+00:00'); inside that range the
  value is a date / datetime as before, whose isoformat() is the same text.
- numeric NaN / Infinity / -Infinity decode to Decimal('NaN'), Decimal('Infinity'),
  Decimal('-Infinity') (Debezium sends them as 'NAN', 'POSITIVE_INFINITY',
  'NEGATIVE_INFINITY'); float4/float8 ones to float nan / inf.
- time 24:00:00 decodes to the text '24:00:00' (a time stops at 23:59:59.999999).

So the cache (text) and the search documents hold what PostgreSQL prints. A value
that is not what the column's encoding can be (malformed, of the wrong JSON type, or a
timestamp Debezium's MicroTimestamp overflowed, whose seconds are lost) raises
ValueDecodeError naming the column: the caller dead-letters that record for its store.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc.core.catalog import DEBEZIUM_PLACEHOLDER, Column, Table
from cdc.core.errors import ValueDecodeError

__all__ = [
    "DATE_INFINITY",
    "DEBEZIUM",
    "DEBEZIUM_PLACEHOLDER",
    "INFINITY",
    "MICROS_INFINITY",
    "MILLIS_INFINITY",
    "NEGATIVE_INFINITY",
    "NUMERIC_SPECIAL",
    "UNAVAILABLE",
    "Interval",
    "Placeholder",
    "bit_length",
    "bits_text",
    "decode_row",
    "decode_value",
    "is_unavailable",
    "mark_unavailable",
    "parse_interval",
    "placeholder_forms",
]

# what a decoded image holds for an unchanged TOASTed value (mark_unavailable): a text
# no PostgreSQL value can be (text holds no NUL), so no real value is taken for it
UNAVAILABLE = "\x00cdc:unchanged\x00"


class Placeholder:
    """Every form Debezium gives an unchanged TOASTed value, each made from the
    connector's `unavailable.value.placeholder` as Debezium 3.6 makes it
    (UnchangedToastedPlaceholder, PostgresValueConverter): text, json, uuid and the
    like as the text; bytea as its bytes (base64 in JSON); text, json, bytea and uuid
    arrays as a one-element array (the uuid is Java's nameUUIDFromBytes of the bytes);
    int4, int8 and date arrays as the bytes, as numbers; hstore as a one-entry map. An
    unchanged TOASTed array of any other type arrives as NULL: nothing tells it from a
    NULL (docs/guarantees.md: REPLICA IDENTITY FULL)."""

    def __init__(self, text: str) -> None:
        raw = text.encode()
        self.text = text
        self.b64 = base64.b64encode(raw).decode()
        self.uuid = str(uuid.UUID(bytes=hashlib.md5(raw).digest(), version=3))
        self.codes = list(raw)
        self.arrays = ([text], [self.b64], [self.uuid], self.codes)
        self.hstore = json.dumps({text: text}, separators=(",", ":"))
        self.texts = frozenset((text, self.b64, self.hstore))

    def __repr__(self) -> str:  # a pipeline's own is a secret
        return "Placeholder(…)"


@functools.lru_cache(maxsize=16)
def placeholder_forms(text: str) -> Placeholder:
    return Placeholder(text)


DEBEZIUM = placeholder_forms(DEBEZIUM_PLACEHOLDER)
INFINITY, NEGATIVE_INFINITY = "infinity", "-infinity"

# What Debezium 3.6.3 writes for PostgreSQL's infinities (PostgresValueConverter), as
# (infinity, -infinity): io.debezium.time.Date of LocalDate -5877611-06-21 / -22;
# MicroTimestamp and Timestamp of PGStatement.DATE_POSITIVE/NEGATIVE_INFINITY;
# ZonedTimestamp sends the words themselves.
DATE_INFINITY = (-2147472692, -2147472691)
MICROS_INFINITY = (9223372036825200000, -9223372036832400000)
MILLIS_INFINITY = (9223372036825200, -9223372036832400)
# numeric special values as Debezium writes them (decimal.handling.mode=string) -> text
NUMERIC_SPECIAL = {"NAN": "NaN", "POSITIVE_INFINITY": "Infinity", "NEGATIVE_INFINITY": "-Infinity"}

_EPOCH = datetime(1970, 1, 1)
_EPOCH_DATE = date(1970, 1, 1)
_DAY_US = 86_400_000_000
_PY_DAYS = (-719162, 2932896)  # date.min, date.max in days since the epoch
# PostgreSQL's first timestamp (4714-11-24 00:00:00 BC): a MicroTimestamp before it is
# Debezium's long overflow (after 294247-01-10T04:00:54Z its seconds saturate and wrap)
_PG_MIN_US = -210866803200000000
_LONG_MAX = 2**63 - 1
_DATE_WORDS = {DATE_INFINITY[0]: INFINITY, DATE_INFINITY[1]: NEGATIVE_INFINITY}
_MICROS_WORDS = {MICROS_INFINITY[0]: INFINITY, MICROS_INFINITY[1]: NEGATIVE_INFINITY}
_MILLIS_WORDS = {MILLIS_INFINITY[0]: INFINITY, MILLIS_INFINITY[1]: NEGATIVE_INFINITY}
_NUMERIC = {k: Decimal(v) for k, v in NUMERIC_SPECIAL.items()}
_ZONED = re.compile(
    r"^(?P<y>[+-]?\d{4,})-(?P<mo>\d\d)-(?P<d>\d\d)T(?P<h>\d\d):(?P<mi>\d\d)(?::(?P<s>\d\d))?"
    r"(?:\.(?P<f>\d{1,9}))?(?P<tz>Z|[+-]\d\d(?::?\d\d(?::?\d\d)?)?)$"
)


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


def _civil(days: int) -> tuple[int, int, int]:
    """Days since 1970-01-01 -> (astronomical year, month, day), proleptic Gregorian as
    PostgreSQL and java.time count (H. Hinnant's civil_from_days)."""
    z = days + 719468
    era, doe = divmod(z, 146097)
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, doy - (153 * mp + 2) // 5 + 1


def _epoch_days(year: int, month: int, day: int) -> int:
    """The inverse of _civil."""
    year -= month <= 2
    era, yoe = divmod(year, 400)
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _year(year: int) -> str:
    """ISO 8601 year as java.time writes it: four digits, a sign beyond them or below 0."""
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def _date_text(days: int) -> str:
    year, month, day = _civil(days)
    return f"{_year(year)}-{month:02d}-{day:02d}"


def _timestamp_text(micros: int, zone: str = "") -> str:
    """ISO 8601 text of a timestamp outside datetime's years, the way isoformat() writes
    the ones inside them (fraction only when not zero)."""
    days, of_day = divmod(micros, _DAY_US)
    seconds, fraction = divmod(of_day, 1_000_000)
    clock = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{_date_text(days)}T{clock}{f'.{fraction:06d}' if fraction else ''}{zone}"


def _date(days: int) -> date | str:
    if _PY_DAYS[0] <= days <= _PY_DAYS[1]:
        return _EPOCH_DATE + timedelta(days=days)
    return _DATE_WORDS.get(days) or _date_text(days)


def _timestamp(column: Column, value: int) -> datetime | str:
    millis = column.precision is not None and column.precision <= 3
    word = (_MILLIS_WORDS if millis else _MICROS_WORDS).get(value)
    if word:
        return word
    micros = value * 1000 if millis else value
    if _PY_DAYS[0] * _DAY_US <= micros < (_PY_DAYS[1] + 1) * _DAY_US:
        return _EPOCH + timedelta(microseconds=micros)
    if micros < _PG_MIN_US or micros == _LONG_MAX:
        raise ValueError(
            "a MicroTimestamp Debezium overflowed (the source value is after "
            "294247-01-10T04:00:54Z; its seconds are lost)"
        )
    return _timestamp_text(micros)


def _zoned_timestamp(value: str) -> datetime | str:
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except (ValueError, OverflowError):
        if value in (INFINITY, NEGATIVE_INFINITY):
            return value
    match = _ZONED.match(value)  # a year before 0001 or after 9999
    if not match:
        raise ValueError("not an ISO 8601 timestamp with a zone")
    g = match.groupdict()
    days = _epoch_days(int(g["y"]), int(g["mo"]), int(g["d"]))
    seconds = int(g["h"]) * 3600 + int(g["mi"]) * 60 + int(g["s"] or 0)
    micros = (days * 86400 + seconds) * 1_000_000 + int((g["f"] or "").ljust(6, "0")[:6])
    if g["tz"] != "Z":
        sign = -1 if g["tz"][0] == "-" else 1
        parts = [int(p) for p in re.findall(r"\d\d", g["tz"])]
        offset = parts[0] * 3600 + (parts[1] * 60 if len(parts) > 1 else 0)
        micros -= sign * (offset + (parts[2] if len(parts) > 2 else 0)) * 1_000_000
    if _PY_DAYS[0] * _DAY_US <= micros < (_PY_DAYS[1] + 1) * _DAY_US:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return _timestamp_text(micros, "+00:00")


def _time(value: int) -> time | str:
    if 0 <= value < _DAY_US:
        return (datetime.min + timedelta(microseconds=value)).time()
    if value == _DAY_US:
        return "24:00:00"
    raise ValueError("a time of day outside 00:00:00..24:00:00")


def _decimal(value: str) -> Decimal:
    special = _NUMERIC.get(value)
    return special if special is not None else Decimal(value)


_BIT_LENGTH = re.compile(r"^bit\((\d+)\)")


def bit_length(column: Column) -> int | None:
    """The declared length of a bit(n) column (bit alone is bit(1)); None for varbit."""
    if column.base != "bit":
        return None
    match = _BIT_LENGTH.match(column.type)
    return int(match[1]) if match else 1


def bits_text(column: Column, value: Any) -> str:
    """PostgreSQL's text of a bit string from Debezium's value: a boolean for bit(1), else
    io.debezium.data.Bits, the bits as a little-endian number in the fewest bytes (base64
    in JSON). A bit(n) gets its leading zeros back from n; a varbit's are lost."""
    if isinstance(value, bool):
        return "1" if value else "0"
    number = int.from_bytes(base64.b64decode(value), "little")
    length = bit_length(column)
    return format(number, f"0{length}b" if length else "b")


def _element(column: Column, value: Any) -> Any:
    if value is None:
        return None
    base = column.base
    if base in ("bit", "varbit"):
        return bits_text(column, value)
    if base in ("int2", "int4", "int8", "oid", "bool"):
        return value
    if base in ("float4", "float8"):
        return float(value)  # numbers, and "NaN" / "Infinity" / "-Infinity" strings
    if base in ("numeric", "money"):
        return _decimal(value)
    if base in ("json", "jsonb"):
        return json.loads(value)
    if base == "bytea":
        return base64.b64decode(value)
    if base == "date":
        return _date(value)
    if base == "time":
        return _time(value)
    if base == "timestamp":
        return _timestamp(column, value)
    if base == "timestamptz":
        return _zoned_timestamp(value)
    if base == "timetz":
        return time.fromisoformat(value.replace("Z", "+00:00"))
    if base == "interval":
        return parse_interval(value)
    return value


def decode_value(column: Column, value: Any) -> Any:
    """One column's value from a change event; UNAVAILABLE passes through untouched.

    Raises ValueDecodeError, naming the column, for a value its encoding cannot be.
    """
    if value is None or value == UNAVAILABLE:
        return value
    try:
        if column.is_array:
            return [_element(column, v) for v in value]
        return _element(column, value)
    except (ValueError, TypeError, ArithmeticError, AttributeError, binascii.Error) as exc:
        raise ValueDecodeError(column.name, value, str(exc) or type(exc).__name__) from None
    except RecursionError:  # json nested deeper than Python's parser goes (PostgreSQL's does)
        raise ValueDecodeError(column.name, value, "nested too deep to decode") from None


def decode_row(table: Table, image: dict[str, Any]) -> dict[str, Any]:
    """A before/after image decoded column by column (columns the table lacks are dropped)."""
    by_name = {c.name: c for c in table.columns}
    return {k: decode_value(by_name[k], v) for k, v in image.items() if k in by_name}


def is_unavailable(column: Column, raw: Any, placeholder: Placeholder) -> bool:
    """Whether `raw` (a value of the JSON `after` image) is the connector's placeholder
    for an unchanged TOASTed value, in whichever form it takes for the column's type."""
    if raw is None:
        return False
    if raw == placeholder.text:
        return True
    if column.is_array:
        return isinstance(raw, list) and raw in placeholder.arrays
    if column.base == "bytea":
        return bool(raw == placeholder.b64)
    if column.base == "hstore":
        return raw in (placeholder.hstore, {placeholder.text: placeholder.text})
    return False


def mark_unavailable(table: Table, op: str, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """`after` with each placeholder, of any type, as UNAVAILABLE (the stores keep the
    stored value). In a create it is None instead: an INSERT carries every value, so a
    create with a placeholder is a key change (the row came from another key), and the
    value kept under this key belongs to another row: it is not known. A read (`r`: the
    snapshot, a backfill) carries every value as PostgreSQL holds it, so a value there
    that looks like a placeholder is a real one."""
    if not after or op == "r":
        return after
    placeholder = placeholder_forms(table.placeholder)
    columns = None
    for name, raw in after.items():
        # most values cannot be a placeholder: look no further (this runs for every value)
        if isinstance(raw, str) and raw not in placeholder.texts:
            continue
        if not isinstance(raw, str | list | dict):
            continue
        if columns is None:
            columns = {c.name: c for c in table.columns}
        column = columns.get(name)
        if column is not None and is_unavailable(column, raw, placeholder):
            after[name] = None if op == "c" else UNAVAILABLE
    return after
