"""OpenSearch: one index per table, documents keyed by primary key, written with external
versioning on the log position so that OpenSearch itself refuses a stale write.

Index `<prefix>.<schema>.<table>` (lower case), mapping derived from the PostgreSQL
column types; document `_id` = the key's JSON text; `_version` = `search_version` of the
change's position (external versioning: a write whose version is lower than the stored
one is rejected with a conflict, which counts as stale). A delete is versioned too, and
`index.gc_deletes` keeps its version for a day so a stale write cannot bring the
document back. An unchanged TOASTed value keeps the stored field (the current
document is read and merged before the write).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from opensearchpy import ConnectionError, JSONSerializer, TransportError, helpers

from cdc.core.catalog import Column, Table, reserved_problem
from cdc.core.clients import opensearch_client
from cdc.core.errors import ConfigError, StoreError, StoreUnavailableError, ValueDecodeError
from cdc.core.settings import Settings
from cdc.core.settings.connections import OpenSearchSettings
from cdc.core.topics import topic_name
from cdc.log.position import Event
from cdc.stores.base import (
    Entry,
    RowForm,
    Rows,
    RowStore,
    StoreReader,
    WriteResult,
    row_digest,
    unavailable_on,
)
from cdc.types.decode import UNAVAILABLE
from cdc.types.keys import store_key_text
from cdc.types.store_forms import (
    JSON_TYPES,
    document_form,
    document_value,
    field_mapping,
    row_form,
)

__all__ = [
    "SearchStore",
    "index_name",
    "index_settings_lines",
    "keep_index_settings",
    "search_version",
]

log = logging.getLogger(__name__)


def search_version(position: tuple[int, int]) -> int:
    """The external version of a change at `position` (commit_lsn, lsn): max of the two.

    OpenSearch keeps one number per document. Changes of one key never interleave in
    the WAL (a row's change holds its lock until its transaction commits), so the next
    transaction's change of the key has a commit_lsn (the commit before it) at or past
    the previous change's own commit, which is past both numbers of that change: the
    version grows strictly from transaction to transaction, and within one transaction
    it grows with the change's LSN, except between changes made before the previous
    commit (a long transaction), which tie. Ties are taken (`external_gte`): the batch
    holds each key's newest change, so only a duplicate Debezium delivers again can
    bring back, for a moment, an earlier value of that same transaction.
    """
    return max(position)


def _retryable(status: Any) -> bool:
    """A bulk item's or request's status that says the store is down or overloaded: 429,
    5xx, or no HTTP status at all (refused, reset, "TIMEOUT": the request got no answer)."""
    if not isinstance(status, int):
        return True
    return status == 429 or status >= 500


def _written_before(stored: dict[str, Any], tombstone: Event) -> bool:
    """Whether the stored document was written by an earlier record of the tombstone's
    partition (so the tombstone, which follows its key's delete, is newer)."""
    source = stored.get("_source", {})
    return (
        source.get("_cdc_partition") == tombstone.partition
        and source.get("_cdc_offset", tombstone.offset) < tombstone.offset
    )


def index_name(prefix: str, table: str) -> str:
    """The table's index: its change topic's name (no character OpenSearch refuses), in
    lower case."""
    return topic_name(prefix, table).lower()


_BULK_ACTIONS = 5000  # per bulk request
_BULK_BYTES = 20 * 1024 * 1024


class FastJSON(JSONSerializer):
    """opensearch-py's serializer, with orjson doing the work (every bulk action and
    every bulk response goes through it)."""

    def dumps(self, data: Any) -> str:
        if isinstance(data, str):
            return data
        try:
            return orjson.dumps(data, default=self.default).decode()
        except TypeError:  # an integer beyond 64 bits (a json column's): the stdlib's
            return super().dumps(data)

    def loads(self, s: str) -> Any:
        return orjson.loads(s)


# (url, index) -> the columns its mapping was last given, in this Python process (a
# Spark worker runs many batches' tasks)
_MAPPED: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}


def _columns_of(table: Table) -> tuple[tuple[str, str], ...]:
    return tuple((c.name, c.type) for c in table.columns)


class SearchStore(RowStore, StoreReader):
    name = "search"
    reads_by_name = True

    def __init__(self, section: OpenSearchSettings, prefix: str, retry_s: float = 30.0) -> None:
        self.url = ",".join(section.urls)
        self.shards, self.replicas = section.number_of_shards, section.number_of_replicas
        self.client = opensearch_client(section, 30, FastJSON())
        self.prefix = prefix
        self.retry_s = retry_s
        self._indexes: dict[str, str] = {}
        self._refresh: dict[str, str | None] = {}  # index -> its refresh interval, in bulk

    def prepare(self, tables: Iterable[Table]) -> None:
        self.ping()
        tables = list(tables)
        for table in tables:
            self.ensure_index(table)
        # a catch-up batch the job did not live to end left its indexes' refresh off
        self.bulk(tables, on=False, only_if_left=True)

    def bulk(self, tables: Iterable[Table], on: bool, only_if_left: bool = False) -> None:
        """During a catch-up batch the tables' indexes are not refreshed (OpenSearch's
        advice for bulk indexing: no new segment each second while a backlog is
        written); after it, each index's refresh interval is given back (its own, or
        OpenSearch's default) and it is refreshed at once, so searches see the batch
        when it is committed. The pipeline sets refresh off (-1) only for the length of
        one batch: `only_if_left` undoes it where a job stopped during such a batch."""
        names = [index_name(self.prefix, t.qualified) for t in tables]
        try:
            for at in range(0, len(names), 50):  # a URL names at most 50 of them
                self._bulk(names[at : at + 50], on, only_if_left)
        except (ConnectionError, TransportError) as exc:
            raise StoreUnavailableError(
                f"OpenSearch at {self.url} does not answer ({type(exc).__name__})"
            ) from None

    def _bulk(self, names: list[str], on: bool, only_if_left: bool) -> None:
        # every index that exists (with the defaults), and its own interval if it has one
        found = {
            index: body.get("settings", {}).get("index", {}).get("refresh_interval")
            for index, body in self.client.indices.get_settings(
                index=",".join(names),
                name="index.refresh_interval",
                include_defaults=True,
                ignore_unavailable=True,
            ).items()
        }
        if on:  # what each index had, to give back (None: OpenSearch's default)
            self._refresh |= {i: v for i, v in found.items() if v != "-1"}
            found = {i: "-1" for i in found}
        else:
            found = {
                i: self._refresh.pop(i, None)
                for i, v in found.items()
                if v == "-1" and (i in self._refresh or only_if_left)
            }
        for value in set(found.values()):
            indexes = ",".join(i for i, v in found.items() if v == value)
            self.client.indices.put_settings(
                index=indexes, body={"index": {"refresh_interval": value}}
            )
        if found and not on:
            self.client.indices.refresh(index=",".join(found))

    def ping(self) -> None:
        try:
            health = self.client.cluster.health(request_timeout=5)
        except (ConnectionError, TransportError) as exc:
            raise StoreUnavailableError(self.unavailable(exc)) from None
        if health.get("status") == "red":
            raise StoreUnavailableError(f"OpenSearch at {self.url} is red")

    def unavailable(self, exc: BaseException) -> str:
        status = getattr(exc, "status_code", "N/A")  # a ConnectionError's is "N/A"
        if status == "N/A":
            return f"OpenSearch at {self.url} does not answer ({type(exc).__name__})"
        if status in (401, 403):  # waiting does not mend it
            return (
                f"OpenSearch at {self.url} refused the login ({status}): fix "
                "opensearch.username and opensearch.password (or the user's permissions)"
            )
        return f"OpenSearch at {self.url} answered {status} ({getattr(exc, 'error', exc)})"

    def ensure_index(self, table: Table) -> None:
        """The table's index, each column mapped by its type (field_mapping), a column
        added since mapped before any document holds it: never by OpenSearch's dynamic
        mapping, which would take the type of whichever value came first (a text
        '2024-01-01' made a date field, and every later text was refused)."""
        if problem := reserved_problem([c.name for c in table.columns], ("search",)):
            raise ConfigError(f"table {table.qualified} cannot be kept in the index: {problem}")
        index = index_name(self.prefix, table.qualified)
        properties = {c.name: field_mapping(c) for c in table.columns}
        properties |= {
            "_cdc_commit_lsn": {"type": "long"},
            "_cdc_offset": {"type": "long"},
            "_cdc_partition": {"type": "integer"},
            "_cdc_lsn": {"type": "long"},
            "_cdc_commit_ms": {"type": "date", "format": "epoch_millis"},
        }
        if not self.client.indices.exists(index=index):
            self.client.indices.create(
                index=index,
                body={
                    "settings": {
                        "index": {
                            "number_of_shards": self.shards,
                            "number_of_replicas": self.replicas,
                            "gc_deletes": "1d",
                        }
                    },
                    "mappings": {"properties": properties},
                },
            )
        else:  # a column added in PostgreSQL becomes a new field
            self.client.indices.put_mapping(index=index, body={"properties": properties})
        _MAPPED[(self.url, index)] = _columns_of(table)

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        deadline = time.monotonic() + self.retry_s
        pause = 0.2
        while True:
            try:
                result, failed = self._write_once(tables, events)
                if not failed:
                    return result
                why = f"{failed} write(s) answered {result.retry_reason}"
            except (ConnectionError, TransportError) as exc:
                if isinstance(exc, TransportError) and not _retryable(exc.status_code):
                    raise StoreError(f"OpenSearch at {self.url} refused a request: {exc}") from None
                why = type(exc).__name__
            # every write is guarded by its version: sending the batch again is harmless
            if time.monotonic() > deadline:
                raise StoreUnavailableError(f"OpenSearch at {self.url} does not answer ({why})")
            log.warning("OpenSearch at %s: %s; retrying", self.url, why)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _write_once(self, tables: dict[str, Table], events: list[Event]) -> tuple[Any, int]:
        """One attempt at the batch: its result, and how many writes failed in a way that
        says the store is down or overloaded (5xx, 429, no answer)."""
        for name in {e.table for e in events}:
            table = tables.get(name)
            key = (self.url, index_name(self.prefix, name))
            if table is not None and _MAPPED.get(key) != _columns_of(table):
                self.ensure_index(table)  # a column added while the job runs
        result = WriteResult()
        result.retry_reason = ""  # type: ignore[attr-defined]
        placeholders = [
            e for e in events if e.after and any(v == UNAVAILABLE for v in e.after.values())
        ]
        tombstones = [e for e in events if e.position is None]
        current = self._current(placeholders + tombstones)
        actions = []
        columns_of: dict[str, dict[str, Column]] = {}
        for event in events:
            index = self._indexes.get(event.table)
            if index is None:
                index = self._indexes[event.table] = index_name(self.prefix, event.table)
            if event.position is None:  # a tombstone: deletes what an earlier record wrote
                stored = current.get((index, event.key))
                if stored is None or not _written_before(stored, event):
                    result.stale += 1
                    continue
                actions.append(
                    {
                        "_op_type": "delete",
                        "_index": index,
                        "_id": event.key,
                        "version": stored["_version"],
                        "version_type": "external_gte",
                    }
                )
                continue
            meta = {
                "_index": index,
                "_id": event.key,
                "version": search_version(event.position),
                "version_type": "external_gte",
            }
            if event.op == "d" or event.after is None:
                actions.append({"_op_type": "delete", **meta})
                continue
            columns = columns_of.get(event.table)
            if columns is None:
                columns = columns_of[event.table] = {c.name: c for c in tables[event.table].columns}
            doc: dict[str, Any] = {}
            try:
                for name, raw in event.after.items():
                    if name not in columns:
                        continue
                    if raw == UNAVAILABLE:
                        kept = current.get((index, event.key), {}).get("_source", {})
                        if name in kept:
                            doc[name] = kept[name]
                        continue
                    doc[name] = document_value(columns[name], raw)
            except ValueDecodeError as exc:  # a value this store cannot hold: this record alone
                result.rejected.append((event, str(exc)[:500]))
                continue
            doc |= {
                "_cdc_commit_lsn": event.commit_lsn,
                "_cdc_lsn": event.lsn,
                "_cdc_offset": event.offset,
                "_cdc_partition": event.partition,
                "_cdc_commit_ms": event.commit_ms,
            }
            actions.append({"_op_type": "index", "_source": doc, **meta})
        by_id = {(self._indexes[e.table], e.key): e for e in events}
        failed = 0
        for ok, item in self._send(actions):
            info = next(iter(item.values()))
            status = info.get("status")
            if ok:
                result.written += 1
            elif status == 409:
                result.stale += 1  # OpenSearch holds a newer version
            elif status == 404 and next(iter(item)) == "delete":
                result.written += 1  # deleting what is not there: the version is recorded
            elif _retryable(status):
                failed += 1
                result.retry_reason = str(status)  # type: ignore[attr-defined]
            else:
                event = by_id[(info["_index"], info["_id"])]
                result.rejected.append((event, str(info.get("error"))[:500]))
        return result, failed

    def _send(self, actions: list[dict[str, Any]]) -> Iterator[tuple[bool, dict[str, Any]]]:
        """Each action's outcome, as opensearch-py's streaming_bulk gives it (ok, {op:
        {_index, _id, status, ...}}), sent in bulk requests of at most _BULK_ACTIONS
        actions or _BULK_BYTES bytes, each line made once by orjson (streaming_bulk
        expands and serializes every action through the client: an eighth of the writer's
        time, bench/search_floor.py). A request that gets no answer, or an error status
        for the whole of it, is that status for each of its actions (the caller retries
        the batch)."""
        serializer = self.client.transport.serializer
        lines: list[bytes] = []
        sent: list[dict[str, Any]] = []
        size = 0
        for action in actions:
            op = action["_op_type"]
            meta = {k: v for k, v in action.items() if k not in ("_op_type", "_source")}
            lines.append(orjson.dumps({op: meta}))
            size += len(lines[-1]) + 1
            if "_source" in action:
                try:
                    lines.append(orjson.dumps(action["_source"], default=serializer.default))
                except TypeError:  # an integer beyond 64 bits (a json column's)
                    lines.append(serializer.dumps(action["_source"]).encode())
                size += len(lines[-1]) + 1
            sent.append(action)
            if len(sent) >= _BULK_ACTIONS or size >= _BULK_BYTES:
                yield from self._post(lines, sent)
                lines, sent, size = [], [], 0
        if sent:
            yield from self._post(lines, sent)

    def _post(
        self, lines: list[bytes], sent: list[dict[str, Any]]
    ) -> Iterator[tuple[bool, dict[str, Any]]]:
        try:
            answer = self.client.bulk(body=b"\n".join(lines) + b"\n")
        except TransportError as exc:  # (ConnectionError is one: status "N/A")
            for action in sent:
                info = {"_index": action["_index"], "_id": action["_id"]}
                failed = {"status": exc.status_code, "error": str(exc)[:500]}
                yield False, {action["_op_type"]: info | failed}
            return
        for item in answer["items"]:
            status = next(iter(item.values())).get("status", 500)
            yield isinstance(status, int) and 200 <= status < 300, item

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        """Delete every document written before the TRUNCATE (position `before`), each at
        its own version (external_gte), so that its key's later events still win."""
        try:
            self._truncate(table, before)
        except (ConnectionError, TransportError) as exc:
            raise StoreUnavailableError(
                f"OpenSearch at {self.url} does not answer ({type(exc).__name__})"
            ) from None

    def _truncate(self, table: Table, before: tuple[int, int]) -> None:
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return
        self.client.indices.refresh(index=index)
        commit, lsn = before
        older = {
            "bool": {
                "should": [
                    {"range": {"_cdc_commit_lsn": {"lt": commit}}},
                    {
                        "bool": {
                            "filter": [
                                {"term": {"_cdc_commit_lsn": commit}},
                                {"range": {"_cdc_lsn": {"lt": lsn}}},
                            ]
                        }
                    },
                ],
                "minimum_should_match": 1,
            }
        }
        hits = helpers.scan(
            self.client, index=index, query={"query": older, "version": True}, _source=False
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
        """The stored documents of `events`' keys (with `_version` and `_source`)."""
        if not events:
            return {}
        docs = [{"_index": index_name(self.prefix, e.table), "_id": e.key} for e in events]
        found = self.client.mget(body={"docs": docs})["docs"]
        return {(d["_index"], d["_id"]): d for d in found if d.get("found")}

    @unavailable_on(ConnectionError, TransportError)
    def reset(self, table: Table) -> None:
        index = index_name(self.prefix, table.qualified)
        if self.client.indices.exists(index=index):
            self.client.indices.delete(index=index)
        self._indexes.pop(table.qualified, None)
        self.ensure_index(table)

    def rows(self, table: Table) -> Rows:
        return dict(self.held(table))

    @unavailable_on(ConnectionError, TransportError)
    def held(self, table: Table) -> Iterator[tuple[str, dict[str, Any]]]:
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return iter(())
        self.client.indices.refresh(index=index)
        return self._held(table, index)

    @unavailable_on(ConnectionError, TransportError)
    def held_keys(
        self, table: Table, names: dict[str, str]
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return
        ids = list(names.values())
        for at in range(0, len(ids), _SCROLL_PAGE):
            docs = [{"_index": index, "_id": i} for i in ids[at : at + _SCROLL_PAGE]]
            # realtime: the newest version of each document, refreshed or not
            for doc in self.client.mget(body={"docs": docs}, request_timeout=60)["docs"]:
                if doc.get("found"):
                    yield store_key_text(table, doc["_id"]), _document_row(table, doc["_source"])

    @unavailable_on(ConnectionError, TransportError)
    def _held(
        self, table: Table, index: str, part: tuple[int, int] | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The documents of `index` (of `table`): key text and fields; `part` (i, n): the
        i-th of n slices of the scroll."""
        query: dict[str, Any] = {"query": {"match_all": {}}}
        if part is not None and part[1] > 1:
            query["slice"] = {"id": part[0], "max": part[1]}
        for hit in helpers.scan(
            self.client, index=index, query=query, request_timeout=60, size=_SCROLL_PAGE
        ):
            yield store_key_text(table, hit["_id"]), _document_row(table, hit["_source"])

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return search_form(table, row)

    def source_form(self) -> RowForm:
        return search_form

    @unavailable_on(ConnectionError, TransportError)
    def digest_frame(self, spark: Any, table: Table, parts: int, shipped: Any) -> Any:
        """A sliced scroll of the table's index: `parts` slices, one task each."""
        index = index_name(self.prefix, table.qualified)
        parts = max(1, parts)
        if self.client.indices.exists(index=index):
            self.client.indices.refresh(index=index)
            work = spark.range(0, parts, 1, numPartitions=parts)
        else:
            work = spark.range(0, 0, 1, numPartitions=1)
        return work.mapInArrow(
            functools.partial(_digest_slices, shipped, table, index, parts),
            "key string, digest binary",
        )

    @unavailable_on(ConnectionError, TransportError)
    def key_texts(self, table: Table, wanted: set[str]) -> set[str]:
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return set()
        self.client.indices.refresh(index=index)
        return {store_key_text(table, i) for i in self._ids(table, index, wanted)}

    def _ids(self, table: Table, index: str, wanted: set[str]) -> list[str]:
        """The ids of `index`'s documents whose key text is one of `wanted`."""
        return [
            hit["_id"]
            for hit in helpers.scan(
                self.client,
                index=index,
                query={"query": {"match_all": {}}},
                _source=False,
                request_timeout=60,
                size=_SCROLL_PAGE,
            )
            if store_key_text(table, hit["_id"]) in wanted
        ]

    @unavailable_on(ConnectionError, TransportError)
    def remove(self, table: Table, keys: list[str]) -> None:
        index = index_name(self.prefix, table.qualified)
        ids = self._ids(table, index, set(keys))
        actions = ({"_op_type": "delete", "_index": index, "_id": k} for k in ids)
        helpers.bulk(self.client, actions, raise_on_error=False, refresh=True)

    @unavailable_on(ConnectionError, TransportError)
    def get(self, table: Table, key: str) -> Entry | None:
        index = index_name(self.prefix, table.qualified)
        found = self.client.get(index=index, id=key, ignore=[404])
        if not found.get("found"):
            return None
        return Entry({**found["_source"], "_version": found["_version"]})

    @unavailable_on(ConnectionError, TransportError)
    def find(
        self, table: Table, text: str, limit: int
    ) -> list[tuple[float, dict[str, Any]]] | None:
        """The documents of `table` that best match `text` (simple query string syntax
        over every field), with their scores; None when the table has no index yet."""
        index = index_name(self.prefix, table.qualified)
        if not self.client.indices.exists(index=index):
            return None
        found = self.client.search(
            index=index,
            body={
                "query": {"simple_query_string": {"query": text, "lenient": True}},
                "size": limit,
            },
        )
        return [(hit["_score"], hit["_source"]) for hit in found["hits"]["hits"]]

    def close(self) -> None:
        self.client.close()


def keep_index_settings(section: OpenSearchSettings, prefix: str, tables: list[str]) -> list[str]:
    """`cdc setup`'s part in the search store: each existing index of `tables` gets
    opensearch.number_of_replicas (OpenSearch changes it in place); one whose shard count
    is not opensearch.number_of_shards is said, with what makes it again (a shard count
    is fixed when an index is made). What it did and found, a line each; an OpenSearch
    that does not answer is said (the apply job makes missing indexes when it starts)."""
    client = opensearch_client(section, 30)
    where = ",".join(section.urls)
    names = sorted({index_name(prefix, t) for t in tables})
    found: dict[str, Any] = {}
    try:
        for at in range(0, len(names), 50):  # a URL names at most 50 of them
            found |= client.indices.get_settings(
                index=",".join(names[at : at + 50]),
                name="index.number_of_*",
                ignore_unavailable=True,
            )
        said = index_settings_lines(found, section.number_of_shards, section.number_of_replicas)
        short = sorted(
            i
            for i, (_, replicas) in _shape(found).items()
            if replicas != section.number_of_replicas
        )
        for at in range(0, len(short), 50):
            client.indices.put_settings(
                index=",".join(short[at : at + 50]),
                body={"index": {"number_of_replicas": section.number_of_replicas}},
            )
    except (ConnectionError, TransportError) as exc:
        return [
            f"search: OpenSearch at {where} does not answer ({type(exc).__name__}): its "
            "indexes' shards and replicas not checked now"
        ]
    finally:
        client.close()
    return said


def _shape(found: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per index of a get_settings answer: its shards and replicas."""
    shape = {}
    for index, body in found.items():
        settings = body.get("settings", {}).get("index", {})
        shape[index] = (int(settings["number_of_shards"]), int(settings["number_of_replicas"]))
    return shape


def index_settings_lines(found: dict[str, Any], shards: int, replicas: int) -> list[str]:
    """What `cdc setup` says of the indexes of a get_settings answer against the settings:
    the replicas it sets, and the shard counts it cannot change."""
    lines = []
    for index, (has_shards, has_replicas) in sorted(_shape(found).items()):
        if has_replicas != replicas:
            lines.append(
                f"search: index {index} replicas {has_replicas} -> {replicas} "
                "(opensearch.number_of_replicas)"
            )
        if has_shards != shards:
            lines.append(
                f"search: index {index} has {has_shards} shard(s), not "
                f"opensearch.number_of_shards {shards}: an index keeps the shards it was made "
                "with; `cdc rebuild --store search` makes it again with them"
            )
    return lines


_SCROLL_PAGE = 5000  # documents per page of verify's scroll


def search_form(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """A source row as the index's document holds it (SearchStore.form)."""
    return row_form(table, row, document_form, JSON_TYPES)


def _digest_slices(
    shipped: Settings, table: Table, index: str, parts: int, batches: Iterator[Any]
) -> Iterator[Any]:
    """On an executor: for each slice number, its documents' key texts and content
    hashes (row_digest)."""
    slices = [n for batch in batches for n in batch.column(0).to_pylist()]
    if not slices:
        return
    store = make(shipped)
    try:
        for part in slices:
            keys, digests = [], []
            for key, row in store._held(table, index, (part, parts)):
                keys.append(key)
                digests.append(row_digest(row))
                if len(keys) >= _SCROLL_PAGE * 2:
                    yield _digest_batch(keys, digests)
                    keys, digests = [], []
            yield _digest_batch(keys, digests)
    finally:
        store.close()


def _digest_batch(keys: list[str], digests: list[bytes]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.string()), pa.array(digests, pa.binary())], ["key", "digest"]
    )


def make(settings: Settings, spark: Any = None) -> SearchStore:
    return SearchStore(
        settings.opensearch, settings.pipeline.topic_prefix, settings.apply.store_retry_s
    )


def _document_row(table: Table, source: dict[str, Any]) -> dict[str, Any]:
    """A document's fields as verify compares them: one per column, and a field of a
    column PostgreSQL dropped (drift, as a field left in the cache)."""
    row = {c.name: source.get(c.name) for c in table.columns}
    row.update({k: v for k, v in source.items() if k not in row and not k.startswith("_cdc")})
    return row
