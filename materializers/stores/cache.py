"""Redis: one hash per row, written through a compare-and-set on the log position.

Key `<prefix>:<schema.table>:<key JSON>`; fields: one per non-NULL column (values as
text: numbers and booleans as JSON, times in ISO 8601, bytea as base64, json as its
text), plus `_offset`, `_partition`, `_lsn`, `_commit_ms`. A delete replaces the
hash by a marker {_offset, _deleted} that expires after `marker_ttl_s`, long enough to
refuse a stale write. An unchanged TOASTed value (Debezium's placeholder) keeps the
stored field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import redis

from cdc.catalog import Table
from cdc.decode import UNAVAILABLE, Interval, decode_value
from materializers.stores.base import Event, Store, WriteResult

__all__ = ["CacheStore", "cache_key", "cache_text"]

# KEYS[1] the row's hash. ARGV: offset, partition, lsn, commit_ms, op, marker ttl,
# then field/value pairs, then "--", then the fields whose stored value is kept.
_WRITE = """
local current = redis.call('HGET', KEYS[1], '_offset')
if current and tonumber(current) >= tonumber(ARGV[1]) then return 0 end
if ARGV[5] == 'd' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], '_offset', ARGV[1], '_partition', ARGV[2], '_deleted', '1')
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[6]))
  return 1
end
local i = 7
local pairs = {}
while ARGV[i] ~= '--' do
  table.insert(pairs, ARGV[i]); table.insert(pairs, ARGV[i + 1]); i = i + 2
end
local kept = {}
i = i + 1
while ARGV[i] do
  if redis.call('HEXISTS', KEYS[1], '_deleted') == 0 then
    local v = redis.call('HGET', KEYS[1], ARGV[i])
    if v then table.insert(kept, ARGV[i]); table.insert(kept, v) end
  end
  i = i + 1
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '_offset', ARGV[1], '_partition', ARGV[2], '_lsn', ARGV[3],
           '_commit_ms', ARGV[4])
if #pairs > 0 then redis.call('HSET', KEYS[1], unpack(pairs)) end
if #kept > 0 then redis.call('HSET', KEYS[1], unpack(kept)) end
return 1
"""


# KEYS[1] a row's hash. ARGV: the TRUNCATE's LSN, marker ttl. A row written before the
# TRUNCATE becomes a deleted marker that keeps its position.
_TRUNCATE = """
if redis.call('HEXISTS', KEYS[1], '_deleted') == 1 then return 0 end
local lsn = redis.call('HGET', KEYS[1], '_lsn')
if lsn and lsn ~= '' and tonumber(lsn) >= tonumber(ARGV[1]) then return 0 end
local offset = redis.call('HGET', KEYS[1], '_offset')
local partition = redis.call('HGET', KEYS[1], '_partition')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '_offset', offset, '_partition', partition, '_deleted', '1')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


def cache_key(prefix: str, table: str, key: str) -> str:
    return f"{prefix}:{table}:{key}"


def cache_text(value: Any) -> str:
    """A decoded value as the text a cache reader gets."""
    kind = type(value)
    if kind is str:  # the common cases first: this runs for every column of every row
        return value
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, bool | int | float | list | dict):
        return json.dumps(value, default=cache_text, ensure_ascii=False)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode()
    if isinstance(value, Interval):
        return json.dumps(value.__dict__)
    return str(value)


class CacheStore(Store):
    name = "cache"

    def __init__(self, url: str, prefix: str, password: str | None, marker_ttl_s: int) -> None:
        self.client = redis.Redis.from_url(url, password=password, socket_timeout=10)
        self.prefix = prefix
        self.marker_ttl_s = marker_ttl_s
        self.script = self.client.register_script(_WRITE)
        self.client.script_load(_WRITE)  # write() calls it by its SHA in a pipeline
        self.truncate_script = self.client.register_script(_TRUNCATE)

    def prepare(self, tables: Iterable[Table]) -> None:
        self.client.ping()

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult(rejected=[])
        pipe = self.client.pipeline(transaction=False)
        sha = self.script.sha
        columns_of: dict[str, dict[str, Any]] = {}
        for event in events:
            args: list[Any] = [
                "EVALSHA",
                sha,
                1,
                cache_key(self.prefix, event.table, event.key),
                event.offset,
                event.partition,
                event.lsn or "",
                event.commit_ms or "",
                event.op,
                self.marker_ttl_s,
            ]
            kept: list[str] = []
            if event.op != "d" and event.after is not None:
                columns = columns_of.get(event.table)
                if columns is None:
                    columns = columns_of[event.table] = {
                        c.name: c for c in tables[event.table].columns
                    }
                for name, raw in event.after.items():
                    if raw == UNAVAILABLE:
                        kept.append(name)
                    elif raw is not None and name in columns:
                        args += [name, cache_text(decode_value(columns[name], raw))]
            args.append("--")
            args += kept
            pipe.execute_command(*args)
        for applied in pipe.execute():
            if applied:
                result.written += 1
            else:
                result.stale += 1
        return result

    def truncate(self, table: Table, before_lsn: int, commit_ms: int) -> None:
        pattern = cache_key(self.prefix, table.qualified, "*")
        pipe = self.client.pipeline(transaction=False)
        for key in self.client.scan_iter(match=pattern, count=1000):
            self.truncate_script(keys=[key], args=[before_lsn, self.marker_ttl_s], client=pipe)
        pipe.execute()

    def close(self) -> None:
        self.client.close()
