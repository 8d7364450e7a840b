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


def test_two_captured_tables_swapped_are_both_cut_and_backfilled() -> None:
    before = {1: "public.a", 2: "public.b"}
    now = {1: "public.b", 2: "public.a"}  # renamed a -> tmp, b -> a, tmp -> b
    found = owed(before, now, ["public.a", "public.b"])
    assert found.reused == ["public.a", "public.b"]
    assert found.cuts == ["public.a", "public.b"]
    assert found.added == ["public.a", "public.b"]


def test_a_table_renamed_onto_a_dropped_tables_name_is_cut() -> None:
    before = {1: "public.a", 2: "public.b"}
    now = {1: "public.b"}  # DROP TABLE b; ALTER TABLE a RENAME TO b
    found = owed(before, now, ["public.b"])
    assert found.cuts == ["public.b"] and found.added == ["public.b"]


def test_a_table_whose_topic_was_written_before_is_cut_a_new_one_is_not() -> None:
    before = {1: "public.a"}
    now = {1: "public.a", 2: "public.b", 3: "public.c"}  # b removed once, added back
    found = owed(before, now, NAMES, logged={"public.a", "public.b"})
    assert found.added == ["public.b", "public.c"]
    assert found.reused == ["public.b"] and found.cuts == ["public.b"]
    # a table captured all along is not cut for its written topic
    assert owed(before, {1: "public.a"}, ["public.a"], logged={"public.a"}) == Owed()


def test_a_partitioned_table_a_partition_left_is_cut_and_backfilled() -> None:
    before = {1: "public.a", 2: "public.b"}
    found = owed(before, before, ["public.a", "public.b"], shrunk={"public.b"})
    assert found.cuts == ["public.b"] and found.added == ["public.b"]
