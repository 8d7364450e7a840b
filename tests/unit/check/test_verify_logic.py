"""Verify's pure parts: key texts, key filters and the warehouse's canonical values; the
repair's plan and the backfill's bookkeeping it relies on."""

from __future__ import annotations

from datetime import UTC, datetime, time
from decimal import Decimal

import pytest

from cdc.capture.backfill import (
    MAX_FILTER_CHARS,
    BackfillError,
    BackfillProgress,
    _check_filter_size,
    _follow,
    _note,
    filter_chars,
)
from cdc.check.repair import REPAIR_FILTER_CHARS, _key_filter, key_filters, repair_filters
from cdc.check.verify import Drift, _compare
from cdc.core.catalog import Column, Table
from cdc.stores.warehouse.read.readback import any_of
from cdc.types.decode import Interval
from cdc.types.keys import key_text, store_key_text
from cdc.types.store_forms import cache_form, warehouse_value


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


def test_key_text_is_the_json_modules_text_whatever_the_characters() -> None:
    """key_text writes with orjson where it can: its text must be the json module's (the
    form a key had before, in every store's report and repair), character for character."""
    import json

    key = Table("public", "t", (col("id", "int8"), col("code", "text")), ("id", "code"), "d", 0, 0)
    texts = ["".join(chr(c) for c in range(at, at + 64)) for at in range(0, 0x10000, 64)]
    for text in [*texts, "\ud800 lone", "", '"\\/']:
        for number in (0, -(2**63), 2**63 - 1, 2**70, True, None):
            row = {"id": number, "code": text}
            reference = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
            assert key_text(key, row) == reference
    reals = Table("public", "t", (col("x", "float8"),), ("x",), "d", 0, 0)
    for real in (1e-07, 1e16, 0.1, float("nan"), float("inf")):
        assert key_text(reals, {"x": real}) == json.dumps({"x": real}, separators=(",", ":"))


