"""Verify's pure parts: key texts, key filters and the warehouse's canonical values."""

from __future__ import annotations

from datetime import UTC, datetime, time
from decimal import Decimal

from cdc.catalog import Column, Table
from cdc.decode import Interval
from materializers.verify import Drift, _compare, _key_filter, _warehouse_value, key_text


def col(name: str, base: str, array: bool = False) -> Column:
    return Column(name, base, base, "X", array, None, False)


TABLE = Table(
    "public",
    "t",
    (col("id", "int4"), col("code", "text"), col("v", "jsonb")),
    ("id", "code"),
    "d",
    0,
    0,
)


def test_key_text_is_the_change_events_key() -> None:
    assert key_text(TABLE, {"id": 7, "code": 'é"x', "v": None}) == '{"id":7,"code":"é\\"x"}'


def test_key_filter_quotes_every_value() -> None:
    where = _key_filter(TABLE, ['{"id":7,"code":"a\'b"}', '{"id":8,"code":"x"}'])
    assert where == "(\"id\", \"code\") IN ((7, 'a''b'), (8, 'x'))"


def test_both_sides_of_the_warehouse_compare_in_one_form() -> None:
    aware = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    naive = datetime(2026, 1, 2, 3, 4, 5, 6)
    assert _warehouse_value(col("t", "timestamptz"), aware) == _warehouse_value(
        col("t", "timestamptz"), naive
    )
    assert _warehouse_value(col("j", "jsonb"), {"b": 1, "a": [1]}) == _warehouse_value(
        col("j", "jsonb"), '{"a": [1], "b": 1}'
    )
    assert _warehouse_value(col("f", "float4"), 1.100000023841858) == _warehouse_value(
        col("f", "float4"), 1.1
    )
    assert _warehouse_value(col("c", "time"), time(1, 2, 3)) == "01:02:03.000000"
    assert _warehouse_value(col("i", "interval"), "P1M2DT3S") == _warehouse_value(
        col("i", "interval"), Interval(1, 2, 3_000_000)
    )
    assert _warehouse_value(col("n", "numeric"), Decimal("1.50")) == "1.50"
    assert _warehouse_value(col("a", "text", array=True), ["x", None]) == ["x", None]


def test_compare_narrows_to_the_keys_that_differ() -> None:
    table = Table("public", "t", (col("id", "int4"), col("name", "text")), ("id",), "d", 0, 0)
    source = {f'{{"id":{i}}}': {"id": i, "name": f"n{i}"} for i in range(1, 6)}
    held = {k: {"id": str(v["id"]), "name": v["name"]} for k, v in source.items()}
    assert _compare("cache", table, source, held) == Drift("cache", "public.t", 5, 5)
    held['{"id":2}'] = {"id": "2", "name": "changed"}
    del held['{"id":3}']
    held['{"id":9}'] = {"id": "9", "name": "n9"}
    drift = _compare("cache", table, source, held)
    assert (drift.missing, drift.extra, drift.different) == (
        ['{"id":3}'],
        ['{"id":9}'],
        ['{"id":2}'],
    )
