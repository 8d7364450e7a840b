"""Debezium's placeholder for an unchanged TOASTed value, in the form it takes for each
type (as Debezium 3.6 writes it), is recognised; nothing else is; and in a create (a key
change) it is an unknown value, never one to keep."""

from __future__ import annotations

import pytest

from cdc.catalog import Column, Table
from cdc.decode import (
    DEBEZIUM_PLACEHOLDER,
    PLACEHOLDER_B64,
    PLACEHOLDER_CODES,
    PLACEHOLDER_HSTORE,
    PLACEHOLDER_UUID,
    UNAVAILABLE,
    is_unavailable,
    mark_unavailable,
)


def column(name: str, base: str, array: bool = False) -> Column:
    return Column(name, base + ("[]" if array else ""), base, "S", array, None, False)


# what Debezium 3.6.3 sends for an unchanged TOASTed value of each type
FORMS = [
    (column("t", "text"), DEBEZIUM_PLACEHOLDER),
    (column("j", "jsonb"), DEBEZIUM_PLACEHOLDER),
    (column("u", "uuid"), DEBEZIUM_PLACEHOLDER),
    (column("b", "bytea"), PLACEHOLDER_B64),
    (column("h", "hstore"), PLACEHOLDER_HSTORE),
    (column("ts", "text", True), [DEBEZIUM_PLACEHOLDER]),
    (column("bs", "bytea", True), [PLACEHOLDER_B64]),
    (column("us", "uuid", True), [PLACEHOLDER_UUID]),
    (column("ns", "int4", True), PLACEHOLDER_CODES),
    (column("ds", "date", True), PLACEHOLDER_CODES),
]


@pytest.mark.parametrize(("col", "raw"), FORMS, ids=[c.name for c, _ in FORMS])
def test_each_types_placeholder_is_recognised(col: Column, raw: object) -> None:
    assert is_unavailable(col, raw)


def test_the_forms_are_debeziums() -> None:
    assert PLACEHOLDER_B64 == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
    assert PLACEHOLDER_UUID == "b68a35a7-17ad-35b3-af2a-ae46edb4545a"
    assert PLACEHOLDER_CODES[:4] == [95, 95, 100, 101]


@pytest.mark.parametrize(
    ("col", "raw"),
    [
        (column("t", "text"), "__debezium"),
        (column("b", "bytea"), "AAEC"),
        (column("ts", "text", True), [DEBEZIUM_PLACEHOLDER, "x"]),
        (column("t", "text"), UNAVAILABLE),  # what a decoded image holds instead
        (column("ns", "int4", True), [95, 95]),
        (column("t", "text"), None),
    ],
)
def test_real_values_are_not_placeholders(col: Column, raw: object) -> None:
    assert not is_unavailable(col, raw)


TABLE = Table(
    "public",
    "t",
    (column("id", "int4"), column("b", "bytea"), column("ts", "text", True)),
    ("id",),
    "d",
    1,
    1,
)


def test_an_update_keeps_the_stored_value_and_a_create_does_not() -> None:
    update = mark_unavailable(
        TABLE, "u", {"id": 1, "b": PLACEHOLDER_B64, "ts": [DEBEZIUM_PLACEHOLDER]}
    )
    assert update == {"id": 1, "b": UNAVAILABLE, "ts": UNAVAILABLE}
    # a create with a placeholder is a key change: the value is another row's, not known
    create = mark_unavailable(TABLE, "c", {"id": 2, "b": PLACEHOLDER_B64, "ts": ["x"]})
    assert create == {"id": 2, "b": None, "ts": ["x"]}
    assert mark_unavailable(TABLE, "d", None) is None


def test_arrays_debezium_sends_as_null_when_unchanged_are_named() -> None:
    from cdc.catalog import toast_blind_columns

    columns = (
        column("id", "int4"),
        column("tags", "text", True),
        column("nums", "int4", True),
        column("prices", "numeric", True),
        column("flags", "bool", True),
    )
    table = Table("public", "t", columns, ("id",), "d", 1, 1)
    assert [c.name for c in toast_blind_columns(table)] == ["prices", "flags"]
    full = Table("public", "t", columns, ("id",), "f", 1, 1)
    assert toast_blind_columns(full) == []


def test_a_read_carries_every_value_so_a_placeholder_there_is_a_real_value() -> None:
    """The snapshot and backfills read rows as PostgreSQL holds them: a row whose text is
    Debezium's placeholder is stored as that text (and `verify --repair` can fix a row
    an update left stale), never taken as an unchanged value."""
    image = {"id": 3, "b": PLACEHOLDER_B64, "ts": [DEBEZIUM_PLACEHOLDER]}
    assert mark_unavailable(TABLE, "r", dict(image)) == image


def test_what_a_decoded_image_holds_for_an_unchanged_value_is_no_postgresql_text() -> None:
    # PostgreSQL's text holds no NUL: no real value is the marker the stores keep values for
    assert "\x00" in UNAVAILABLE
    assert UNAVAILABLE != DEBEZIUM_PLACEHOLDER
