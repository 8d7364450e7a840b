"""The text and JSON the Python stores write for each kind of value (pure logic)."""

import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from cdc.core.catalog import Column
from cdc.stores.search.store import FastJSON
from cdc.types.store_forms import cache_text, document_value


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("", ""),
        (0, "0"),
        (-5_000_000_000, "-5000000000"),
        (True, "true"),
        (False, "false"),
        (1.5, "1.5"),
        ([1, 2], "[1, 2]"),
        ({"a": "é"}, '{"a": "é"}'),
        (Decimal("12.30"), "12.30"),
        (date(2026, 1, 2), "2026-01-02"),
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "2026-01-02T03:04:05+00:00"),
        (b"\x00\x01", "AAE="),
    ],
)
def test_cache_text(value: object, text: str) -> None:
    assert cache_text(value) == text


def test_cache_text_of_numbers_is_their_json() -> None:
    for value in (0, 1, -1, 2**63 - 1, True, False, 0.1, 1e300):
        assert cache_text(value) == json.dumps(value)


def _column(base: str) -> Column:
    return Column("c", base, base, "N", False, None, False)


def test_search_documents_serialize_as_json_does() -> None:
    doc = {
        "id": 7,
        "name": "Ada ü",
        "price": document_value(_column("numeric"), "12.50"),
        "ok": True,
        "attrs": {"k": [1, "x"]},
        "none": None,
    }
    text = FastJSON().dumps(doc)
    assert json.loads(text) == doc
    assert FastJSON().loads(text) == doc
    assert FastJSON().dumps("already text") == "already text"


def test_non_finite_floats_are_not_silently_nulled() -> None:
    # JSON has no NaN: the value goes as text (the index refuses it: a dead letter),
    # never as null
    value = document_value(_column("float8"), "NaN")
    assert isinstance(value, str) and math.isnan(float(value))
    assert FastJSON().loads(FastJSON().dumps({"v": value}))["v"] == value


def test_search_retries_what_says_the_store_is_down_and_dead_letters_the_rest() -> None:
    from cdc.stores.search.store import _retryable

    for status in ("N/A", "TIMEOUT", None, 429, 500, 503):
        assert _retryable(status), status
    for status in (400, 404, 409):  # a document OpenSearch refuses is that record's fault
        assert not _retryable(status), status


def test_no_column_reaches_the_cache_metadata() -> None:
    from cdc.stores.cache.store import column_fields, field_name

    columns = ["body", "_lsn", "_deleted", "__x", "a_b"]
    fields = [field_name(c) for c in columns]
    assert fields == ["body", "__lsn", "__deleted", "___x", "a_b"]
    metadata = ["_commit_lsn", "_lsn", "_offset", "_partition", "_commit_ms", "_deleted"]
    assert not set(fields) & set(metadata)
    entry = dict.fromkeys(fields + metadata, "v")
    assert sorted(column_fields(entry)) == sorted(columns)


def test_a_json_value_that_is_not_an_object_is_indexed_as_one() -> None:
    # OpenSearch's flat_object refuses a top-level array or scalar: it would be a dead letter
    jsonb = Column("j", "jsonb", "jsonb", "U", False, None, False)
    jsonbs = Column("js", "jsonb[]", "jsonb", "U", True, None, False)
    assert document_value(jsonb, '{"a": [1]}') == {"a": [1]}
    assert document_value(jsonb, '[1, "two"]') == {"_value": [1, "two"]}
    assert document_value(jsonb, "5") == {"_value": 5}
    assert document_value(jsonbs, ['{"n": 1}', "[1]"]) == [{"n": 1}, {"_value": [1]}]


def test_numerics_spark_cannot_type_as_decimal_are_kept_as_exact_text() -> None:
    from pyspark.sql import types as T

    from cdc.types.spark_types import spark_type

    def numeric(kind: str) -> Column:
        return Column("n", kind, "numeric", "N", False, None, False)

    assert spark_type(numeric("numeric(12,2)")) == T.DecimalType(12, 2)
    # PostgreSQL 15 allows a scale above the precision, and a negative one
    assert spark_type(numeric("numeric(3,5)")) == T.StringType()
    assert spark_type(numeric("numeric(5,-2)")) == T.StringType()
    assert spark_type(numeric("numeric(40,2)")) == T.StringType()


def test_a_window_query_reads_each_column_as_its_widest_widening() -> None:
    from pyspark.sql import types as T

    from cdc.types.spark_types import json_type, spark_type, widest

    def column(kind: str, base: str, array: bool = False) -> Column:
        return Column("c", kind, base, "N", array, None, False)

    assert spark_type(widest(column("numeric(6,2)", "numeric"))) == T.DecimalType(38, 2)
    assert json_type(widest(column("integer", "int4"))) == T.LongType()
    assert json_type(widest(column("smallint[]", "int2", True))) == T.ArrayType(T.LongType())
    assert json_type(widest(column("real", "float4"))) == T.DoubleType()
    # exact text and other types stay as they are
    assert spark_type(widest(column("numeric", "numeric"))) == T.StringType()
    assert widest(column("text", "text")) == column("text", "text")


@pytest.mark.parametrize(
    "real",
    [1e-45, 3e-45, 1.1754942e-38, 0.1, 1 / 3, 3.4028235e38, 16777217.0, -2.5e-40],
    ids=["least subnormal", "subnormal", "largest subnormal", "0.1", "1/3", "max", "2^24+1",
         "negative subnormal"],
)  # fmt: skip
def test_a_real_has_one_form_however_it_was_read(real: float) -> None:
    """verify reads a real from PostgreSQL's text (a double of its shortest digits) and
    from Delta (a float's exact binary value): the same bits give the same form, and the
    form is the real again."""
    import struct

    from cdc.types.keys import shortest_real

    (stored,) = struct.unpack("<f", struct.pack("<f", real))  # the float Delta holds
    text = float(repr(stored))  # the digits PostgreSQL prints, read back as a double
    assert shortest_real(real) == shortest_real(stored) == shortest_real(text)
    assert struct.pack("<f", shortest_real(stored)) == struct.pack("<f", real)
