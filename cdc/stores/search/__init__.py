"""The search index: OpenSearch, one document per row (store.py: SearchStore)."""

from __future__ import annotations

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
    if column in METADATA_FIELDS:
        return "is one of OpenSearch's metadata fields, which no document may hold"
    return None


DECLARATION = StoreDeclaration(
    name="search",
    summary="OpenSearch, a document per row",
    make="cdc.stores.search.store:make",
    slo_s=5.0,
    section="opensearch",
    posture=_posture,
    reserved=_reserved,
)
