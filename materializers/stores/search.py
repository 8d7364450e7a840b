"""OpenSearch: one index per table, documents keyed by primary key, written with external
versioning on the log position so that OpenSearch itself refuses a stale write.

Index `<prefix>.<schema>.<table>` (lower case), mapping derived from the PostgreSQL
column types; document `_id` = the key's JSON text; `_version` = the event's offset
(external versioning: a write whose version is not higher than the stored one is
rejected with a conflict, which counts as stale). A delete is versioned too, and
`index.gc_deletes` keeps its version for a day so a stale write cannot bring the
document back. An unchanged TOASTed value keeps the stored field (the current
document is read and merged before the write).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson
from opensearchpy import JSONSerializer, OpenSearch, helpers

from cdc.catalog import Column, Table
from cdc.decode import UNAVAILABLE, decode_value
from cdc.errors import StoreError
from materializers.stores.base import Event, Store, WriteResult
from materializers.stores.cache import cache_text

__all__ = ["SearchStore", "document_value", "field_mapping", "index_name", "plain_value"]

_NUMERIC = {
    # integers as long and floats as double: widening a column's type in PostgreSQL
    # never conflicts with the index's mapping
    "int2": "long",
    "int4": "long",
    "int8": "long",
    "oid": "long",
    "float4": "double",
    "float8": "double",
    "numeric": "double",
    "money": "double",
}


def index_name(prefix: str, table: str) -> str:
    return f"{prefix}.{table}".lower()


def field_mapping(column: Column) -> dict[str, Any]:
    """The OpenSearch field for a column (arrays map to their element's field)."""
    base = column.base
    if base in _NUMERIC:
        return {"type": _NUMERIC[base]}
    if base == "bool":
        return {"type": "boolean"}
    if base in ("date", "timestamp", "timestamptz"):
        return {"type": "date"}
    if base in ("json", "jsonb"):
        return {"type": "flat_object"}
    if base == "bytea":
        return {"type": "binary"}
    if base in ("text", "varchar", "bpchar", "name", "citext"):
        return {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
    return {"type": "keyword"}  # uuid, enums, time, interval, inet...


def document_value(column: Column, raw: Any) -> Any:
    value = decode_value(column, raw)
    if value is None or isinstance(value, bool | int | str | dict):
        return value
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    return plain_value(value)


def plain_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return cache_text(value)  # "NaN", "Infinity": JSON has no number for them
    if value is None or isinstance(value, bool | int | float | str | dict):
        return value
    return cache_text(value)


class FastJSON(JSONSerializer):
    """opensearch-py's serializer, with orjson doing the work (every bulk action and
    every bulk response goes through it)."""

    def dumps(self, data: Any) -> str:
        if isinstance(data, str):
            return data
        return orjson.dumps(data, default=self.default).decode()

    def loads(self, s: str) -> Any:
        return orjson.loads(s)


class SearchStore(Store):
    name = "search"

    def __init__(self, url: str, prefix: str) -> None:
        self.client = OpenSearch(hosts=[url], timeout=60, serializer=FastJSON())
        self.prefix = prefix
        self._indexes: dict[str, str] = {}

    def prepare(self, tables: Iterable[Table]) -> None:
        for table in tables:
            self.ensure_index(table)

    def ensure_index(self, table: Table) -> None:
        index = index_name(self.prefix, table.qualified)
        properties = {c.name: field_mapping(c) for c in table.columns}
        properties |= {
            "_cdc_offset": {"type": "long"},
            "_cdc_partition": {"type": "integer"},
            "_cdc_lsn": {"type": "long"},
            "_cdc_commit_ms": {"type": "date", "format": "epoch_millis"},
        }
        if not self.client.indices.exists(index=index):
            self.client.indices.create(
                index=index,
                body={
                    "settings": {"index": {"number_of_replicas": 0, "gc_deletes": "1d"}},
                    "mappings": {"properties": properties},
                },
            )
        else:  # a column added in PostgreSQL becomes a new field
            self.client.indices.put_mapping(index=index, body={"properties": properties})

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult(rejected=[])
        placeholders = [
            e for e in events if e.after and any(v == UNAVAILABLE for v in e.after.values())
        ]
        current = self._current(placeholders)
        actions = []
        columns_of: dict[str, dict[str, Column]] = {}
        for event in events:
            index = self._indexes.get(event.table)
            if index is None:
                index = self._indexes[event.table] = index_name(self.prefix, event.table)
            meta = {
                "_index": index,
                "_id": event.key,
                "version": event.offset,
                "version_type": "external",
            }
            if event.op == "d" or event.after is None:
                actions.append({"_op_type": "delete", **meta})
                continue
            columns = columns_of.get(event.table)
            if columns is None:
                columns = columns_of[event.table] = {c.name: c for c in tables[event.table].columns}
            doc: dict[str, Any] = {}
            for name, raw in event.after.items():
                if name not in columns:
                    continue
                if raw == UNAVAILABLE:
                    stored = current.get((index, event.key), {})
                    if name in stored:
                        doc[name] = stored[name]
                    continue
                doc[name] = document_value(columns[name], raw)
            doc |= {
                "_cdc_offset": event.offset,
                "_cdc_partition": event.partition,
                "_cdc_lsn": event.lsn,
                "_cdc_commit_ms": event.commit_ms,
            }
            actions.append({"_op_type": "index", "_source": doc, **meta})
        by_id = {(self._indexes[e.table], e.key): e for e in events}
        for ok, item in helpers.streaming_bulk(
            self.client,
            actions,
            raise_on_error=False,
            raise_on_exception=False,
            chunk_size=5000,
            max_chunk_bytes=20 * 1024 * 1024,
            max_retries=3,
        ):
            info = next(iter(item.values()))
            if ok:
                result.written += 1
            elif info.get("status") == 409:
                result.stale += 1  # OpenSearch holds a newer (or the same) version
            elif info.get("status") == 404 and next(iter(item)) == "delete":
                result.written += 1  # deleting what is not there: the version is recorded
            else:
                event = by_id[(info["_index"], info["_id"])]
                result.rejected.append((event, str(info.get("error"))[:500]))  # type: ignore[union-attr]
        return result

    def truncate(self, table: Table, before_lsn: int, commit_ms: int) -> None:
        """Delete every document written before the TRUNCATE, each at its own version
        (external_gte), so that its key's later events still win."""
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return
        self.client.indices.refresh(index=index)
        hits = helpers.scan(
            self.client,
            index=index,
            query={"query": {"range": {"_cdc_lsn": {"lt": before_lsn}}}, "version": True},
            _source=False,
        )
        actions = (
            {
                "_op_type": "delete",
                "_index": index,
                "_id": hit["_id"],
                "version": hit["_version"],
                "version_type": "external_gte",
            }
            for hit in hits
        )
        for ok, item in helpers.streaming_bulk(
            self.client, actions, raise_on_error=False, chunk_size=2000, max_retries=3
        ):
            status = next(iter(item.values())).get("status")
            if not ok and status not in (404, 409):  # gone, or rewritten since: both fine
                raise StoreError(f"OpenSearch refused a delete for a TRUNCATE of {index}: {item}")
        self.client.indices.refresh(index=index)

    def _current(self, events: list[Event]) -> dict[tuple[str, str], dict[str, Any]]:
        if not events:
            return {}
        docs = [{"_index": index_name(self.prefix, e.table), "_id": e.key} for e in events]
        found = self.client.mget(body={"docs": docs})["docs"]
        return {(d["_index"], d["_id"]): d.get("_source", {}) for d in found if d.get("found")}

    def close(self) -> None:
        self.client.close()
