"""The columns Debezium does not stream are not captured (cdc.core.streamed_types,
cdc.core.catalog._unstreamed): their types, the generated columns computed from them,
and a key of such a type refused in one line."""

from __future__ import annotations

import pytest

from cdc.core.catalog import Column, Table, _unstreamed, unstreamed_note
from cdc.core.errors import SourceError
from cdc.core.streamed_types import streamed as streams


def streamed(column: Column) -> bool:
    return streams(column.base, column.category, column.is_array)


def _column(
    name: str, base: str, *, array: bool = False, category: str = "U", **more: object
) -> Column:
    return Column(
        name=name,
        type=base + ("[]" if array else ""),
        base=base,
        category=category,
        is_array=array,
        precision=None,
        not_null=False,
        **more,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    "base", ["int4", "numeric", "text", "bpchar", "char", "macaddr8", "oid", "tsvector", "hstore"]
)
def test_the_types_debezium_streams_are_captured(base: str) -> None:
    assert streamed(_column("c", base))
    assert streamed(_column("c", base, array=True))


@pytest.mark.parametrize(
    "base",
    [
        *("point", "box", "polygon", "int4multirange", "name", "pg_lsn", "jsonpath", "tsquery"),
        *("int2vector", "oidvector", "regclass", "xid", "tid", "txid_snapshot", "refcursor"),
    ],
)
def test_the_types_it_drops_or_empties_are_not(base: str) -> None:
    assert not streamed(_column("c", base))
    assert not streamed(_column("c", base, array=True))


@pytest.mark.parametrize("base", ["money", "xml", "interval", "varbit", "bit"])
def test_arrays_of_some_streamed_types_are_not(base: str) -> None:
    assert streamed(_column("c", base))
    assert not streamed(_column("c", base, array=True))


def test_an_enum_and_a_composite() -> None:
    assert streamed(_column("c", "mood", category="E"))
    assert streamed(_column("c", "mood", category="E", array=True))
    assert not streamed(_column("c", "pair", category="C"))


def test_left_out_with_the_generated_columns_computed_from_them() -> None:
    columns = (
        _column("id", "int4"),
        _column("b", "box"),
        _column("label", "text"),
        _column("b_text", "text", generated="b::text", inputs=("b",)),
        _column("upper", "text", generated="upper(label)", inputs=("label",)),
        _column("tags", "xml", array=True),
    )
    left = _unstreamed("public.t", columns, ("id",))
    assert left == (("b", "box"), ("b_text", "generated from b"), ("tags", "xml[]"))
    table = Table("public", "t", columns, ("id",), "d", 0, 0, unstreamed=left)
    note = unstreamed_note(table)
    assert note is not None and note.startswith("public.t: not captured")
    assert "b (box), b_text (generated from b), tags (xml[])" in note
    assert "\n" not in note
    assert unstreamed_note(Table("public", "u", columns[:1], ("id",), "d", 0, 0)) is None


def test_a_key_of_such_a_type_is_refused_in_one_line() -> None:
    columns = (_column("at", "pg_lsn"), _column("v", "text"))
    with pytest.raises(SourceError, match=r"keyed by at \(pg_lsn\), a type Debezium does not"):
        _unstreamed("public.t", columns, ("at",))
