"""Verify's reads of the cache's hashes (CacheStore._held: a chunk of HGETALLs on one
connection) outlive a connection Redis dropped while they ran (a restart, a failover,
its idle `timeout`), as every other command of redis-py does: the chunk is sent again on
a new connection."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cdc.core.catalog import Column, Table
from cdc.core.clients import redis_client
from cdc.stores.cache.store import CacheStore, cache_key
from tests.conftest import RunningStack

pytestmark = pytest.mark.integration


def test_a_read_outlives_a_connection_redis_dropped(stack: RunningStack) -> None:
    prefix = "reads" + uuid.uuid4().hex[:8]
    column = Column("id", "int4", "int4", "N", False, None, True)
    table = Table(
        "public",
        "t",
        (column, Column("_n", "text", "text", "S", False, None, False)),
        ("id",),
        "d",
        0,
        0,
    )
    other = redis_client(stack.settings.redis)
    names = {f'{{"id":{i}}}': f'{{"id":{i}}}' for i in range(1, 2501)}
    for name in names:
        other.hset(
            cache_key(prefix, table.qualified, name),
            mapping={"id": name[6:-1], "__n": "x", "_offset": "1"},
        )
    store = CacheStore(stack.settings.redis, prefix, 60)
    try:
        expected = {n: {"id": n[6:-1], "_n": "x"} for n in names}
        assert dict(store.held_keys(table, names)) == expected  # its connections pooled
        pool = store.client.connection_pool
        taken = pool.get_connection

        def dropped(*args: Any, **kwargs: Any) -> Any:
            # Redis drops the connection once the pool has checked it and handed it out
            pool.get_connection = taken  # type: ignore[method-assign]
            conn = taken(*args, **kwargs)
            other.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            return conn

        pool.get_connection = dropped  # type: ignore[method-assign]
        assert dict(store.held_keys(table, names)) == expected
        assert pool.get_connection == taken  # the drop happened
    finally:
        store.close()
        keys = list(other.scan_iter(match=f"{prefix}:*", count=1000))
        other.delete(*keys)
        other.close()
