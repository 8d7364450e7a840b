"""The apply job keeps the stores equal to the source, and replays converge."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pytest
import redis

from cdc.apply.job import run_apply
from cdc.log.checkpoints import checkpoint
from cdc.stores.cache.store import cache_key
from cdc.stores.warehouse.tables import current_path, history_path, warehouse_root
from tests.conftest import Capture
from tests.contents import expected_cache, expected_search
from tests.logcheck import table_info, wait_until_equal
from tests.stores import cache_contents, history_with_ends, search_contents

pytestmark = [pytest.mark.integration, pytest.mark.pg_matrix]


def warehouse_contents(settings, table: str) -> tuple[dict[int, tuple], list[int]]:  # type: ignore[no-untyped-def]
    """The rows of the Delta current table (id -> values: live rows only, one per key),
    and the keys whose newest history version is a delete (none of them a row)."""
    from pyspark.sql import functions as F

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    frame = spark.read.format("delta").load(current_path(warehouse_root(settings), table))
    live = frame.select("id", "name", "price", "tags", F.unix_micros("seen").alias("seen_us"))
    rows = {r["id"]: (r["name"], r["price"], r["tags"], r["seen_us"]) for r in live.collect()}
    assert frame.count() == len(rows)  # one row per key
    h = spark.read.format("delta").load(history_path(warehouse_root(settings), table))
    newest = h.groupBy("id").agg(
        F.max_by("_cdc_op", F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("op")
    )
    deleted = sorted(r["id"] for r in newest.where("op = 'd'").collect())
    assert not rows.keys() & set(deleted)  # a deleted key has no row
    return rows, deleted


def history_summary(settings, table: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The history's versions, their ends as the test derives them (tests/stores.py,
    with_ends)."""
    from pyspark.sql import functions as F

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    h = history_with_ends(settings, table)
    per_key = h.groupBy("id").agg(
        F.count("*").alias("n"),
        F.sort_array(F.collect_list(F.struct("_cdc_offset", "_cdc_op"))).alias("ops"),
        F.sum(F.when(F.col("valid_to").isNull(), 1).otherwise(0)).alias("open"),
        F.max_by("_cdc_offset", F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("newest"),
        F.max("_cdc_offset").alias("last"),
    )
    current = spark.read.format("delta").load(current_path(warehouse_root(settings), table))
    at = ["id", "_cdc_commit_lsn", "_cdc_lsn", "_cdc_offset"]
    return {
        "versions": h.count(),
        "distinct": h.select("id", "_cdc_offset").distinct().count(),
        "ops": {r["id"]: [o["_cdc_op"] for o in r["ops"]] for r in per_key.collect()},
        # a key's versions in the order of their positions are those of their offsets
        "one_open_each": per_key.where("open <> 1 OR newest <> last").count() == 0,
        # each live row is its key's open version, and every other open one a delete
        "open_are_live": sorted(
            tuple(r) for r in h.where("valid_to IS NULL AND _cdc_op <> 'd'").select(*at).collect()
        )
        == sorted(tuple(r) for r in current.select(*at).collect()),
        # each version begins at its own commit (none here is read late, as a backfill's)
        "begin_at_commit": h.where("valid_from <> _cdc_commit_ts").count() == 0,
        "closed_at_next": h.alias("a")
        .join(
            h.alias("b"),
            (F.col("a.id") == F.col("b.id")) & (F.col("a._cdc_offset") < F.col("b._cdc_offset")),
        )
        .groupBy("a.id", "a._cdc_offset", "a.valid_to")
        .agg(F.min_by("b.valid_from", "b._cdc_offset").alias("next_from"))
        .where("NOT (valid_to <=> next_from)")
        .count()
        == 0,
    }


def expected_warehouse(settings, table: str) -> dict[int, tuple]:  # type: ignore[no-untyped-def]
    with psycopg.connect(settings.postgres.dsn()) as conn:
        return {
            r[0]: tuple(r[1:])
            for r in conn.execute(
                "SELECT id, name, price, tags, (extract(epoch FROM seen) * 1000000)::bigint "
                f"FROM {table}"
            ).fetchall()
        }


def test_every_store_follows_the_source_and_replays_converge(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text, price numeric(10,2), "
        "seen timestamptz, tags text[])",
        "INSERT INTO {name} SELECT g, 'item ' || g, g * 1.5, now(), ARRAY['a', 'b'] "
        "FROM generate_series(1, 500) g",
        prefix="app",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET price = price + 1 WHERE id <= 100")
        conn.execute(f"DELETE FROM {name} WHERE id > 450")
        conn.execute(f"UPDATE {name} SET name = NULL WHERE id = 7")
        conn.execute(f"INSERT INTO {name} VALUES (1000, 'new', 9.99, now(), '{{}}')")
    wait_until_equal(settings, table_info(settings, table))  # all of it is in the log
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    expected = expected_cache(settings, table)
    assert len(expected) == 451
    assert cache_contents(settings, table) == expected
    searchable = expected_search(settings, table)
    assert search_contents(settings, table) == searchable

    warehouse = expected_warehouse(settings, table)
    deleted = list(range(451, 501))
    assert warehouse_contents(settings, table) == (warehouse, deleted)
    history = history_summary(settings, table)
    assert history["versions"] == history["distinct"] == 500 + 100 + 50 + 1 + 1
    assert history["ops"][3] == ["r", "u"] and history["ops"][460] == ["r", "d"]
    assert history["ops"][7] == ["r", "u", "u"] and history["ops"][1000] == ["c"]
    assert history["one_open_each"]  # the newest version of every key is open
    assert history["open_are_live"]  # and it is the key's live row, or its delete
    assert history["begin_at_commit"]
    assert history["closed_at_next"]  # every other one ends where the next begins

    # warehouse: checkpoint and tables reset, replayed from offset 0
    shutil.rmtree(Path(checkpoint(settings, "warehouse").path))
    shutil.rmtree(Path(warehouse_root(settings)) / "public" / name)
    run_apply(settings, ["warehouse"], once=True)
    assert warehouse_contents(settings, table) == (warehouse, deleted)
    assert history_summary(settings, table) == history
    # and replayed over itself: the position guard refuses every write, and no
    # history version is added twice
    shutil.rmtree(Path(checkpoint(settings, "warehouse").path))
    run_apply(settings, ["warehouse"], once=True)
    assert warehouse_contents(settings, table) == (warehouse, deleted)
    assert history_summary(settings, table) == history

    # search: a replay with the index kept is refused document by document by
    # OpenSearch's external versions, and changes nothing
    shutil.rmtree(Path(checkpoint(settings, "search").path))
    run_apply(settings, ["search"], once=True)
    assert search_contents(settings, table) == searchable

    # replay from offset 0: checkpoint and contents reset, same result
    shutil.rmtree(Path(checkpoint(settings, "cache").path))
    client = redis.Redis.from_url(settings.redis.url)
    for key in client.scan_iter(match=cache_key(settings.pipeline.topic_prefix, table, "*")):
        client.delete(key)
    run_apply(settings, ["cache"], once=True)
    assert cache_contents(settings, table) == expected

    # a replay over a current cache changes nothing (every write is stale)
    shutil.rmtree(Path(checkpoint(settings, "cache").path))
    run_apply(settings, ["cache"], once=True)
    assert cache_contents(settings, table) == expected
