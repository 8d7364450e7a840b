"""The connector's placeholder for an unchanged TOASTed value, in the form it takes for
each type (as Debezium 3.6 makes them from `unavailable.value.placeholder`), is
recognised; nothing else is, Debezium's default text included when the pipeline has a
placeholder of its own; in a create (a key change) it is an unknown value, never one to
keep; in a read it is a real value."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc.core.catalog import Column, Table
from cdc.types.decode import (
    DEBEZIUM,
    DEBEZIUM_PLACEHOLDER,
    UNAVAILABLE,
    Placeholder,
    is_unavailable,
    mark_unavailable,
    placeholder_forms,
)


def column(name: str, base: str, array: bool = False) -> Column:
    return Column(name, base + ("[]" if array else ""), base, "S", array, None, False)


def forms(p: Placeholder) -> list[tuple[Column, object]]:
    """What Debezium 3.6.3 sends for an unchanged TOASTed value of each type."""
    return [
        (column("t", "text"), p.text),
        (column("j", "jsonb"), p.text),
        (column("u", "uuid"), p.text),
        (column("b", "bytea"), p.b64),
        (column("h", "hstore"), p.hstore),
        (column("ts", "text", True), [p.text]),
        (column("bs", "bytea", True), [p.b64]),
        (column("us", "uuid", True), [p.uuid]),
        (column("ns", "int4", True), p.codes),
        (column("ds", "date", True), p.codes),
    ]


OWN = placeholder_forms("__cdc_unchanged_0123456789abcdef0123456789abcdef")
FORMS = forms(DEBEZIUM)


@pytest.mark.parametrize(("col", "raw"), FORMS, ids=[c.name for c, _ in FORMS])
def test_each_types_placeholder_is_recognised(col: Column, raw: object) -> None:
    assert is_unavailable(col, raw, DEBEZIUM)


def test_the_forms_are_debeziums() -> None:
    assert DEBEZIUM.text == DEBEZIUM_PLACEHOLDER == "__debezium_unavailable_value"
    assert DEBEZIUM.b64 == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
    assert DEBEZIUM.uuid == "b68a35a7-17ad-35b3-af2a-ae46edb4545a"
    assert DEBEZIUM.codes[:4] == [95, 95, 100, 101]
    assert "__cdc_unchanged_" not in repr(OWN)  # a pipeline's own is a secret


def test_a_pipelines_own_placeholder_is_recognised_and_debeziums_default_is_a_value() -> None:
    for (col, own), (_, default) in zip(forms(OWN), FORMS, strict=True):
        assert is_unavailable(col, own, OWN), col.name
        assert not is_unavailable(col, default, OWN), col.name


@pytest.mark.parametrize(
    ("col", "raw"),
    [
        (column("t", "text"), "__debezium"),
        (column("b", "bytea"), "AAEC"),
        (column("ts", "text", True), [DEBEZIUM_PLACEHOLDER, "x"]),
        (column("ns", "int4", True), [95, 95]),
        (column("t", "text"), None),
        (column("t", "text"), UNAVAILABLE),  # what a decoded image holds instead
    ],
)
def test_real_values_are_not_placeholders(col: Column, raw: object) -> None:
    assert not is_unavailable(col, raw, DEBEZIUM)


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
        TABLE, "u", {"id": 1, "b": DEBEZIUM.b64, "ts": [DEBEZIUM_PLACEHOLDER]}
    )
    assert update == {"id": 1, "b": UNAVAILABLE, "ts": UNAVAILABLE}
    # a create with a placeholder is a key change: the value is another row's, not known
    create = mark_unavailable(TABLE, "c", {"id": 2, "b": DEBEZIUM.b64, "ts": ["x"]})
    assert create == {"id": 2, "b": None, "ts": ["x"]}
    assert mark_unavailable(TABLE, "d", None) is None


def test_an_update_of_a_pipeline_with_its_own_placeholder_marks_only_that_one() -> None:
    own = replace(TABLE, placeholder=OWN.text)
    update = mark_unavailable(own, "u", {"id": 1, "b": OWN.b64, "ts": [DEBEZIUM_PLACEHOLDER]})
    assert update == {"id": 1, "b": UNAVAILABLE, "ts": [DEBEZIUM_PLACEHOLDER]}


def test_a_read_carries_every_value_so_a_placeholder_there_is_a_real_value() -> None:
    """The snapshot and backfills read rows as PostgreSQL holds them: a row whose text is
    a placeholder is stored as that text, never taken as an unchanged value."""
    image = {"id": 3, "b": DEBEZIUM.b64, "ts": [DEBEZIUM_PLACEHOLDER]}
    assert mark_unavailable(TABLE, "r", dict(image)) == image


def test_what_a_decoded_image_holds_for_an_unchanged_value_is_no_postgresql_text() -> None:
    # PostgreSQL's text holds no NUL: no real value is the marker the stores keep values for
    assert "\x00" in UNAVAILABLE
    assert UNAVAILABLE != DEBEZIUM_PLACEHOLDER


def test_arrays_debezium_sends_as_null_when_unchanged_are_named() -> None:
    from cdc.core.catalog import toast_blind_columns

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
