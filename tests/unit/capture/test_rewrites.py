"""Which DDL changes stored values without a change event (cdc/capture/rewrites.py)."""

from __future__ import annotations

from pathlib import Path

from cdc.capture.rewrites import act_on_rewrites, find_rewrites, rewrites, schema_of
from cdc.core.catalog import Column, Table
from cdc.core.settings import Settings


def table(*columns: tuple[str, str, bool]) -> Table:
    cols = tuple(
        Column(name, kind, kind, "N", False, None, False, has_default)
        for name, kind, has_default in columns
    )
    return Table("public", "t", cols, ("id",), "d", 1, 1)


BEFORE = schema_of(table(("id", "integer", False), ("n", "numeric(8,2)", False)))


def test_a_column_added_with_a_default_rewrites() -> None:
    now = table(("id", "integer", False), ("n", "numeric(8,2)", False), ("f", "integer", True))
    assert rewrites(BEFORE, now) == ["column f was added with a default"]


def test_a_column_added_without_a_default_does_not() -> None:
    now = table(("id", "integer", False), ("n", "numeric(8,2)", False), ("f", "integer", False))
    assert rewrites(BEFORE, now) == []


def test_a_default_set_on_an_existing_column_does_not() -> None:
    now = table(("id", "integer", True), ("n", "numeric(8,2)", False))
    assert rewrites(BEFORE, now) == []


def test_type_changes_that_rewrite_text() -> None:
    for new in ("numeric(12,4)", "text", "double precision", "numeric(8,1)"):
        now = table(("id", "integer", False), ("n", new, False))
        assert rewrites(BEFORE, now) == [f"column n changed type from numeric(8,2) to {new}"]


def test_type_changes_that_keep_every_value() -> None:
    for kind, new in (
        ("numeric(8,2)", "numeric(12,2)"),
        ("numeric(8,2)", "numeric"),
        ("integer", "bigint"),
        ("character varying(10)", "text"),
        ("character varying(10)", "character varying(20)"),
    ):
        before = schema_of(table(("id", "integer", False), ("n", kind, False)))
        now = table(("id", "integer", False), ("n", new, False))
        assert rewrites(before, now) == [], (kind, new)


def test_a_dropped_or_renamed_column_rewrites() -> None:
    """Every stored row still holds the dropped column's value, and no event removes it."""
    assert rewrites(BEFORE, table(("id", "integer", False))) == ["column n was dropped"]
    renamed = table(("id", "integer", False), ("m", "numeric(8,2)", False))
    assert rewrites(BEFORE, renamed) == ["column n was dropped"]


def test_an_enum_value_renamed_rewrites_and_one_added_does_not() -> None:
    def mood(*labels: str) -> Table:
        column = Column("m", "mood", "mood", "E", False, None, False, labels=labels)
        return Table("public", "t", (column,), ("m",), "d", 1, 1)

    before = schema_of(mood("sad", "ok"))
    assert rewrites(before, mood("sad", "ok", "happy")) == []
    assert rewrites(before, mood("unhappy", "ok")) == [
        "column m's type mood no longer has the value(s) sad (renamed)"
    ]
    # a schema recorded before labels were: nothing to compare
    assert rewrites({"m": ["mood", False]}, mood("unhappy", "ok")) == []


def test_a_batch_finds_a_rewrite_as_an_intent_and_the_job_acts_on_it(tmp_path: Path) -> None:
    """A batch's source view only finds a rewrite (nothing recorded, nothing started);
    the job acts on it, after which it is found no more (cdc/capture/source_view.py)."""
    settings = Settings(  # type: ignore[call-arg]
        data_dir=tmp_path, apply={"backfill_rewritten_tables": False}
    )
    before = table(("id", "integer", False), ("n", "numeric(8,2)", False))
    after = table(("id", "integer", False), ("n", "numeric(8,2)", False), ("f", "integer", True))
    assert find_rewrites(settings, [before]) == []  # seen first: recorded as it is
    found = find_rewrites(settings, [after])
    assert [(r.table.qualified, r.why) for r in found] == [
        ("public.t", "column f was added with a default")
    ]
    assert find_rewrites(settings, [after]) == found  # found again: not acted on yet
    said: list[str] = []
    assert act_on_rewrites(settings, found, said.append) == ["public.t"]
    assert said == [
        "public.t: column f was added with a default, which emits no change events: "
        "run `cdc backfill public.t`"
    ]
    assert find_rewrites(settings, [after]) == []
    assert act_on_rewrites(settings, found, said.append) == []  # acted on once only
