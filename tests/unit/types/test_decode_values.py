"""Every value a column can hold decodes (pure logic): PostgreSQL's infinities, BC dates,
years after 9999, numeric NaN / Infinity, 24:00:00, as Debezium 3.6.3 sends them (the
raw values below are what it streamed for such rows); what cannot be a value of the
column raises ValueDecodeError naming the column.

The same values through the warehouse's Spark expressions (cdc/types/spark_types.py) are
checked in tests/integration/test_special_values.py: tests/unit runs no Spark."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.core.catalog import Column
from cdc.core.errors import CdcError, ValueDecodeError
from cdc.types.decode import UNAVAILABLE, decode_row, decode_value
from cdc.types.store_forms import cache_text


def column(base: str, precision: int | None = None, array: bool = False) -> Column:
    return Column(f"c_{base}", base, base, "X", array, precision, False)


DATE, TS, TS3, TS0, TSTZ = (
    column("date"),
    column("timestamp"),
    column("timestamp", 3),
    column("timestamp", 0),
    column("timestamptz"),
)

CASES: list[tuple[Column, Any, Any]] = [
    # infinity / -infinity: PostgreSQL's words
    (DATE, -2147472692, "infinity"),
    (DATE, -2147472691, "-infinity"),
    (TS, 9223372036825200000, "infinity"),
    (TS, -9223372036832400000, "-infinity"),
    (TS3, 9223372036825200, "infinity"),
    (TS0, -9223372036832400, "-infinity"),
    (TSTZ, "infinity", "infinity"),
    (TSTZ, "-infinity", "-infinity"),
    # BC (astronomical years: 1 BC is 0000, 44 BC is -0043) and after 9999: ISO 8601 text
    (DATE, -735160, "-0043-03-15"),
    (DATE, -719163, "0000-12-31"),
    (DATE, -2440550, "-4712-01-01"),
    (DATE, 3789548, "+12345-06-07"),
    (DATE, 2145042905, "+5874897-12-31"),  # PostgreSQL's last date
    (TS, -63517778703876544, "-0043-03-15T12:34:56.123456"),
    (TS, 327416950923456789, "+12345-06-07T01:02:03.456789"),
    (TS, -210866803200000000, "-4713-11-24T00:00:00"),  # PostgreSQL's first timestamp
    (TS3, -62135596800500, "0000-12-31T23:59:59.500000"),
    (TS0, -63517778704000, "-0043-03-15T12:34:56"),
    (TS3, 9224318015999999, "+294276-12-31T23:59:59.999000"),  # its last one, in ms
    (TSTZ, "-0043-03-15T12:34:56.123456Z", "-0043-03-15T12:34:56.123456+00:00"),
    (TSTZ, "0000-12-31T23:59:59.500Z", "0000-12-31T23:59:59.500000+00:00"),
    (TSTZ, "+12345-06-07T01:02:03Z", "+12345-06-07T01:02:03+00:00"),
    (TSTZ, "+294276-12-31T23:59:59.999999Z", "+294276-12-31T23:59:59.999999+00:00"),
    # the edges of Python's years stay dates and datetimes
    (DATE, -719162, date(1, 1, 1)),
    (DATE, 2932896, date(9999, 12, 31)),
    (TS, -62135596800000000, datetime(1, 1, 1)),
    (TS, 253402300799999999, datetime(9999, 12, 31, 23, 59, 59, 999999)),
    (TSTZ, "0001-01-01T00:00:00.000000Z", datetime(1, 1, 1, tzinfo=UTC)),
    (TSTZ, "2024-01-01T00:00:00.100Z", datetime(2024, 1, 1, 0, 0, 0, 100000, tzinfo=UTC)),
    # time 24:00:00
    (column("time"), 86400000000, "24:00:00"),
    (column("time"), 86399999999, time(23, 59, 59, 999999)),
    (column("timetz"), "00:00:00Z", time(0, 0, tzinfo=UTC)),  # Debezium's 24:00:00+00
    # arrays: each element like a plain value
    (column("date", array=True), [-2147472692, -735160, None, 0],
     ["infinity", "-0043-03-15", None, date(1970, 1, 1)]),
    (column("timestamptz", array=True), ["-infinity", "+12345-06-07T01:02:03Z"],
     ["-infinity", "+12345-06-07T01:02:03+00:00"]),
]  # fmt: skip


@pytest.mark.parametrize(("col", "raw", "expected"), CASES)
def test_special_values_decode(col: Column, raw: Any, expected: Any) -> None:
    assert decode_value(col, raw) == expected


@pytest.mark.parametrize(
    ("base", "raw", "text"),
    [
        ("numeric", "NAN", "NaN"),
        ("numeric", "POSITIVE_INFINITY", "Infinity"),
        ("numeric", "NEGATIVE_INFINITY", "-Infinity"),
        ("numeric", "NaN", "NaN"),  # PostgreSQL's own spelling too
        ("numeric", "12345.6789", "12345.6789"),
        ("money", "-12.30", "-12.30"),
    ],
)
def test_numeric_special_values_are_decimals(base: str, raw: str, text: str) -> None:
    value = decode_value(column(base), raw)
    assert isinstance(value, Decimal)
    assert str(value) == text  # Decimal('NaN') equals nothing, not even itself
    assert [str(v) for v in decode_value(column(base, array=True), [raw, None])[:1]] == [text]


@pytest.mark.parametrize("base", ["float4", "float8"])
def test_float_special_values_stay_floats(base: str) -> None:
    nan, inf, ninf = (decode_value(column(base), v) for v in ("NaN", "Infinity", "-Infinity"))
    assert math.isnan(nan) and inf == math.inf and ninf == -math.inf


@pytest.mark.parametrize(
    ("col", "raw", "text"),
    [
        (DATE, -2147472692, "infinity"),
        (TSTZ, "-infinity", "-infinity"),
        (DATE, -735160, "-0043-03-15"),
        (TS, 327416950923456789, "+12345-06-07T01:02:03.456789"),
        (TSTZ, "2024-01-01T00:00:00.000000Z", "2024-01-01T00:00:00+00:00"),
        (column("numeric"), "NAN", "NaN"),
        (column("numeric"), "NEGATIVE_INFINITY", "-Infinity"),
        (column("float8"), "Infinity", "Infinity"),
        (column("time"), 86400000000, "24:00:00"),
    ],
)
def test_the_cache_holds_postgresql_text(col: Column, raw: Any, text: str) -> None:
    assert cache_text(decode_value(col, raw)) == text


@pytest.mark.parametrize(
    ("col", "raw", "why"),
    [
        # Debezium's MicroTimestamp of a value after 294247-01-10T04:00:54Z: the seconds
        # saturate at Long.MAX and the second's micros wrap around: the value is lost
        (TS, -9223372036853775810, "overflowed"),
        (TS, 9223372036854775807, "overflowed"),
        (DATE, "2024-01-01", "not supported"),
        (column("numeric"), "twelve", "ConversionSyntax"),
        (column("float8"), "many", "could not convert"),
        (TSTZ, "2024-13-01 00:00", "ISO 8601"),
        (column("time"), 86400000001, "outside"),
        (column("timetz"), 3600, "has no attribute"),
        (column("json"), "{", "Expecting"),
        (column("bytea"), "A", "base64"),
        (column("interval"), "1 day", "ISO 8601"),
        (column("date", array=True), [1, "x"], "not supported"),
    ],
)
def test_what_a_column_cannot_hold_raises_value_decode_error(
    col: Column, raw: Any, why: str
) -> None:
    with pytest.raises(ValueDecodeError) as caught:
        decode_value(col, raw)
    error = caught.value
    assert isinstance(error, CdcError)
    assert error.column == col.name and error.value == raw and why in error.reason
    assert col.name in str(error) and "\n" not in str(error)


def test_a_row_names_the_column_it_cannot_decode() -> None:
    from cdc.core.catalog import Table

    table = Table("public", "t", (column("int4"), TS, DATE), ("c_int4",), "d", 0, 0)
    image = {"c_int4": 1, "c_timestamp": 9223372036825200000, "c_date": UNAVAILABLE}
    assert decode_row(table, image) == {
        "c_int4": 1,
        "c_timestamp": "infinity",
        "c_date": UNAVAILABLE,
    }
    with pytest.raises(ValueDecodeError) as caught:
        decode_row(table, {**image, "c_timestamp": -9223372036853775810})
    assert caught.value.column == "c_timestamp"


# An oracle independent of the decoder: the Gregorian calendar repeats every 400 years
# (146097 days), so a day outside Python's years is a day inside them, 400·k years away.
_CYCLE_DAYS, _EPOCH = 146097, date(1970, 1, 1)


def _oracle(days: int) -> str:
    cycles = 0
    while not -719162 <= days + cycles * _CYCLE_DAYS <= 2932896:
        cycles += 1 if days < 0 else -1
    shifted = _EPOCH + timedelta(days=days + cycles * _CYCLE_DAYS)
    year = shifted.year - 400 * cycles
    text = f"{year:04d}" if 0 <= year <= 9999 else (f"+{year}" if year > 0 else f"-{-year:04d}")
    return f"{text}-{shifted.month:02d}-{shifted.day:02d}"


@given(st.integers(-2440588, 2145042905))  # PostgreSQL's dates, 4714-11-24 BC .. 5874897
def test_every_date_decodes_to_its_day(days: int) -> None:
    value = decode_value(DATE, days)
    text = value.isoformat() if isinstance(value, date) else value
    assert text == _oracle(days)


@given(st.integers(-210866803200000000, 9223372036854775806))  # MicroTimestamp's reach
def test_every_timestamp_decodes_to_its_instant(micros: int) -> None:
    if micros in (9223372036825200000,):
        return  # Debezium's infinity
    value = decode_value(TS, micros)
    text = value.isoformat() if isinstance(value, datetime) else value
    days, of_day = divmod(micros, 86_400_000_000)
    clock = (datetime(2000, 1, 1) + timedelta(microseconds=of_day)).time().isoformat()
    assert text == f"{_oracle(days)}T{clock}"
    decoded = decode_value(TSTZ, f"{text}Z")  # the same instant as a ZonedTimestamp
    assert (decoded.isoformat() if isinstance(decoded, datetime) else decoded) == f"{text}+00:00"


@pytest.mark.parametrize(
    ("kind", "raw", "text"),
    [
        # Debezium's Bits: the bits as a little-endian number in the fewest bytes
        ("bit(4)", "Cg==", "1010"),
        ("bit(12)", "AQg=", "100000000001"),
        ("bit(12)", "AQ==", "000000000001"),
        ("bit(4)", "", "0000"),
        ("bit(1)", True, "1"),
        ("bit(1)", False, "0"),
        ("bit varying", "BQ==", "101"),  # a varbit's leading zeros are not in the event
        ("bit varying", "", "0"),
    ],
)
def test_bit_strings_decode_to_postgresql_text(kind: str, raw: Any, text: str) -> None:
    base = "varbit" if kind.startswith("bit varying") else "bit"
    assert decode_value(Column("b", kind, base, "V", False, None, False), raw) == text
