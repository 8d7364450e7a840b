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

# Many rows in one call (a script call costs Redis more than the work inside it).
# KEYS: the rows' hashes. ARGV[1]: the deleted markers' ttl; then per row: offset,
# partition, lsn, commit_ms, op, the number of field/value pairs, the number of kept
# fields, the pairs, and the fields whose stored value is kept (unchanged TOASTed
# values). Returns 1 (written) or 0 (the hash holds this position or a newer one) per row.
_WRITE = """
local ttl = tonumber(ARGV[1])
local i = 2
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local offset, partition, lsn, commit, op = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3],
    ARGV[i + 4]
  local npairs, nkept = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
  i = i + 7
  local current = redis.call('HGET', key, '_offset')
  if current and tonumber(current) >= tonumber(offset) then
    out[k] = 0
  elseif op == 'd' then
    redis.call('DEL', key)
    redis.call('HSET', key, '_offset', offset, '_partition', partition, '_deleted', '1')
    redis.call('EXPIRE', key, ttl)
    out[k] = 1
  else
    local fields = {key, '_offset', offset, '_partition', partition, '_lsn', lsn,
                    '_commit_ms', commit}
    for j = i, i + 2 * npairs - 1 do fields[#fields + 1] = ARGV[j] end
    if nkept > 0 and redis.call('HEXISTS', key, '_deleted') == 0 then
      for j = i + 2 * npairs, i + 2 * npairs + nkept - 1 do
        local v = redis.call('HGET', key, ARGV[j])
        if v then fields[#fields + 1] = ARGV[j]; fields[#fields + 1] = v end
      end
    end
    redis.call('DEL', key)
    redis.call('HSET', unpack(fields))
    out[k] = 1
  end
  i = i + 2 * npairs + nkept
end
return out
"""
_ROWS_PER_CALL = 200


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
        self.write_sha = self.client.script_load(_WRITE)  # called by its SHA in a pipeline
        self.truncate_script = self.client.register_script(_TRUNCATE)

    def prepare(self, tables: Iterable[Table]) -> None:
        self.client.ping()

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult(rejected=[])
        pipe = self.client.pipeline(transaction=False)
        columns_of: dict[str, dict[str, Any]] = {}
        for start in range(0, len(events), _ROWS_PER_CALL):
            keys: list[str] = []
            args: list[Any] = [self.marker_ttl_s]
            for event in events[start : start + _ROWS_PER_CALL]:
                keys.append(cache_key(self.prefix, event.table, event.key))
                pairs: list[str] = []
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
                            pairs += [name, cache_text(decode_value(columns[name], raw))]
                args += [
                    event.offset,
                    event.partition,
                    event.lsn or "",
                    event.commit_ms or "",
                    event.op,
                    len(pairs) // 2,
                    len(kept),
                ]
                args += pairs
                args += kept
            pipe.execute_command("EVALSHA", self.write_sha, len(keys), *keys, *args)
        for applied in pipe.execute():
            written = sum(applied)
            result.written += written
            result.stale += len(applied) - written
        return result

    def truncate(self, table: Table, before_lsn: int, commit_ms: int) -> None:
        pattern = cache_key(self.prefix, table.qualified, "*")
        pipe = self.client.pipeline(transaction=False)
        for key in self.client.scan_iter(match=pattern, count=1000):
            self.truncate_script(keys=[key], args=[before_lsn, self.marker_ttl_s], client=pipe)
        pipe.execute()

    def close(self) -> None:
        self.client.close()
