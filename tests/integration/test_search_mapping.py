"""A column added while `cdc apply` runs is mapped in the search index by its type, before
any document holds it: OpenSearch's dynamic mapping took the type of whichever value
came first (a text '2024-01-01' made a date field, every later text was then refused,
and after a restart `cdc apply` could not map the column at all). Read with plain HTTP."""

from __future__ import annotations

import uuid

import pytest
import requests

from cdc.core.catalog import Column, Table
from cdc.log.position import Event
from cdc.stores.registry import make_writer
from cdc.stores.search.store import index_name
from tests.conftest import RunningStack
from tests.stores import opensearch_http

pytestmark = pytest.mark.integration


def _column(name: str, type_: str) -> Column:
    return Column(name, type_, type_, "N" if type_ == "int4" else "S", False, None, False)


def test_a_column_added_while_apply_runs_is_mapped_by_its_type(stack: RunningStack) -> None:
    name = f"added_{uuid.uuid4().hex[:8]}"
    before = Table("public", name, (_column("id", "int4"),), ("id",), "d", 1, 1)
    after = Table(
        "public", name, (_column("id", "int4"), _column("note", "text")), ("id",), "d", 1, 1
    )
    store = make_writer(stack.settings, "search")
    store.prepare([before])  # as `cdc apply` starts, before the column is added
    events = [
        Event(before.qualified, f'{{"id": {i}}}', 0, i, "u", {"id": i, "note": note}, 1, 10 + i, 5)
        for i, note in ((1, "2024-01-01"), (2, "hello"))
    ]
    result = store.write({before.qualified: after}, events)  # a batch after ALTER TABLE
    assert not result.rejected, result.rejected
    index = index_name(stack.settings.pipeline.topic_prefix, before.qualified)
    url, http = stack.settings.opensearch.url, opensearch_http(stack.settings)
    mapping = requests.get(f"{url}/{index}/_mapping", timeout=30, **http).json()
    assert mapping[index]["mappings"]["properties"]["note"]["type"] == "text", mapping
    requests.post(f"{url}/{index}/_refresh", timeout=30, **http).raise_for_status()
    hits = requests.post(f"{url}/{index}/_search", json={"size": 10}, timeout=30, **http).json()
    notes = {h["_source"]["id"]: h["_source"].get("note") for h in hits["hits"]["hits"]}
    assert notes == {1: "2024-01-01", 2: "hello"}, notes
    requests.delete(f"{url}/{index}", timeout=30, **http)


def test_setup_keeps_the_replicas_of_the_pipelines_indexes(stack: RunningStack) -> None:
    """An index is made with opensearch.number_of_shards and .number_of_replicas; `cdc
    setup` (the search store's setup) sets the replicas of an existing index in place and
    says a shard count it cannot change. Read with plain HTTP."""
    from cdc.core.settings import Settings
    from cdc.stores.search.store import SearchStore, keep_index_settings

    name = f"shards_{uuid.uuid4().hex[:8]}"
    table = Table("public", name, (_column("id", "int4"),), ("id",), "d", 1, 1)
    prefix = stack.settings.pipeline.topic_prefix
    index = index_name(prefix, table.qualified)
    url, http = stack.settings.opensearch.url, opensearch_http(stack.settings)

    def shape() -> tuple[str, str]:
        got = requests.get(f"{url}/{index}/_settings", timeout=30, **http).json()
        settings = got[index]["settings"]["index"]
        return settings["number_of_shards"], settings["number_of_replicas"]

    # the stack's one node: 2 shards, no replica (the local node takes no more)
    section = stack.settings.opensearch.model_copy(update={"number_of_shards": 2})
    SearchStore(section, prefix).ensure_index(table)
    try:
        assert shape() == ("2", "0")
        assert keep_index_settings(section, prefix, [table.qualified]) == []
        # the node as your own cluster's: one replica, and 3 shards wanted
        own = Settings.model_validate(
            {
                "opensearch": {
                    **stack.settings.opensearch.model_dump(),
                    "managed": False,
                    "number_of_shards": 3,
                    "number_of_replicas": 1,
                }
            }
        ).opensearch
        said = keep_index_settings(own, prefix, [table.qualified, "public.none_such"])
        assert said == [
            f"search: index {index} replicas 0 -> 1 (opensearch.number_of_replicas)",
            f"search: index {index} has 2 shard(s), not opensearch.number_of_shards 3: an "
            "index keeps the shards it was made with; `cdc rebuild --store search` makes it "
            "again with them",
        ]
        assert shape() == ("2", "1")  # replicas changed in place; shards kept
    finally:
        requests.delete(f"{url}/{index}", timeout=30, **http)
