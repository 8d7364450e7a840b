"""Redis: one hash per row, written through a compare-and-set on the log position.

Key `<prefix>:<schema.table>:<key JSON>`; fields: one per non-NULL column (values as
text: numbers and booleans as JSON, times in ISO 8601, bytea as base64, json as its
text), plus the position `_commit_lsn`, `_lsn` (cdc/log/position.py), `_offset`,
`_partition` and `_commit_ms`. A column whose name begins with `_` is the field of that
name with one more `_` (`_lsn` -> `__lsn`), so no column reaches the metadata. A delete
replaces the hash by a marker {position, _offset, _deleted} that expires after
`marker_ttl_s`, long enough to refuse a stale write. An unchanged TOASTed value
(Debezium's placeholder) keeps the stored field. A Redis that does not answer is retried
for `retry_s`, then StoreUnavailableError.
"""

from __future__ import annotations

import functools
import logging
import re
import time as clock
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from cdc.core.catalog import Table
from cdc.core.clients import redis_client
from cdc.core.errors import StoreError, StoreUnavailableError, ValueDecodeError
from cdc.core.settings import Settings
from cdc.core.settings.connections import RedisSettings
from cdc.log.position import Event, older_lua
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
from cdc.types.store_forms import cache_field_text, cache_form

__all__ = [
    "CacheStore",
    "cache_key",
    "check_standalone",
    "cluster_problem",
    "column_fields",
    "field_name",
]

log = logging.getLogger(__name__)

# Many rows in one call (a script call costs Redis more than the work inside it).
# KEYS: the rows' hashes. ARGV[1]: the deleted markers' ttl; then per row: commit_lsn and
# lsn (the position; empty for a tombstone), offset, partition, commit_ms, op, the number
# of field/value pairs, the number of kept fields, the pairs, and the fields whose stored
# value is kept (unchanged TOASTed values). Returns 1 (written) or 0 (the hash holds this
# position or a newer one) per row.
_WRITE = (
    older_lua()
    + """
local ttl = tonumber(ARGV[1])
local i = 2
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local commit, lsn, offset, partition, ms, op = ARGV[i], ARGV[i + 1], ARGV[i + 2],
    ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local npairs, nkept = tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7])
  i = i + 8
  out[k] = 0
  if commit == '' then
    -- a tombstone: deletes what an earlier record of its partition wrote
    local stored = redis.call('HGET', key, '_offset')
    if stored and redis.call('HEXISTS', key, '_deleted') == 0
        and redis.call('HGET', key, '_partition') == partition
        and tonumber(stored) < tonumber(offset) then
      -- the marker sits just below the change it deleted (cdc/log/position.below)
      local c = redis.call('HGET', key, '_commit_lsn') or '0'
      local l = string.format('%.0f', tonumber(redis.call('HGET', key, '_lsn') or '0') - 1)
      redis.call('DEL', key)
      redis.call('HSET', key, '_commit_lsn', c, '_lsn', l, '_offset', offset,
        '_partition', partition, '_deleted', '1')
      redis.call('EXPIRE', key, ttl)
      out[k] = 1
    end
  elseif older(key, {tonumber(commit), tonumber(lsn)}) then
    if op == 'd' then
      redis.call('DEL', key)
      redis.call('HSET', key, '_commit_lsn', commit, '_lsn', lsn, '_offset', offset,
        '_partition', partition, '_deleted', '1')
      redis.call('EXPIRE', key, ttl)
    else
      local fields = {key, '_commit_lsn', commit, '_lsn', lsn, '_offset', offset,
                      '_partition', partition, '_commit_ms', ms}
      for j = i, i + 2 * npairs - 1 do fields[#fields + 1] = ARGV[j] end
      if nkept > 0 and redis.call('HEXISTS', key, '_deleted') == 0 then
        for j = i + 2 * npairs, i + 2 * npairs + nkept - 1 do
          local v = redis.call('HGET', key, ARGV[j])
          if v then fields[#fields + 1] = ARGV[j]; fields[#fields + 1] = v end
        end
      end
      redis.call('DEL', key)
      redis.call('HSET', unpack(fields))
    end
    out[k] = 1
  end
  i = i + 2 * npairs + nkept
end
return out
"""
)
_ROWS_PER_CALL = 200
_REMOVE_BATCH = 1000  # keys per DEL


