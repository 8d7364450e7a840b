"""The pipeline's topics: every name and spec comes from cdc/core/topics.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc.core.catalog import TRUNCATIONS_TABLE
from cdc.core.errors import ConfigError, SourceError
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.topics import (
    ChangeRecord,
    change_topic,
    change_topic_pattern,
    check_names_apart,
    folder_problem,
    pipeline_topic_specs,
    thinned,
    topic_name,
)


def test_topics_are_named_as_debezium_names_them() -> None:
    assert topic_name("shop", "public.orders") == "shop.public.orders"
    assert topic_name("shop", "public.Order Items") == "shop.public.Order_Items"
    assert topic_name("shop", "sales.café-2024") == "shop.sales.caf_-2024"
    assert len(topic_name("p", "public." + "x" * 300)) == 249


def test_the_apply_job_reads_every_change_topic_and_no_other() -> None:
    pipe = PipelineSettings(topic_prefix="shop")
    pattern = re.compile(change_topic_pattern(pipe))
    assert pattern.match("shop.public.orders")
    assert pattern.match("shop.public.my.table")  # a table name holding a dot
    assert pattern.match("shop.cdc.truncations")
    assert pattern.match("shop.public.transaction")
    others = (
        "shop.transaction",
        "shop.notifications",
        "shop.signals",
        "shop.dlq",
        "shop.message",
        "shop.cdc.heartbeat",  # the heartbeat table's rows: the capture's clock
        "shopx.public.t",
    )
    for other in others:
        assert not pattern.match(other), other


def test_the_pattern_takes_exactly_the_change_topics_the_pipeline_creates() -> None:
    pipe = PipelineSettings(topic_prefix="shop")
    tables = ["public.orders", "public.transaction", "sales.dlq"]
    specs = pipeline_topic_specs(pipe, tables)
    changes = {change_topic(pipe, t) for t in [*tables, TRUNCATIONS_TABLE]}
    assert changes <= {s.name for s in specs}
    pattern = re.compile(change_topic_pattern(pipe))
    assert {s.name for s in specs if pattern.match(s.name)} == changes
    assert len({s.name for s in specs}) == len(specs)


def test_tables_that_would_share_a_topic_or_an_index_are_refused() -> None:
    pipe = PipelineSettings(topic_prefix="shop")
    check_names_apart(["public.orders", "public.items"], pipe)
    with pytest.raises(SourceError, match="would share the change topic"):
        check_names_apart(["public.a b", "public.a_b"], pipe)
    with pytest.raises(SourceError, match="would share the search index"):
        check_names_apart(["public.Orders", "public.orders"], pipe)


def test_a_log_is_thinned_when_records_are_missing_at_its_head_or_between_two() -> None:
    whole = [
        ChangeRecord(0, 0, b"k", b"{}"),
        ChangeRecord(0, 1, b"k", b"{}"),
        ChangeRecord(1, 0, b"j", b"{}"),
    ]
    assert not thinned(whole)
    assert thinned([ChangeRecord(0, 5, b"k", b"{}"), ChangeRecord(0, 6, b"k", b"{}")])
    assert thinned([ChangeRecord(0, 0, b"k", b"{}"), ChangeRecord(0, 2, b"k", b"{}")])
    assert thinned([*whole, ChangeRecord(2, 3, b"k", b"{}")])


@pytest.mark.parametrize(
    "table",
    ["public.../pr2/evil", "public.a/b", "public.a\\b", "public...", "public..", "_views.t"],
)
def test_a_table_whose_name_would_reach_another_warehouse_folder_is_refused(table: str) -> None:
    from cdc.stores.warehouse.tables import current_path, history_path

    pipeline = PipelineSettings(name="p", tables=["public.t"])
    with pytest.raises(SourceError, match=f"table {re.escape(table)} cannot be captured"):
        check_names_apart([table], pipeline)
    for path in (current_path, history_path):
        with pytest.raises(ConfigError, match="has no folder in the warehouse"):
            path("/w/p", table)


def test_names_with_dots_spaces_and_letters_keep_their_folder() -> None:
    from cdc.stores.warehouse.tables import current_path

    assert folder_problem("public.Order.Items é 1") is None
    assert current_path("/w/p", "public.Order.Items é 1") == "/w/p/public/Order.Items é 1/current"
    check_names_apart(["public.Order.Items é 1", "s p a c e.x..y"], PipelineSettings(name="p"))


@given(
    st.lists(
        st.tuples(
            st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=12),
            st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=4,
        unique=True,
    )
)
def test_fuzz_no_accepted_table_name_leaves_or_shares_a_warehouse_folder(
    names: list[tuple[str, str]],
) -> None:
    import posixpath

    from cdc.stores.warehouse.tables import current_path, view_path

    tables = [f"{schema}.{name}" for schema, name in names if "." not in schema]
    try:
        check_names_apart(tables, PipelineSettings(name="p"))
    except SourceError:
        return
    root = "/w/p"
    folders = [posixpath.normpath(current_path(root, t)) for t in tables]
    views = posixpath.normpath(view_path(root, "v"))
    for folder in folders:
        assert folder.startswith(root + "/") and not folder.startswith(
            posixpath.dirname(views) + "/"
        )
    assert len(set(folders)) == len(folders)
