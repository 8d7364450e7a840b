"""The search index: OpenSearch, one document per row (store.py: SearchStore)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from cdc.core.store_declarations import StoreDeclaration

if TYPE_CHECKING:
    from cdc.core.settings import Settings

# OpenSearch's metadata fields: a document's _source cannot hold them
METADATA_FIELDS = frozenset(
    {
        "_id",
        "_index",
        "_source",
        "_routing",
        "_version",
        "_seq_no",
        "_primary_term",
        "_field_names",
        "_ignored",
        "_doc_count",
        "_type",
        "_nested_path",
        "_data_stream_timestamp",
    }
)


def _posture(settings: Settings) -> str | None:
    search = settings.opensearch
    if search.tls and search.password is not None:
        return None
    return "opensearch.tls, .username and .password"


def _reserved(column: str) -> str | None:
    """A field name is a path in OpenSearch (`a.b` is field b of object a)."""
    path = column.split(".")
    if path[0] in METADATA_FIELDS:
        return "is one of OpenSearch's metadata fields, which no document may hold"
    if "" in path:
        return "is no field OpenSearch can map (a dot at either end, or two dots in a row)"
    return None


def _clashes(columns: list[str]) -> str | None:
    """Two columns OpenSearch would take for a field and an object holding another (`a`
    and `a.b`): its mapping cannot hold both."""
    names = set(columns)
    for column in sorted(columns):
        path = column.split(".")
        for end in range(1, len(path)):
            if (head := ".".join(path[:end])) in names:
                shown = [c if c.isprintable() else json.dumps(c) for c in (head, column)]
                return (
                    f"its columns {shown[0]} and {shown[1]} are a field and a field of it "
                    "in OpenSearch (a dot in a name is a path)"
                )
    return None


def _setup(settings: Settings, tables: list[str]) -> list[str]:
    from cdc.stores.search.store import keep_index_settings

    return keep_index_settings(settings.opensearch, settings.pipeline.topic_prefix, tables)


DECLARATION = StoreDeclaration(
    name="search",
    summary="OpenSearch, a document per row",
    make="cdc.stores.search.store:make",
    slo_s=5.0,
    section="opensearch",
    posture=_posture,
    reserved=_reserved,
    clashes=_clashes,
    abilities=frozenset({"text_search"}),
    setup=_setup,
)
