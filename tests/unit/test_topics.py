"""The pipeline's topics: every name and spec comes from cdc/topics.py."""

from __future__ import annotations

import re

import pytest

from cdc.catalog import TRUNCATIONS_TABLE
from cdc.errors import SourceError
from cdc.settings import PipelineSettings
from cdc.topics import (
    ChangeRecord,
    change_topic,
    change_topic_pattern,
    check_names_apart,
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
        "shop.dlq",
        "shop.message",
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
