"""Debezium's JSON values as typed Spark columns, by each column's PostgreSQL type.

The schema is derived from the catalog (cdc.core.catalog.Table), read again every
micro-batch, so a column added, dropped or widened in PostgreSQL reaches the
stores without a restart.

Every value a column can hold converts, and no expression here ever fails a batch
(Spark runs with ANSI on: casts and parses are the try_ kind). What the warehouse holds
for PostgreSQL's special values:

- dates and timestamps BC or after year 9999: the exact value (Spark's date and
  timestamp are proleptic Gregorian days and microseconds; Delta stores them as they
  are; Spark prints them '-0043-03-15', '+12345-06-07 01:02:03.456789');
- `infinity` / `-infinity`: the last / first value of the Spark type: date
  +5881580-07-11 / -5877641-06-23, timestamp +294247-01-10 04:00:54.775807 /
  -290308-12-21 19:59:05.224192. They sort after / before every value PostgreSQL can
  hold. (Spark's own PostgreSQL JDBC dialect clamps them to 9999-12-31 23:59:59.999999
  and 0001-01-01, the range Spark documents; the warehouse keeps later years, so that
  would put infinity before year 10000.)
- numeric NaN / Infinity / -Infinity: none in a decimal(p,s) column (Spark's decimal has
  no such values: see below); their PostgreSQL text ('NaN', 'Infinity', '-Infinity') in the exact
  text column of an unbounded numeric; float NaN / Infinity stay themselves;
- time 24:00:00: '24:00:00.000000';
- a value the Spark type cannot hold (a timestamp after 294247-01-10T04:00:54Z, which
  Debezium's MicroTimestamp overflows, or a decimal special value) converts to NULL, and
  `unheld_columns` names its column: the apply job sends such a record to the
  dead-letter topic (for the warehouse alone) rather than write the NULL.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cdc.core.catalog import RESERVED_PREFIX, Column, Table
from cdc.types.decode import (
    DATE_INFINITY,
    INFINITY,
    MICROS_INFINITY,
    MILLIS_INFINITY,
    NEGATIVE_INFINITY,
    NUMERIC_SPECIAL,
    Placeholder,
    bit_length,
    placeholder_forms,
)

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql.types import DataType

__all__ = [
    "PG_MIN_US",
    "PLACEHOLDER_FLAG",
    "decimal_of",
    "flagged",
    "json_type",
    "may_hold_placeholder",
    "quoted",
    "spark_type",
    "typed_column",
    "typed_image",
    "unheld_columns",
    "widens",
    "widest",
]

_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# PostgreSQL's first timestamp (4714-11-24 00:00:00 BC) in microseconds: a MicroTimestamp
# before it (or Long.MAX) is Debezium's overflow of a value after 294247-01-10T04:00:54Z
PG_MIN_US = -210866803200000000
_DAY_US = 86_400_000_000
# the name of a column's TOAST placeholder flag (typed_image) is this and the column's:
# a prefix no column of a table can take (cdc.core.catalog.reserved_problem), so a flag
# never meets a column, whatever the columns are named (a column `__ph_x` is a column)
PLACEHOLDER_FLAG = RESERVED_PREFIX + "ph_"


def flagged(flag: str) -> str:
    """The column a placeholder flag (PLACEHOLDER_FLAG and the column's name) is of."""
    return flag[len(PLACEHOLDER_FLAG) :]


def decimal_of(column: Column) -> tuple[int, int] | None:
    """(precision, scale) of a numeric(p,s) the warehouse holds as a decimal; None: exact
    text (unbounded, a negative scale, more than Spark's 38 digits)."""
    match = _NUMERIC.search(column.type.replace(" ", ""))
    if not match:  # unbounded, or a negative scale (numeric(5,-2)): exact text
        return None
    precision, scale = int(match.group(1)), int(match.group(2))
    # Spark's decimal: at most 38 digits, scale at most the precision (PostgreSQL 15
    # allows numeric(3,5)); otherwise exact text
    return (precision, scale) if precision <= 38 and scale <= precision else None


def widest(column: Column) -> Column:
    """The column as a query that outlives the catalog it started with reads it: typed
    as every widening PostgreSQL may make of it later would be (integers as bigint,
    float4 as float8, numeric(p,s) as numeric(38,s)), so that a value written after
    `ALTER COLUMN … TYPE` to a wider type is read whole, never NULL."""
    suffix = "[]" if column.is_array else ""
    if column.base in ("int2", "int4"):
        return replace(column, type=f"bigint{suffix}", base="int8")
    if column.base == "float4":
        return replace(column, type=f"double precision{suffix}", base="float8")
    if column.base == "numeric" and (held := decimal_of(column)) is not None:
        return replace(column, type=f"numeric(38,{held[1]}){suffix}")
    return column


def quoted(name: str) -> str:
    """A column (or path) name for Spark SQL and F.col: in backticks, a backtick doubled,
    so spaces, dots and any other character are part of the name."""
    return "`" + name.replace("`", "``") + "`"


def _element_json_type(column: Column) -> DataType:
    from pyspark.sql import types as T

    base = column.base
    if base in ("int2", "int4"):
        return T.IntegerType()
    if base in ("int8", "oid", "time", "timestamp"):
        return T.LongType()
    if base == "date":
        return T.IntegerType()
    if base == "float4":
        return T.FloatType()
    if base == "float8":
        return T.DoubleType()
    if base == "bool":
        return T.BooleanType()
    return T.StringType()


def json_type(column: Column) -> DataType:
    """How the column's value is typed in Debezium's JSON."""
    from pyspark.sql import types as T

    element = _element_json_type(column)
    return T.ArrayType(element) if column.is_array else element


def _element_spark_type(column: Column) -> DataType:
    from pyspark.sql import types as T

    base = column.base
    if base in ("numeric", "money"):
        scale = decimal_of(column)
        return T.DecimalType(*scale) if scale else T.StringType()  # unbounded: exact text
    if base == "date":
        return T.DateType()
    if base == "timestamp":
        return T.TimestampNTZType()
    if base == "timestamptz":
        return T.TimestampType()
    if base == "bytea":
        return T.BinaryType()
    if base == "time":
        return T.StringType()
    return _element_json_type(column)


def spark_type(column: Column) -> DataType:
    """The column's type in the warehouse."""
    from pyspark.sql import types as T

    element = _element_spark_type(column)
    return T.ArrayType(element) if column.is_array else element


def _timestamp(micros: Any) -> SparkColumn:
    from pyspark.sql import functions as F

    return F.timestamp_micros(F.lit(micros) if isinstance(micros, int) else micros)


def _convert(column: Column, value: SparkColumn) -> SparkColumn:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    base = column.base
    target = _element_spark_type(column)
    if base in ("numeric", "money"):
        if isinstance(target, T.DecimalType):
            return value.try_cast(target)  # NaN, Infinity: NULL (see unheld_columns)
        text = value  # an unbounded numeric: its exact text, specials as PostgreSQL writes them
        for word, written in NUMERIC_SPECIAL.items():
            text = F.when(value == word, F.lit(written)).otherwise(text)
        return text
    if base == "date":
        return (
            F.when(value == DATE_INFINITY[0], F.date_from_unix_date(F.lit(_INT_MAX)))
            .when(value == DATE_INFINITY[1], F.date_from_unix_date(F.lit(_INT_MIN)))
            .otherwise(F.date_from_unix_date(value))
        )
    if base == "timestamp":
        if column.precision is not None and column.precision <= 3:
            words, millis = MILLIS_INFINITY, _LONG_MAX // 1000
            held = F.when(value.between(-millis, millis), F.timestamp_millis(value))
        else:
            words = MICROS_INFINITY
            held = F.when((value >= PG_MIN_US) & (value < _LONG_MAX), _timestamp(value))
        instant = (
            F.when(value == words[0], _timestamp(_LONG_MAX))
            .when(value == words[1], _timestamp(_LONG_MIN))
            .otherwise(held)
        )
        return instant.cast("timestamp_ntz")  # the session time zone is UTC
    if base == "timestamptz":
        return (
            F.when(value == INFINITY, _timestamp(_LONG_MAX))
            .when(value == NEGATIVE_INFINITY, _timestamp(_LONG_MIN))
            .otherwise(F.try_to_timestamp(value))  # NULL after year 294247
        )
    if base == "time":
        return F.when(value == _DAY_US, F.lit("24:00:00.000000")).otherwise(
            F.date_format(F.timestamp_micros(value), "HH:mm:ss.SSSSSS")
        )
    if base == "bytea":
        return F.unbase64(value)
    if base in ("bit", "varbit"):
        return _bits(column, value)
    return value


def _bits(column: Column, value: SparkColumn) -> SparkColumn:
    """PostgreSQL's text of a bit string (cdc.types.decode.bits_text, in Spark): bit(1) comes
    as a boolean (JSON true/false read as text), other bit strings as little-endian bytes."""
    from pyspark.sql import functions as F

    reversed_bytes = F.reverse(F.regexp_extract_all(F.hex(F.unbase64(value)), F.lit("(..)"), 1))
    bits = F.array_join(F.transform(reversed_bytes, lambda h: F.lpad(F.conv(h, 16, 2), 8, "0")), "")
    bits = F.regexp_replace(bits, "^0+", "")
    length = bit_length(column)
    text = F.lpad(bits, length, "0") if length else F.when(bits == "", "0").otherwise(bits)
    return F.when(value == "true", "1").when(value == "false", "0").otherwise(text)


def typed_column(column: Column, raw: SparkColumn) -> SparkColumn:
    """A Debezium-JSON-typed value as the warehouse type."""
    from pyspark.sql import functions as F

    if column.is_array:
        return F.transform(raw, lambda e: _convert(column, e))
    return _convert(column, raw)


def may_hold_placeholder(after: SparkColumn, texts: set[str]) -> SparkColumn:
    """False where a row image (JSON text) holds none of the placeholders `texts` (the
    tables' connectors') in any of their forms (is_placeholder's): a text or JSON value,
    an hstore, bytea (base64), a uuid array, an array of the placeholder's codes. A value
    that merely contains one of them counts too: true only means look closer."""
    forms = []
    for text in sorted(texts):
        placeholder = placeholder_forms(text)
        codes = [str(c) for c in placeholder.codes[:8]]
        forms += [text, placeholder.b64, placeholder.uuid, ",".join(codes), ", ".join(codes)]
    if not forms:  # no table
        from pyspark.sql import functions as F

        return F.lit(False)
    return functools.reduce(operator.or_, [after.contains(form) for form in forms])


def is_placeholder(
    column: Column, raw: SparkColumn, placeholder: Placeholder
) -> SparkColumn | None:
    """True where the value is the connector's unchanged-TOAST placeholder (None: never)."""
    from pyspark.sql import functions as F

    if column.is_array:  # the forms Placeholder.arrays lists, as JSON text
        forms = [json.dumps(f, separators=(",", ":")) for f in placeholder.arrays]
        return F.coalesce(F.to_json(raw).isin(forms), F.lit(False))
    if column.base == "bytea":  # base64, as JsonConverter writes bytes
        return F.coalesce(raw == F.lit(placeholder.b64), F.lit(False))
    if column.base == "hstore":
        return F.coalesce(raw.isin(placeholder.hstore, placeholder.text), F.lit(False))
    from pyspark.sql import types as T

    if isinstance(json_type(column), T.StringType):
        return F.coalesce(raw == F.lit(placeholder.text), F.lit(False))
    return None


def _lost(column: Column, placeholder: str, raw: SparkColumn) -> SparkColumn:
    """True where a value (not a TOAST placeholder) converts to NULL."""
    from pyspark.sql import functions as F

    held = _convert(column, raw).isNotNull()
    if column.base == "timestamp":  # a number: never a placeholder
        return raw.isNotNull() & ~held
    return raw.isNotNull() & (raw != F.lit(placeholder)) & ~held


def unheld_columns(table: Table, image: SparkColumn) -> SparkColumn | None:
    """An array of the names of the columns whose value in the JSON image (text) the
    warehouse cannot hold, and would hold as NULL (see the module's docstring); None when
    the table has no column that can hold such a value. The apply job dead-letters a
    record with any."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    parsed = F.from_json(
        image, T.StructType([T.StructField(c.name, json_type(c)) for c in table.columns])
    )
    names = []
    for column in table.columns:
        if column.base not in ("numeric", "money", "timestamp", "timestamptz"):
            continue
        raw = parsed[column.name]
        if column.is_array:
            # one argument left: Spark counts the lambda's parameters
            flag = F.exists(raw, functools.partial(_lost, column, table.placeholder))
        else:
            flag = _lost(column, table.placeholder, raw)
        names.append(F.when(flag, F.lit(column.name)))
    if not names:
        return None
    return F.filter(F.array(*names), lambda name: name.isNotNull())


def typed_image(
    table: Table, image: SparkColumn, prefix: str = "", placeholders: bool = True
) -> list[Any]:
    """Columns decoding a JSON image (text) into the table's typed columns, plus, per column
    that can hold a TOAST placeholder (unless `placeholders` is false: a key never holds
    one), a flag (PLACEHOLDER_FLAG and its name): the value is the table's connector's
    placeholder."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(c.name, json_type(c)) for c in table.columns])
    parsed = F.from_json(image, schema)
    forms = placeholder_forms(table.placeholder)
    columns = []
    for column in table.columns:
        raw = parsed[column.name]
        columns.append(typed_column(column, raw).alias(prefix + column.name))
        flag = is_placeholder(column, raw, forms) if placeholders else None
        if flag is not None:
            columns.append(flag.alias(PLACEHOLDER_FLAG + column.name))
    return columns


_SPARK_INTEGERS = ("byte", "short", "integer", "long")


def widens(old: Any, new: Any) -> bool:
    """Whether every value of Spark type `old` is one of `new`, unchanged: a wider
    integer, an integer as a double or a wide enough decimal, a float as a double, a
    decimal of more digits (and no fewer after the point), a date as a timestamp."""
    from pyspark.sql import types as T

    a, b = old.typeName(), new.typeName()
    if a in _SPARK_INTEGERS and b in _SPARK_INTEGERS:
        return _SPARK_INTEGERS.index(a) <= _SPARK_INTEGERS.index(b)
    if a in _SPARK_INTEGERS and b == "double":
        return bool(a != "long")
    if a in _SPARK_INTEGERS and isinstance(new, T.DecimalType):
        digits = {"byte": 3, "short": 5, "integer": 10, "long": 20}[a]
        return bool(new.precision - new.scale >= digits)
    if (a, b) == ("float", "double"):
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return bool(
            new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
        )
    return (a, b) in (("date", "timestamp_ntz"), ("date", "timestamp"))
