"""How verify reads a hash back: its HGETALL reply as the row's fields."""

from __future__ import annotations

import pytest

from cdc.stores.cache.store import live_fields

_ROW = {
    b"_offset": b"7",
    b"_commit_lsn": b"100",
    b"id": b"1",
    b"__secret": b"x",  # the column `_secret`, escaped as the writer escapes it
    b"name": "é".encode(),
}


@pytest.mark.parametrize("reply", [_ROW, [v for pair in _ROW.items() for v in pair]])
def test_a_hash_reads_as_its_columns_whichever_protocol(reply: object) -> None:
    assert live_fields(reply) == {"id": "1", "_secret": "x", "name": "é"}


@pytest.mark.parametrize("reply", [{}, [], None, {**_ROW, b"_deleted": b"1"}])
def test_a_missing_hash_or_a_deleted_marker_is_no_row(reply: object) -> None:
    assert live_fields(reply) is None
