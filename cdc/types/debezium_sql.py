"""A column's value as Debezium encodes it in a change event, computed by PostgreSQL in
SQL (`column_json`): the snapshot's rows (cdc/capture/snapshot/events.py) and the
generated columns (cdc/log/generated_columns.py) are written in the encoding the connector
uses under the project's settings (decimal.handling.mode=string,
time.precision.mode=adaptive_time_microseconds, interval.handling.mode=string, binary as
base64)."""

from __future__ import annotations

from psycopg import sql

from cdc.core.catalog import Column
from cdc.types.decode import (
    DATE_INFINITY,
    MICROS_INFINITY,
    MILLIS_INFINITY,
    NUMERIC_SPECIAL,
    bit_length,
)

__all__ = ["column_json"]

# Types whose to_json() is already what Debezium writes (numbers, booleans).
_NATIVE = {"int2", "int4", "int8", "oid", "float4", "float8", "bool"}
_TEXT_OF_JSON = {"json", "jsonb"}
# numeric NaN / Infinity / -Infinity as Debezium writes them (decimal.handling.mode=string)
_NUMERIC_WORDS = sql.SQL(" ").join(
    sql.SQL("WHEN {} THEN {}").format(sql.Literal(text), sql.Literal(word))
    for word, text in NUMERIC_SPECIAL.items()
)


def _element_json(column: Column, ref: sql.Composable) -> sql.Composable:
    """A json value for one (non-array) value of column's base type."""
    base = column.base
    if base in _NATIVE:  # float NaN / Infinity: to_json writes the strings Jackson writes
        return sql.SQL("to_json({})").format(ref)
    if base == "numeric":  # decimal.handling.mode=string: the exact digits
        return sql.SQL("to_json(CASE {ref}::numeric {words} ELSE {ref}::numeric::text END)").format(
            ref=ref, words=_NUMERIC_WORDS
        )
    if base == "money":
        return sql.SQL("to_json({}::numeric::text)").format(ref)
    if base in _TEXT_OF_JSON:  # io.debezium.data.Json: the document as text
        return sql.SQL("to_json({}::text)").format(ref)
    if base in ("bit", "varbit"):
        return _bits_json(column, ref)
    if base == "bytea":  # bytes, which JsonConverter writes as base64
        return sql.SQL("to_json(translate(encode({}, 'base64'), E'\\n', ''))").format(ref)
    if base == "date":  # io.debezium.time.Date: days since the epoch
        return sql.SQL(
            "to_json(CASE {ref} WHEN 'infinity' THEN {inf} WHEN '-infinity' THEN {ninf} "
            "ELSE {ref} - DATE '1970-01-01' END)"
        ).format(ref=ref, inf=sql.Literal(DATE_INFINITY[0]), ninf=sql.Literal(DATE_INFINITY[1]))
    if base == "time":  # io.debezium.time.MicroTime (24:00:00 is 86400000000)
        return sql.SQL("to_json((EXTRACT(EPOCH FROM {}) * 1000000)::bigint)").format(ref)
    if base == "timestamp":
        return _timestamp_json(column, ref)
    if base == "timestamptz":
        return _zoned_timestamp_json(column, ref)
    if base == "timetz":  # io.debezium.time.ZonedTime, in UTC (24:00:00+00 is 00:00:00Z)
        return sql.SQL("to_json((({} AT TIME ZONE 'UTC')::time)::text || 'Z')").format(ref)
    if base == "interval":  # interval.handling.mode=string: ISO 8601 (session intervalstyle)
        return sql.SQL("to_json({}::text)").format(ref)
    return sql.SQL("to_json({})").format(ref)  # text (char keeps its padding), enums, uuid...


def _bits_json(column: Column, ref: sql.Composable) -> sql.Composable:
    """bit(1): a boolean. Other bit strings: io.debezium.data.Bits, the bits as a
    little-endian number in as few bytes as it needs (none for zero), base64 in JSON."""
    if bit_length(column) == 1:
        return sql.SQL("to_json({} = B'1')").format(ref)
    # the bits without leading zeros, padded to whole bytes; its bytes in reverse order
    return sql.SQL(
        "CASE WHEN {ref} IS NOT NULL THEN (SELECT to_json(translate(encode(decode(coalesce("
        "string_agg(lpad(to_hex(substring(p FROM 8 * i + 1 FOR 8)::bit(8)::int), 2, '0'), '' "
        "ORDER BY i DESC), ''), "
        "'hex'), 'base64'), E'\\n', '')) FROM (SELECT lpad(t, (length(t) + 7) / 8 * 8, '0') "
        "FROM ltrim({ref}::text, '0') AS t) AS b(p), generate_series(0, length(p) / 8 - 1) AS i) "
        "END"
    ).format(ref=ref)


