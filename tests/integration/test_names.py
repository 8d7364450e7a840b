"""Column names that look like the stores' own metadata: a table with columns `_lsn`,
`_deleted`, `_offset` and `_commit_lsn` is applied to the cache like any other (the row
is neither hidden nor its position overwritten, so a later change still lands); read
with redis-py. Columns named like the fields of the warehouse's decoded events (`key`,
`op`, `offset`, `lsn`, …) reach every store, the history too."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import redis

from cdc.apply.job import run_apply
from cdc.core.topics import change_topic
from cdc.stores.warehouse.tables import history_path, warehouse_root
from tests.conftest import Capture
from tests.logcheck import (
    source_rows,
    table_info,
    wait_until_captured,
    wait_until_equal,
)
from tests.stores import stores

pytestmark = pytest.mark.integration


# every name the warehouse's decoding, current-state MERGE and history once used
WAREHOUSE_NAMES = (
    'op text, "offset" int, "partition" text, lsn bigint, commit_lsn bigint, '
    "commit_ms bigint, cut_ms int, k_key text, cur_key text, _n int, _new text, "
    "_cap text, _was text, _from text, ref text"
)


def test_columns_named_like_the_warehouse_fields_reach_every_store(captured: Capture) -> None:
    """`key` (a settings table's primary key, Rails' ar_internal_metadata) and the rest
    broke every warehouse batch: an ambiguous reference in the MERGE."""
    t = captured(
        f"CREATE TABLE {{name}} (key text PRIMARY KEY, {WAREHOUSE_NAMES}, body text)",
        "ALTER TABLE {name} ALTER body SET STORAGE EXTERNAL",  # TOASTed, never inline
        "INSERT INTO {name} SELECT 'k' || g, 'op', g, 'p', g, g, g, g, 'kk', 'ck', g, 'new', "
        "'cap', 'was', 'from', 'r', repeat(md5(g::text), 300) FROM generate_series(1, 5) g",
        prefix="wnames",
    )
    stored = ["cache", "search", "warehouse"]
    run_apply(t.settings, stored, once=True)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        # body unchanged: the events carry Debezium's placeholder for it
        conn.execute(f"UPDATE {t.name} SET op = 'op2', lsn = lsn + 100 WHERE key IN ('k1', 'k2')")
        conn.execute(f"DELETE FROM {t.name} WHERE key = 'k5'")
    info = table_info(t.settings, t.table)
    wait_until_captured(t.settings)
    run_apply(t.settings, stored, once=True)

    def texts(rows: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, str | None]]:
        return {
            k: {c: None if v is None else str(v) for c, v in r.items()} for k, r in rows.items()
        }

    expected = texts({k[0]: row for k, row in source_rows(t.settings, info).items()})
    assert sorted(expected) == ["k1", "k2", "k3", "k4"]
    assert expected["k1"]["op"] == "op2" and len(expected["k1"]["body"] or "") == 9600
    for store, rows in stores(t.settings, t.table, key="key").items():
        held = texts(rows)
        assert held.keys() == expected.keys(), (store, sorted(held))
        differ = {
            (k, c): (v, held[k].get(c))
            for k, row in expected.items()
            for c, v in row.items()
            # the tests' cache reader leaves out fields named _… (the cache's own)
            if held[k].get(c) != v and not (store == "cache" and c.startswith("_"))
        }
        assert not differ, (store, differ)

    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    history = spark.read.format("delta").load(history_path(warehouse_root(t.settings), t.table))
    k1 = sorted(
        (r["op"], r["lsn"], len(r["body"] or "")) for r in history.where("key = 'k1'").collect()
    )
    assert k1 == [("op", 1, 9600), ("op2", 101, 9600)], k1


def test_columns_named_like_the_cache_metadata(captured: Capture) -> None:
    t = captured(
        'CREATE TABLE {name} (id int PRIMARY KEY, "_lsn" bigint, "_deleted" text, '
        '"_offset" int, "_commit_lsn" text, body text)',
        "INSERT INTO {name} SELECT g, 99999999999, 'yes', -1, 'zzz', 'v0' "
        "FROM generate_series(1, 5) g",
        prefix="meta",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, ["cache"], once=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1', \"_lsn\" = 7 WHERE id <= 3")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, ["cache"], once=True)

    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    rows = {}
    for key in client.scan_iter(match=prefix + "*"):
        entry = client.hgetall(key)
        assert "_deleted" not in entry, entry  # a live row, not a deleted marker
        assert int(entry["_lsn"]) < 2**40 and entry["_commit_lsn"].isdigit(), entry
        rows[json.loads(key[len(prefix) :])["id"]] = (
            entry["body"],
            entry["__lsn"],
            entry["__deleted"],
            entry["__offset"],
            entry["__commit_lsn"],
        )
    assert rows == {
        i: ("v1" if i <= 3 else "v0", "7" if i <= 3 else "99999999999", "yes", "-1", "zzz")
        for i in range(1, 6)
    }


def test_a_table_name_kafka_and_opensearch_do_not_take(captured: Capture) -> None:
    """A table whose name holds a dot, a space, capitals and a non-ASCII letter: its topic
    and index are named as Debezium names the topic (`_` for each such character), and every
    store takes its rows."""
    t = captured(
        'CREATE TABLE "{name}" (id int PRIMARY KEY, body text)',
        """INSERT INTO "{name}" SELECT g, 'v' || g FROM generate_series(1, 5) g""",
        prefix="Order.Items é",
    )
    settings, table = t.settings, t.table
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"""UPDATE "{t.name}" SET body = 'changed' WHERE id = 1""")
        conn.execute(f"""INSERT INTO "{t.name}" VALUES (6, 'new')""")
    wait_until_equal(settings, table_info(settings, table))
    topic = change_topic(settings.pipeline, table)
    prefix = settings.pipeline.topic_prefix
    assert topic == f"{prefix}.public.Order.Items___{t.name[-8:]}"
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    expected = {i: f"v{i}" for i in range(2, 6)} | {1: "changed", 6: "new"}
    for store, rows in stores(settings, table).items():
        assert {k: row["body"] for k, row in rows.items()} == expected, store
