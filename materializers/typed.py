"""Debezium's JSON values as typed Spark columns, by each column's PostgreSQL type.

The schema is derived from the catalog (cdc.catalog.Table), read again every
micro-batch, so a column added, dropped or widened in PostgreSQL reaches the
stores without a restart.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from cdc.catalog import Column, Table
from cdc.decode import UNAVAILABLE

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql.types import DataType

__all__ = ["PLACEHOLDER_BYTES_B64", "json_type", "spark_type", "typed_column", "typed_image"]

# Debezium's placeholder for an unchanged TOASTed bytea, as JsonConverter writes it
PLACEHOLDER_BYTES_B64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")


def _decimal(column: Column) -> tuple[int, int] | None:
    match = _NUMERIC.search(column.type.replace(" ", ""))
    if match and int(match.group(1)) <= 38:
        return int(match.group(1)), int(match.group(2))
    return None


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
        scale = _decimal(column)
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


def _convert(column: Column, value: SparkColumn) -> SparkColumn:
    from pyspark.sql import functions as F

    base = column.base
    target = _element_spark_type(column)
    if base in ("numeric", "money"):
        return value.cast(target)
    if base == "date":
        return F.date_add(F.lit("1970-01-01").cast("date"), value)
    if base == "timestamp":
        millis = column.precision is not None and column.precision <= 3
        instant = F.timestamp_millis(value) if millis else F.timestamp_micros(value)
        return instant.cast("timestamp_ntz")  # the session time zone is UTC
    if base == "timestamptz":
        return F.to_timestamp(value)
    if base == "time":
        return F.date_format(F.timestamp_micros(value), "HH:mm:ss.SSSSSS")
    if base == "bytea":
        return F.unbase64(value)
    return value


def typed_column(column: Column, raw: SparkColumn) -> SparkColumn:
    """A Debezium-JSON-typed value as the warehouse type."""
    from pyspark.sql import functions as F

    if column.is_array:
        return F.transform(raw, lambda e: _convert(column, e))
    return _convert(column, raw)


def is_placeholder(column: Column, raw: SparkColumn) -> SparkColumn | None:
    """True where the value is Debezium's unchanged-TOAST placeholder (None: never)."""
    from pyspark.sql import functions as F

    if column.is_array:
        return None
    if column.base == "bytea":
        return F.coalesce(raw == F.lit(PLACEHOLDER_BYTES_B64), F.lit(False))
    from pyspark.sql import types as T

    if isinstance(json_type(column), T.StringType):
        return F.coalesce(raw == F.lit(UNAVAILABLE), F.lit(False))
    return None


def typed_image(table: Table, image: SparkColumn, prefix: str = "") -> list[Any]:
    """Columns decoding a JSON image (text) into the table's typed columns, plus, per column
    that can hold a TOAST placeholder, a `__ph_<name>` flag."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(c.name, json_type(c)) for c in table.columns])
    parsed = F.from_json(image, schema)
    columns = []
    for column in table.columns:
        raw = parsed[column.name]
        columns.append(typed_column(column, raw).alias(prefix + column.name))
        flag = is_placeholder(column, raw)
        if flag is not None:
            columns.append(flag.alias(f"__ph_{column.name}"))
    return columns