def _timestamp_json(column: Column, ref: sql.Composable) -> sql.Composable:
    """Timestamp (ms since the epoch) up to 3 fractional digits, MicroTimestamp beyond.

    Infinities are Debezium's PGStatement numbers. A MicroTimestamp after
    294247-01-10T04:00:54Z is what Debezium computes: its seconds saturate at Long.MAX
    (TimeUnit.SECONDS.toMicros) and the second's micros are added with Java's long
    wrap-around; a Timestamp never overflows in PostgreSQL's range.
    """
    if column.precision is not None and column.precision <= 3:
        return sql.SQL(
            "to_json(CASE {ref} WHEN 'infinity' THEN {inf} WHEN '-infinity' THEN {ninf} "
            "ELSE (EXTRACT(EPOCH FROM {ref}) * 1000)::bigint END)"
        ).format(ref=ref, inf=sql.Literal(MILLIS_INFINITY[0]), ninf=sql.Literal(MILLIS_INFINITY[1]))
    micros = sql.SQL("(EXTRACT(MICROSECONDS FROM {})::bigint % 1000000)").format(ref)
    return sql.SQL(
        "to_json(CASE WHEN {ref} = 'infinity' THEN {inf} WHEN {ref} = '-infinity' THEN {ninf} "
        "WHEN {ref} >= TIMESTAMP '294247-01-10 04:00:55' THEN (CASE {micros} "
        "WHEN 0 THEN 9223372036854775807 ELSE {micros} - 9223372036854775809 END)::bigint "
        "ELSE (EXTRACT(EPOCH FROM {ref}) * 1000000)::bigint END)"
    ).format(
        ref=ref,
        micros=micros,
        inf=sql.Literal(MICROS_INFINITY[0]),
        ninf=sql.Literal(MICROS_INFINITY[1]),
    )


def _zoned_timestamp_json(column: Column, ref: sql.Composable) -> sql.Composable:
    """io.debezium.time.ZonedTimestamp: ISO 8601 in UTC with as many fractional digits as
    the column declares (6 when it does not, none for 0); a year before 0001 or after 9999
    as java.time writes it (astronomical, signed: '-0043-03-15T…', '+12345-06-07T…');
    infinities as the words."""
    digits = 6 if column.precision is None else column.precision
    rest = '-MM-DD"T"HH24:MI:SS' + (f".FF{digits}" if digits else "") + '"Z"'
    utc = sql.SQL("({} AT TIME ZONE 'UTC')").format(ref)
    year = sql.SQL("EXTRACT(YEAR FROM {})::int").format(utc)
    return sql.SQL(
        "to_json(CASE WHEN {ref} = 'infinity' THEN 'infinity' "
        "WHEN {ref} = '-infinity' THEN '-infinity' "
        "WHEN {ref} >= '0001-01-01 00:00:00+00' AND {ref} < '10000-01-01 00:00:00+00' "
        "THEN to_char({utc}, {full}) "
        "ELSE CASE WHEN {year} > 9999 THEN '+' || {year} WHEN {year} = -1 THEN '0000' "
        "ELSE '-' || lpad((-1 - {year})::text, 4, '0') END || to_char({utc}, {rest}) END)"
    ).format(ref=ref, utc=utc, year=year, full=sql.Literal("YYYY" + rest), rest=sql.Literal(rest))


def column_json(column: Column, masked: sql.Composable | None = None) -> sql.Composable:
    """SQL for the JSON text of a column's value as Debezium encodes it ('null' for NULL);
    `masked`: the text it leaves PostgreSQL as (cdc/capture/masks.py), the Connect transform's."""
    ref = sql.Identifier(column.name)
    value: sql.Composable
    if masked is not None:
        value = sql.SQL("to_json({})").format(masked)
    elif column.is_array:
        element = _element_json(column, sql.Identifier("e"))
        value = sql.SQL(
            "CASE WHEN {ref} IS NULL THEN NULL ELSE COALESCE("
            "(SELECT json_agg({element} ORDER BY o) FROM unnest({ref}) WITH ORDINALITY AS u(e, o)),"
            " '[]'::json) END"
        ).format(ref=ref, element=element)
    else:
        value = _element_json(column, ref)
    return sql.SQL("COALESCE(({})::text, 'null')").format(value)