def test_row_digests_tell_apart_what_the_json_text_tells_apart() -> None:
    """row_digest hashes orjson's text where it says as much as json's: a NaN is not a
    NULL, an integer past 64 bits and a lone surrogate still hash, and what json's
    default=str makes one text (a datetime and its str) stays one."""
    from cdc.stores.base import row_digest

    nan, inf = float("nan"), float("inf")
    when = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    same = [
        ({"a": 1, "b": "x"}, {"b": "x", "a": 1}),
        ({"a": nan}, {"a": nan}),
        ({"a": [1, 2]}, {"a": (1, 2)}),
        ({"a": when}, {"a": str(when)}),
        ({"a": Decimal("1.50")}, {"a": "1.50"}),
        ({"a": 2**70}, {"a": 2**70}),
        ({"a": "\ud800"}, {"a": "\ud800"}),
    ]
    for left, right in same:
        assert row_digest(left) == row_digest(right), (left, right)
    differ = [
        ({"a": nan}, {"a": None}),
        ({"a": [inf]}, {"a": [None]}),
        ({"a": {"b": -inf}}, {"a": {"b": None}}),
        ({"a": 1}, {"a": "1"}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": True}, {"a": 1}),
        ({"a": 2**70}, {"a": 2**70 + 1}),
        ({"a": None}, {}),
        ({"a": "null"}, {"a": None}),
    ]
    for left, right in differ:
        assert row_digest(left) != row_digest(right), (left, right)


def test_a_key_no_change_event_has_is_kept_as_written_not_a_crash() -> None:
    """Someone else's Redis key or document under the pipeline's prefix: verify reads it
    back as a key only the store holds, instead of stopping at it."""
    assert store_key_text(TABLE, '{"id": 7, "code": "x"}') == '{"id":7,"code":"x"}'
    for foreign in ("not json", "[1, 2]", "[" * 5000):
        assert store_key_text(TABLE, foreign) == foreign


def test_an_integer_keys_name_reads_as_its_parse_would() -> None:
    """A name of an integer key taken as it is (it is key_text's form already) gives
    what parsing and decoding it gives, for every shape of name a store may hold."""
    from cdc.types import keys

    table = Table("public", "t", (col("a", "int8"), col("b", "int2")), ("a", "b"), "d", 0, 0)

    def parsed(name: str) -> str:
        try:
            raw = keys._parsed(name)
        except ValueError:
            return name
        if not isinstance(raw, dict):
            return name
        try:
            row = {c: keys.decode_value(table.column(c), raw.get(c)) for c in table.key}
        except (ValueError, keys.ValueDecodeError):
            return name
        return key_text(table, row)

    names = [
        '{"a":1,"b":2}',
        '{"a":-7,"b":0}',
        '{"a":0,"b":-0}',
        '{"a":01,"b":2}',
        '{"a": 1,"b":2}',
        '{"b":2,"a":1}',
        '{"a":1}',
        '{"a":null,"b":1}',
        f'{{"a":{2**63 - 1},"b":1}}',
        f'{{"a":{-(2**63)},"b":1}}',
        f'{{"a":{2**70},"b":1}}',
        '{"a":1.0,"b":2}',
        '{"a":"1","b":2}',
        '{"a":1,"b":2} ',
        "x",
    ]
    for name in names:
        assert store_key_text(table, name) == parsed(name), name
    # the canonical ones are taken as they are, without a parse
    assert keys._integer_key(table.key).fullmatch('{"a":-7,"b":0}')
    assert not keys._integer_key(table.key).fullmatch('{"a":0,"b":-0}')


def test_integer_keys_values_are_read_from_their_texts() -> None:
    """The warehouse removes integer keys by the values in their texts (no read of every
    key it holds); any other key, or a text not in key_text's form, is found by a read."""
    from cdc.types.keys import integer_values

    table = Table("public", "t", (col("a", "int8"), col("b", "int2")), ("a", "b"), "d", 0, 0)
    texts = ['{"a":1,"b":-2}', f'{{"a":{-(10**17) - 3},"b":0}}']
    assert integer_values(table, texts) == [{"a": 1, "b": -2}, {"a": -(10**17) - 3, "b": 0}]
    assert [key_text(table, v) for v in integer_values(table, texts) or []] == texts
    assert integer_values(table, [*texts, '{"a": 1,"b":2}']) is None
    assert integer_values(table, ['{"a":null,"b":2}']) is None
    assert integer_values(TABLE, ['{"id":7,"code":"x"}']) is None


def test_a_notification_that_is_not_json_is_no_notification() -> None:
    assert _note(b"\xff not json") == {}
    assert _note(None) == {}
    assert _note(b'{"aggregate_type": "x"}') == {"aggregate_type": "x"}
    assert not _follow(BackfillProgress(), _note(b"[1]"))


def test_key_filter_quotes_every_value() -> None:
    where = _key_filter(TABLE, ['{"id":7,"code":"a\'b"}', '{"id":8,"code":"x"}'])
    assert where == "(\"id\", \"code\") IN ((7, 'a''b'), (8, 'x'))"


def test_both_sides_of_the_warehouse_compare_in_one_form() -> None:
    aware = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    naive = datetime(2026, 1, 2, 3, 4, 5, 6)
    assert warehouse_value(col("t", "timestamptz"), aware) == warehouse_value(
        col("t", "timestamptz"), naive
    )
    # json is compared as PostgreSQL's text: key order and spaces are data
    assert warehouse_value(col("j", "json"), '{"b": 1, "a": [1]}') != warehouse_value(
        col("j", "json"), '{"a": [1], "b": 1}'
    )
    assert warehouse_value(col("f", "float4"), 1.100000023841858) == warehouse_value(
        col("f", "float4"), 1.1
    )
    # reals that differ in their 7th digit (the next float32 up) differ
    assert warehouse_value(col("f", "float4"), 1.1000001) != warehouse_value(
        col("f", "float4"), 1.1
    )
    assert warehouse_value(col("c", "time"), time(1, 2, 3)) == "01:02:03.000000"
    assert warehouse_value(col("i", "interval"), "P1M2DT3S") == warehouse_value(
        col("i", "interval"), Interval(1, 2, 3_000_000)
    )
    assert warehouse_value(col("n", "numeric"), Decimal("1.50")) == "1.50"
    assert warehouse_value(col("a", "text", array=True), ["x", None]) == ["x", None]


def test_compare_narrows_to_the_keys_that_differ() -> None:
    table = Table("public", "t", (col("id", "int4"), col("name", "text")), ("id",), "d", 0, 0)
    source = {f'{{"id":{i}}}': {"id": i, "name": f"n{i}"} for i in range(1, 6)}
    held = {k: {"id": str(v["id"]), "name": v["name"]} for k, v in source.items()}
    assert _compare("cache", cache_form, table, source, held) == Drift("cache", "public.t", 5, 5)
    held['{"id":2}'] = {"id": "2", "name": "changed"}
    del held['{"id":3}']
    held['{"id":9}'] = {"id": "9", "name": "n9"}
    drift = _compare("cache", cache_form, table, source, held)
    assert (drift.missing, drift.extra, drift.different) == (
        ['{"id":3}'],
        ['{"id":9}'],
        ['{"id":2}'],
    )


ONE_KEY = Table("public", "t", (col("id", "int8"), col("name", "text")), ("id",), "d", 0, 0)


def test_key_filters_split_many_keys_into_bounded_filters() -> None:
    keys = [f'{{"id":{i}}}' for i in range(1, 10_001)]
    filters = key_filters(ONE_KEY, keys, limit=2048)
    assert len(filters) > 1
    assert all(len(f) <= 2048 for f in filters)
    assert all(f.startswith('("id") IN ((') and f.endswith("))") for f in filters)
    # together they name every key once, in order
    named = [int(v) for f in filters for v in f[len('("id") IN (') : -1].strip("()").split("), (")]
    assert named == list(range(1, 10_001))
    # each one is the single filter of its own keys
    first = filters[0].count("(") - 2
    assert filters[0] == _key_filter(ONE_KEY, keys[:first])


def test_key_filters_keep_a_few_keys_in_one_filter_and_an_oversized_key_alone() -> None:
    assert key_filters(ONE_KEY, ['{"id":1}', '{"id":2}']) == ['("id") IN ((1), (2))']
    long = "x" * 100
    keys = ['{"id":1,"code":"a"}', f'{{"id":2,"code":"{long}"}}', '{"id":3,"code":"b"}']
    head = '("id", "code") IN ('
    assert key_filters(TABLE, keys, limit=60) == [
        head + "(1, 'a'))",
        head + f"(2, '{long}'))",
        head + "(3, 'b'))",
    ]
    assert key_filters(TABLE, keys[::2], limit=60) == [head + "(1, 'a'), (3, 'b'))"]
    assert key_filters(ONE_KEY, []) == []


def test_ten_thousand_keys_fit_a_few_signals_of_bounded_size() -> None:
    keys = [f'{{"id":{i}}}' for i in range(100_000, 110_000)]
    filters = repair_filters(ONE_KEY, keys, source_rows=30_000)
    assert filters is not None and 1 < len(filters) <= 3
    assert all(filter_chars(f) <= MAX_FILTER_CHARS for f in filters)
    assert all(len(f) <= REPAIR_FILTER_CHARS for f in filters)


def test_repair_backfills_the_whole_table_when_half_of_it_drifted() -> None:
    keys = [f'{{"id":{i}}}' for i in range(100)]
    assert repair_filters(ONE_KEY, keys, source_rows=200) is None
    assert repair_filters(ONE_KEY, keys, source_rows=201) == [_key_filter(ONE_KEY, keys)]


def test_any_of_is_a_balanced_or() -> None:
    assert any_of([1, 2, 4, 8, 16]) == 31
    assert any_of([True]) is True
    assert any_of([{i} for i in range(1000)]) == set(range(1000))


def test_a_backfill_filter_is_bounded_by_what_the_connector_offsets_hold() -> None:
    _check_filter_size("id IN (" + ", ".join(str(i) for i in range(50_000)) + ")")
    with pytest.raises(BackfillError, match="shorter filter"):
        _check_filter_size("id IN (" + ", ".join(str(i) for i in range(100_000)) + ")")
    assert filter_chars('"a"') > len('"a"') * 2  # escaped twice


def note(kind: str, signal: str, **extra: str) -> dict[str, object]:
    return {
        "aggregate_type": "Incremental Snapshot",
        "id": signal,
        "type": kind,
        "additional_data": extra,
    }


def test_a_backfill_counts_only_what_follows_debezium_taking_its_signal() -> None:
    progress = BackfillProgress(signal_id="mine")
    # a backfill that ran before completes first: not this one's completion
    assert not _follow(progress, note("IN_PROGRESS", "earlier"))
    assert not _follow(progress, note("COMPLETED", "earlier"))
    assert not progress.finished
    assert not _follow(progress, {"aggregate_type": "Initial Snapshot", "id": "mine"})
    assert _follow(progress, note("STARTED", "mine", data_collections="public.t"))
    assert _follow(
        progress,
        note(
            "TABLE_SCAN_COMPLETED",
            "mine",
            scanned_collection="public.t",
            total_rows_scanned="42",
            status="SUCCEEDED",
        ),
    )
    # queued behind it, a later signal's id is on the notes from now on
    assert _follow(progress, note("COMPLETED", "later"))
    assert progress.finished and progress.rows_scanned == 42 and progress.failures == []


def test_a_table_scan_that_failed_is_a_failure_of_the_backfill() -> None:
    progress = BackfillProgress()
    _follow(progress, note("STARTED", "x"))
    _follow(
        progress,
        note("TABLE_SCAN_COMPLETED", "x", scanned_collection="public.t", status="SQL_EXCEPTION"),
    )
    _follow(
        progress, note("TABLE_SCAN_COMPLETED", "x", scanned_collection="public.u", status="EMPTY")
    )
    _follow(progress, note("COMPLETED", "x"))
    assert progress.finished and progress.failures == ["public.t: SQL_EXCEPTION"]


KEYED = Table(
    "public",
    "k",
    (
        col("d", "date"),
        col("ts", "timestamp"),
        col("tz", "timestamptz"),
        col("b", "bytea"),
        col("r", "float4"),
        col("f", "float8"),
        col("n", "numeric"),
        col("t", "time"),
        col("u", "uuid"),
    ),
    ("d", "ts", "tz", "b", "r", "f", "n", "t", "u"),
    "d",
    0,
    0,
)


def test_a_key_reads_the_same_from_the_source_the_log_and_delta() -> None:
    """The same row's key from psycopg (normalized), from Debezium's key JSON, and from a
    Delta row (a real as its binary value, a timestamptz without its zone, bytes as a
    bytearray) is one text, so no row reads as missing and extra at once."""
    from datetime import date
    from datetime import time as clock
    from uuid import UUID

    from cdc.check.verify import normalize
    from cdc.types.keys import store_key_text

    psycopg_row = {
        "d": date(2024, 2, 29),
        "ts": datetime(2024, 2, 29, 12, 34, 56, 123456),
        "tz": datetime(2024, 2, 29, 12, 34, 56, 123456, tzinfo=UTC),
        "b": memoryview(b"\x00\x01\xff"),
        "r": 1.1,
        "f": 0.1,
        "n": Decimal("12.50"),
        "t": clock(12, 34, 56, 789000),
        "u": UUID("b68a35a7-17ad-35b3-af2a-ae46edb4545a"),
    }
    source = key_text(KEYED, {k: normalize(v) for k, v in psycopg_row.items()})
    debezium = (
        '{"d":19782,"ts":1709210096123456,"tz":"2024-02-29T12:34:56.123456Z","b":"AAH/",'
        '"r":1.1,"f":0.1,"n":"12.50","t":45296789000,'
        '"u":"b68a35a7-17ad-35b3-af2a-ae46edb4545a"}'
    )
    delta = {
        **psycopg_row,
        "tz": datetime(2024, 2, 29, 12, 34, 56, 123456),  # UTC, no zone
        "b": bytearray(b"\x00\x01\xff"),
        "r": 1.100000023841858,  # the real's binary value as a double
        "u": "b68a35a7-17ad-35b3-af2a-ae46edb4545a",
    }
    assert store_key_text(KEYED, debezium) == source
    assert key_text(KEYED, delta) == source
    assert '"b":"\\\\x0001ff"' in source and '"r":1.1' in source
    assert '"tz":"2024-02-29T12:34:56.123456+00:00"' in source


def test_a_few_keys_of_a_table_keyed_by_its_values_are_looked_at_one_by_one() -> None:
    """Verify's looks at the keys that differ (and after a repair) read those keys alone
    (cdc/check/keyed.py), up to KEYED_MAX of them; a masked key column holds a hash no
    filter finds the row by: that table is read whole."""
    from dataclasses import replace

    from cdc.check.keyed import KEYED_MAX, keyed

    keys = [f'{{"id":{i},"code":"c"}}' for i in range(3)]
    assert keyed(TABLE, keys)
    assert keyed(TABLE, ["x"] * KEYED_MAX)
    assert not keyed(TABLE, ["x"] * (KEYED_MAX + 1))
    masked = replace(TABLE, masks=(("code", "hash", None),))
    assert not keyed(masked, keys)
    assert keyed(replace(TABLE, masks=(("v", "hash", None),)), keys)  # not a key column