# KEYS[1] a row's hash. ARGV: the TRUNCATE's position (commit_lsn, lsn), marker ttl. A
# row written before the TRUNCATE becomes a deleted marker that keeps its position.
_TRUNCATE = (
    older_lua()
    + """
if redis.call('HEXISTS', KEYS[1], '_deleted') == 1 then return 0 end
if not older(KEYS[1], {tonumber(ARGV[1]), tonumber(ARGV[2])}) then return 0 end
local c = tonumber(redis.call('HGET', KEYS[1], '_commit_lsn') or '-1')
local l = tonumber(redis.call('HGET', KEYS[1], '_lsn') or '-1')
local offset = redis.call('HGET', KEYS[1], '_offset')
local partition = redis.call('HGET', KEYS[1], '_partition')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '_commit_lsn', string.format('%.0f', c),
  '_lsn', string.format('%.0f', l), '_offset', offset,
  '_partition', partition, '_deleted', '1')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
)

# what a store that is down raises (a restarted Redis answers LOADING for a while)
_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def cache_key(prefix: str, table: str, key: str) -> str:
    return f"{prefix}:{table}:{key}"


def field_name(column: str) -> str:
    """A column's field in its row's hash: metadata fields begin with one `_` and a
    letter, so a column beginning with `_` gets one more."""
    return "_" + column if column.startswith("_") else column


def column_fields(entry: dict[str, str]) -> dict[str, str]:
    """A hash's fields that are the row's columns, by column name (metadata left out)."""
    return {
        (name[1:] if name.startswith("__") else name): value
        for name, value in entry.items()
        if not name.startswith("_") or name.startswith("__")
    }


def cluster_problem(client: Any, url: str) -> str | None:
    """Why the cache cannot be kept in the Redis `client` reaches, or None. Redis Cluster
    (`INFO cluster`: cluster_enabled:1) cannot: a write is one Lua script over up to
    _ROWS_PER_CALL rows' keys, which a cluster refuses when they lie in several hash
    slots (CROSSSLOT), and the rows' keys are spread over every slot."""
    try:
        enabled = client.info("cluster").get("cluster_enabled")
    except redis.ResponseError as exc:  # INFO refused to an ACL user: writes will say
        log.info("Redis at %s: INFO cluster refused (%s)", url, exc)
        return None
    if str(enabled) != "1":
        return None
    return (
        f"Redis at {url} runs Redis Cluster, which the cache cannot use: each write is one "
        f"Lua script over up to {_ROWS_PER_CALL} rows' keys, and a cluster refuses a script "
        "whose keys lie in several hash slots; point redis.host/port at a standalone Redis "
        "or a Sentinel-managed primary"
    )


def check_standalone(section: RedisSettings) -> list[str]:
    """`cdc setup`'s check of the cache: raises StoreError for Redis Cluster; a Redis that
    does not answer is said (and checked again when `cdc apply` starts)."""
    client = redis_client(section)
    try:
        problem = cluster_problem(client, section.url)
    except _DOWN as exc:
        return [
            f"cache: Redis at {section.url} does not answer ({type(exc).__name__}): not "
            "checked now (`cdc apply` checks it is not Redis Cluster when it starts)"
        ]
    finally:
        client.close()
    if problem:
        raise StoreError(problem)
    return []


class CacheStore(RowStore, StoreReader):
    name = "cache"
    reads_by_name = True

    def __init__(
        self,
        section: RedisSettings,
        prefix: str,
        marker_ttl_s: int,
        retry_s: float = 30.0,
    ) -> None:
        self.url = section.url  # no password in it
        self.client = redis_client(section, socket_timeout=10, socket_connect_timeout=5)
        self.prefix = prefix
        self.marker_ttl_s = marker_ttl_s
        self.retry_s = retry_s
        self._write_sha: str | None = None
        self.truncate_script = self.client.register_script(_TRUNCATE)

    def prepare(self, tables: Iterable[Table]) -> None:
        self.ping()
        if problem := cluster_problem(self.client, self.url):
            raise StoreError(problem)

    def ping(self) -> None:
        try:
            self.client.ping()
        except _DOWN as exc:
            raise StoreUnavailableError(self.unavailable(exc)) from None

    def unavailable(self, exc: BaseException) -> str:
        if isinstance(exc, redis.AuthenticationError):  # waiting does not mend it
            return (
                f"Redis at {self.url} refused the login ({exc}): fix redis.username and "
                "redis.password (CDC_REDIS__USERNAME, CDC_REDIS__PASSWORD)"
            )
        return f"Redis at {self.url} does not answer ({type(exc).__name__})"

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult()
        calls = self._calls(tables, events, result)
        deadline = clock.monotonic() + self.retry_s
        pause = 0.2
        while True:
            try:
                if self._write_sha is None:  # called by its SHA in a pipeline
                    self._write_sha = self.client.script_load(_WRITE)
                pipe = self.client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.execute_command("EVALSHA", self._write_sha, len(keys), *keys, *args)
                replies = pipe.execute()
                break
            except redis.exceptions.NoScriptError:
                self._write_sha = None  # a restarted Redis forgot the script
            except _DOWN as exc:
                # every write is guarded by its position: sending them again is harmless
                if clock.monotonic() > deadline:
                    raise StoreUnavailableError(self.unavailable(exc)) from None
                log.warning("%s; retrying", self.unavailable(exc))
                clock.sleep(pause)
                pause = min(pause * 2, 5.0)
        for applied in replies:
            written = sum(applied)
            result.written += written
            result.stale += len(applied) - written
        return result

    def _calls(
        self, tables: dict[str, Table], events: list[Event], result: WriteResult
    ) -> list[tuple[list[str], list[Any]]]:
        """The script calls that write `events`; an event whose value cannot be decoded
        goes to result.rejected."""
        calls = []
        columns_of: dict[str, dict[str, Any]] = {}
        for start in range(0, len(events), _ROWS_PER_CALL):
            keys: list[str] = []
            args: list[Any] = [self.marker_ttl_s]
            for event in events[start : start + _ROWS_PER_CALL]:
                pairs: list[str] = []
                kept: list[str] = []
                if event.op != "d" and event.after is not None:
                    columns = columns_of.get(event.table)
                    if columns is None:
                        columns = columns_of[event.table] = {
                            c.name: c for c in tables[event.table].columns
                        }
                    try:
                        for name, raw in event.after.items():
                            if raw == UNAVAILABLE:
                                kept.append(field_name(name))
                            elif raw is not None and name in columns:
                                text = cache_field_text(columns[name], raw)
                                pairs += [field_name(name), text]
                    except ValueDecodeError as exc:  # a value this store cannot hold
                        result.rejected.append((event, str(exc)[:500]))
                        continue
                position = event.position
                keys.append(cache_key(self.prefix, event.table, event.key))
                args += [
                    *(position if position is not None else ("", "")),
                    event.offset,
                    event.partition,
                    event.commit_ms or "",
                    event.op,
                    len(pairs) // 2,
                    len(kept),
                ]
                args += pairs
                args += kept
            if keys:
                calls.append((keys, args))
        return calls

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in self._keys(table):
                self.truncate_script(
                    keys=[key], args=[before[0], before[1], self.marker_ttl_s], client=pipe
                )
            pipe.execute()
        except _DOWN as exc:
            raise StoreUnavailableError(self.unavailable(exc)) from None

    @unavailable_on(*_DOWN)
    def reset(self, table: Table) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in self._keys(table):
            pipe.delete(key)
        pipe.execute()

    def _keys(self, table: Table) -> list[bytes]:
        """The hashes of `table` (the pattern characters in its name escaped)."""
        return list(self._names(table))

    @unavailable_on(*_DOWN)
    def _names(self, table: Table) -> Iterator[bytes]:
        """`_keys`, as SCAN finds them."""
        yield from self.client.scan_iter(match=self._match(table), count=10_000)

    def _match(self, table: Table) -> str:
        """The SCAN pattern of the table's hashes (the pattern characters escaped)."""
        prefix = re.sub(r"([\\\[\]*?])", r"\\\1", cache_key(self.prefix, table.qualified, ""))
        return prefix + "*"

    def rows(self, table: Table) -> Rows:
        return dict(self.held(table))

    def held(self, table: Table) -> Iterator[tuple[str, dict[str, str]]]:
        return self._held(table, self._keys(table))

    def held_keys(
        self, table: Table, names: dict[str, str]
    ) -> Iterator[tuple[str, dict[str, str]]]:
        hashes = [cache_key(self.prefix, table.qualified, n).encode() for n in names.values()]
        return self._held(table, hashes)

    def key_texts(self, table: Table, wanted: set[str]) -> set[str]:
        # live: not a deleted marker
        return {k for k, _ in self._held(table, self._named(table, wanted))}

    def _named(self, table: Table, wanted: set[str]) -> list[bytes]:
        """The names of the table's hashes whose key text is one of `wanted`."""
        prefix = len(cache_key(self.prefix, table.qualified, ""))
        return [
            k for k in self._keys(table) if store_key_text(table, k.decode()[prefix:]) in wanted
        ]

    @unavailable_on(*_DOWN)
    def _held(self, table: Table, keys: list[bytes]) -> Iterator[tuple[str, dict[str, str]]]:
        """The live rows of `keys` (hashes of `table`): key text and column fields."""
        prefix = len(cache_key(self.prefix, table.qualified, ""))
        chunks = [keys[at : at + _READ_BATCH] for at in range(0, len(keys), _READ_BATCH)]
        if not chunks:
            return
        # a chunk's HGETALLs go out at once on one connection and their replies are read
        # as they come (Redis does half of a read script's work for them, and redis-py
        # no pipeline's per-command work), the next chunk's while this one is turned into
        # rows
        with ThreadPoolExecutor(1, thread_name_prefix="cache-read") as ahead:
            coming = ahead.submit(self._hashes, chunks[0])
            for at, chunk in enumerate(chunks):
                replies = coming.result()
                if at + 1 < len(chunks):
                    coming = ahead.submit(self._hashes, chunks[at + 1])
                for key, entry in zip(chunk, replies, strict=True):
                    fields = live_fields(entry)
                    if fields is not None:
                        yield store_key_text(table, key.decode()[prefix:]), fields

    def _hashes(self, keys: list[bytes]) -> list[Any]:
        """Each of `keys`' HGETALL reply (a map, or a flat list under RESP2). A connection
        Redis dropped (its idle timeout, a restart, a failover) is made again and the
        chunk sent again, as redis-py retries any command."""
        pool = self.client.connection_pool
        conn = pool.get_connection()

        def read() -> list[Any]:
            conn.send_packed_command(conn.pack_commands([("HGETALL", k) for k in keys]))
            return [conn.read_response() for _ in keys]

        try:
            # a failed connection may hold replies unread: dropped before the next try
            replies: list[Any] = conn.retry.call_with_retry(read, lambda _: conn.disconnect())
            return replies
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return cache_form(table, row)

    def source_form(self) -> RowForm:
        return cache_form

    def digest_frame(self, spark: Any, table: Table, parts: int, shipped: Any) -> Any:
        """One task SCANs the table's hashes (their names only), which are spread over
        `parts` tasks that read them, pipelined, and hash each live row."""
        names = spark.range(0, 1, 1, numPartitions=1).mapInArrow(
            functools.partial(_scan_names, shipped, table), "name binary"
        )
        return names.repartition(max(1, parts)).mapInArrow(
            functools.partial(_digest_names, shipped, table), "key string, digest binary"
        )

    @unavailable_on(*_DOWN)
    def remove(self, table: Table, keys: list[str]) -> None:
        held = self._named(table, set(keys))
        for at in range(0, len(held), _REMOVE_BATCH):
            self.client.delete(*held[at : at + _REMOVE_BATCH])

    @unavailable_on(*_DOWN)
    def get(self, table: Table, key: str) -> Entry | None:
        entry: dict[bytes, bytes] = self.client.execute_command(
            "HGETALL", cache_key(self.prefix, table.qualified, key)
        )
        fields = {k.decode(): v.decode() for k, v in entry.items()}
        return Entry(fields, "_deleted" in fields) if fields else None

    def close(self) -> None:
        self.client.close()


_READ_BATCH = 1000  # hashes read by one round of HGETALLs


def live_fields(entry: Any) -> dict[str, str] | None:
    """A hash's HGETALL reply as its column fields (the metadata fields left out, a
    column whose name starts with `_` under its own name), or None for a hash that is not
    there or is a deleted marker."""
    if not entry:
        return None
    pairs = entry.items() if isinstance(entry, dict) else zip(entry[0::2], entry[1::2], strict=True)
    fields = {}
    for name, value in pairs:
        if name[:1] == b"_":
            if name == b"_deleted":
                return None
            if name[:2] == b"__":
                fields[name[1:].decode()] = value.decode()
        else:
            fields[name.decode()] = value.decode()
    return fields


_SCAN_BATCH = 10_000  # hash names per Arrow batch of verify's scan


def _scan_names(shipped: Settings, table: Table, batches: Iterator[Any]) -> Iterator[Any]:
    """On an executor: the names of the table's hashes, in Arrow batches."""
    import pyarrow as pa

    for _ in batches:
        pass
    store = make(shipped)
    try:
        names: list[bytes] = []
        for name in store._names(table):
            names.append(name)
            if len(names) >= _SCAN_BATCH:
                yield pa.RecordBatch.from_arrays([pa.array(names, pa.binary())], ["name"])
                names = []
        yield pa.RecordBatch.from_arrays([pa.array(names, pa.binary())], ["name"])
    finally:
        store.close()


def _digest_names(shipped: Settings, table: Table, batches: Iterator[Any]) -> Iterator[Any]:
    """On an executor: each hash's key text and content hash (row_digest), live rows only."""
    import pyarrow as pa

    store = make(shipped)
    try:
        for batch in batches:
            keys, digests = [], []
            for key, row in store._held(table, batch.column(0).to_pylist()):
                keys.append(key)
                digests.append(row_digest(row))
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.string()), pa.array(digests, pa.binary())], ["key", "digest"]
            )
    finally:
        store.close()


def make(settings: Settings, spark: Any = None) -> CacheStore:
    return CacheStore(
        settings.redis,
        settings.pipeline.topic_prefix,
        settings.apply.deleted_marker_ttl_s,
        settings.apply.store_retry_s,
    )
