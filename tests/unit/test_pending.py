"""What a setup owes a streaming pipeline, from what it captured and what it captures now."""

from __future__ import annotations

from cdc.capture.pending import Owed, owed

NAMES = ["public.a", "public.b", "public.c"]


def test_a_first_setup_owes_nothing_its_snapshot_reads_every_table() -> None:
    assert owed({}, {1: "public.a"}, NAMES) == Owed()


def test_new_renamed_and_recreated_tables_are_backfilled_the_recreated_cut_first() -> None:
    before = {1: "public.a", 2: "public.old", 3: "public.c"}
    now = {1: "public.a", 2: "public.b", 9: "public.c"}  # b: 2 renamed; c: created again
    found = owed(before, now, NAMES)
    assert found.renamed == [("public.old", "public.b")]
    assert found.recreated == ["public.c"]
    assert found.added == ["public.b", "public.c"]
    assert found.unpublished == []


def test_a_table_put_back_in_the_publication_is_cut_and_backfilled() -> None:
    before = {1: "public.a", 2: "public.b"}
    now = {1: "public.a", 2: "public.b"}
    found = owed(before, now, ["public.a", "public.b"], unpublished={"public.b"})
    assert found.added == ["public.b"] and found.unpublished == ["public.b"]
    assert found.recreated == []
    # one captured all along owes nothing
    assert owed(before, now, ["public.a", "public.b"]) == Owed()
