"""Query, search, get and verify against the real stores."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import redis

from cdc.apply.job import run_apply
from cdc.check.keyed import store_names
from cdc.check.repair import repair
from cdc.check.verify import Drift, source_rows, verify
from cdc.stores.cache.store import cache_key
from cdc.stores.search.store import index_name
from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import recorded_placeholder, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.stores import cache_hashes, search_documents

pytestmark = pytest.mark.integration


@pytest.mark.pg_matrix
def test_query_search_get_and_verify_finds_drift(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL, price numeric(10, 2), "
        "tags text[], seen timestamptz, attrs jsonb, ratio real)",
        "INSERT INTO {name} SELECT g, 'item ' || g || CASE WHEN g % 10 = 0 THEN ' walnut' "
        "ELSE '' END, g * 1.5, ARRAY['t' || g % 3], now() - g * interval '1 hour', "
        "jsonb_build_object('n', g, 'odd', g % 2 = 1), g / 7.0 FROM generate_series(1, 200) g",
        prefix="ver",
    )
    name, table, settings, dsn, env = t.name, t.table, t.settings, t.dsn, t.env
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET price = price + 1, tags = NULL WHERE id <= 20")
        conn.execute(f"DELETE FROM {name} WHERE id BETWEEN 190 AND 200")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    info = table_info(settings, table)

    results = verify(settings, [info], ["cache", "search", "warehouse"], timeout=60)
    assert [(d.store, d.ok, d.source_rows, d.store_rows) for d in results] == [
        ("cache", True, 189, 189),
        ("search", True, 189, 189),
        ("warehouse", True, 189, 189),
    ]

    # query, search and get return what PostgreSQL holds
    queried = run_cdc(
        "query",
        f"SELECT id, name, price FROM {name} WHERE id <= 3 ORDER BY id",
        "-o",
        "json",
        env=env,
    )
    assert queried.returncode == 0, queried.stderr
    assert json.loads(queried.stdout) == [
        {"id": i, "name": f"item {i}", "price": f"{i * 1.5 + 1:.2f}"} for i in (1, 2, 3)
    ]
    missing = run_cdc("query", "SELECT * FROM nope", env=env)
    assert missing.returncode == 9
    assert f"no table nope in the warehouse; tables: {name}, {name}_history" in missing.stderr
    found = run_cdc("search", name, "walnut", "-n", "50", "-o", "json", env=env)
    assert found.returncode == 0, found.stderr
    assert sorted(hit["id"] for hit in json.loads(found.stdout)) == list(range(10, 190, 10))
    entry = run_cdc("get", name, "5", "-o", "json", env=env)
    assert entry.returncode == 0, entry.stderr
    assert json.loads(entry.stdout)["name"] == "item 5"
    gone = run_cdc("get", name, "195", env=env)
    assert gone.returncode == 9 and "was deleted" in gone.stderr
    # every store answers for a key, with the position that wrote it
    for store, position in (("search", "_cdc_commit_lsn"), ("warehouse", "_cdc_commit_lsn")):
        held = run_cdc("get", name, "5", "--store", store, "-o", "json", env=env)
        assert held.returncode == 0, held.stderr
        assert json.loads(held.stdout)["name"] == "item 5"
        assert json.loads(held.stdout)[position] > 0
    assert json.loads(entry.stdout)["_commit_lsn"] == str(
        json.loads(held.stdout)["_cdc_commit_lsn"]
    )
    marker = run_cdc("get", name, "195", "--store", "warehouse", env=env)
    assert marker.returncode == 9 and "was deleted" in marker.stderr
    unknown = run_cdc("get", name, "5", "--store", "nope", env=env)
    assert unknown.returncode == 2 and "unknown store nope" in unknown.stderr

    # drift injected behind the pipeline's back, one kind per store
    from delta.tables import DeltaTable

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    delta = DeltaTable.forPath(spark, current_path(warehouse_root(settings), table))
    delta.update("id = 7", {"name": "'tampered'"})
    # the pipeline's placeholder, as if one had leaked into the warehouse
    own = recorded_placeholder(dsn, settings.pipeline.name)
    delta.update("id = 10", {"name": f"'{own}'"})
    delta.update("id = 11", {"price": "price + 100"})  # and the sum of prices with it
    from opensearchpy import OpenSearch

    OpenSearch(hosts=[settings.opensearch.url]).delete(
        index=index_name(settings.pipeline.topic_prefix, table), id='{"id":8}', refresh=True
    )
    cache = redis.Redis.from_url(settings.redis.url)
    cache.hset(cache_key(settings.pipeline.topic_prefix, table, '{"id":9}'), "price", "0.00")

    def drifts() -> list[Drift]:
        return verify(settings, [info], ["cache", "search", "warehouse"], rounds=1)

    drift = {d.store: d for d in drifts()}
    assert drift["warehouse"].different == ['{"id":10}', '{"id":11}', '{"id":7}']
    assert drift["warehouse"].missing == []
    assert (drift["search"].missing, drift["search"].different) == (['{"id":8}'], [])
    assert (drift["cache"].different, drift["cache"].extra) == (['{"id":9}'], [])
    reported = run_cdc("verify", "--table", name, "-o", "json", env=env)
    assert reported.returncode == 1, reported.stderr
    document = json.loads(reported.stdout)
    assert ['{"id":8}'] in [r["missing"] for r in document["results"]]
    failed = [e for e in document["expectations"] if not e["ok"]]
    assert [(e["expectation"], e["column"]) for e in failed] == [
        ("expect_column_values_to_not_be_in_set", "name"),
        ("row count and sums equal PostgreSQL's", None),
    ]
    # the aggregates, computed by one suite on PostgreSQL and on the warehouse
    assert failed[1]["observed"].startswith("sum(price) ")
    assert "in PostgreSQL" in failed[1]["observed"]

    # a key only a store has (no such row in the source) is drift too
    cache.hset(cache_key(settings.pipeline.topic_prefix, table, '{"id":5000}'), "name", "x")
    drift = {d.store: d for d in verify(settings, [info], ["cache"])}
    assert drift["cache"].extra == ['{"id":5000}']

    # --repair: the drifted keys are backfilled through the log, the extra one removed;
    # one more extra key (5001) is inserted in the source after verify found it, before
    # the repair: it is backfilled, never removed
    cache.hset(cache_key(settings.pipeline.topic_prefix, table, '{"id":5001}'), "name", "x")
    found = drifts()
    assert {d.store: d.extra for d in found}["cache"] == ['{"id":5000}', '{"id":5001}']
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {name} (id, name) VALUES (5001, 'real now')")
    done = repair(settings, [info], found)
    assert any("backfilled 6 keys" in line for line in done), done
    assert any("removed 1 keys only cache had" in line for line in done), done
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    kept = cache.hget(cache_key(settings.pipeline.topic_prefix, table, '{"id":5001}'), "name")
    assert kept == b"real now"
    clean = run_cdc("verify", "--table", name, "-o", "json", env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    document = json.loads(clean.stdout)
    # key unique, key not null, no placeholder in name and attrs, row count = source;
    # the history's four invariants; the aggregates equal PostgreSQL's
    assert document["ok"] and len(document["expectations"]) == 5 + 4 + 1
    aggregates = document["expectations"][-1]
    assert aggregates["ok"] and aggregates["observed"].startswith("rows 190, sum(id) ")


def test_verify_reads_every_key_type_as_the_log_keys_it(captured: Capture) -> None:
    """Keys of date, timestamp, timestamptz, bytea, real, numeric and uuid: verify finds the
    stores in sync (no row both missing and extra), and --repair removes nothing the source
    has; a key only a store has is still found and removed."""
    t = captured(
        "CREATE TABLE {name} (d date, ts timestamp(3), tz timestamptz, b bytea, r real, "
        "n numeric(8,2), u uuid, body text, PRIMARY KEY (d, ts, tz, b, r, n, u))",
        "INSERT INTO {name} SELECT date '2024-02-29' + g, "
        "timestamp '2024-02-29 12:34:56.789' + g * interval '1 minute', "
        "timestamptz '2024-02-29 12:34:56.123456+05:30' + g * interval '1 second', "
        "decode(md5(g::text), 'hex'), g / 10.0, g * 1.25, md5(g::text)::uuid, 'v' || g "
        "FROM generate_series(1, 30) g",
        prefix="keys",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    stores = ["cache", "search", "warehouse"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'changed' WHERE r < 1")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, stores, once=True)
    info = table_info(settings, table)
    results = verify(settings, [info], stores, timeout=60)
    assert [(d.store, d.ok, d.store_rows) for d in results] == [(s, True, 30) for s in stores], [
        (d.store, d.missing[:2], d.extra[:2], d.different[:2]) for d in results
    ]
    # a key's name in the stores, as PostgreSQL writes it from the key's values (a few
    # keys are read by it), is each row's hash tail in the cache and document id in the
    # index, read by the tests' own readers
    with psycopg.connect(dsn) as conn:
        names = store_names(conn, info, sorted(source_rows(settings, info)))
    assert len(names) == 30
    assert set(names.values()) == set(cache_hashes(settings, table))
    assert set(names.values()) == set(search_documents(settings, table))

    # a row only the cache holds (written behind the pipeline's back): found, removed
    client = redis.Redis.from_url(settings.redis.url)
    ghost = cache_key(
        settings.pipeline.topic_prefix,
        table,
        '{"d":0,"ts":0,"tz":"1970-01-01T00:00:00Z","b":"AA==","r":0.5,"n":"1.00",'
        '"u":"b68a35a7-17ad-35b3-af2a-ae46edb4545a"}',
    )
    client.hset(ghost, mapping={"body": "ghost", "_commit_lsn": "1", "_lsn": "1"})
    drifts = verify(settings, [info], stores, timeout=60)
    # found by the first comparison, which reads every name, and still found by its
    # looks again at it, which read the keys it names (cdc/check/keyed.py): the ghost's
    # name is not the one PostgreSQL writes for its key
    assert [(d.store, len(d.extra), len(d.missing)) for d in drifts if not d.ok] == [
        ("cache", 1, 0)
    ]
    repair(settings, [info], drifts)
    assert not client.exists(ghost)
    for after in (
        verify(settings, [info], stores, timeout=60, again=drifts),
        verify(settings, [info], stores, timeout=60),
    ):
        assert [(d.store, d.ok, d.store_rows) for d in after] == [(s, True, 30) for s in stores]


@pytest.mark.long
def test_verify_checks_the_history(captured: Capture) -> None:
    """A warehouse history broken behind the pipeline's back (with a Delta writer of the
    test's own) fails `cdc verify`, naming each broken invariant of the versions as
    readers derive their ends: a change taken twice, a live row whose version is not
    open, a key with two open versions, a version that ends before it begins; the
    history as the apply job wrote it passes."""
    import datetime as dt

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from cdc.core.spark import spark_session
    from cdc.stores.warehouse.tables import history_path

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} SELECT g, 'v0' FROM generate_series(1, 20) g",
        prefix="hist",
    )
    name, table, settings, dsn, env = t.name, t.table, t.settings, t.dsn, t.env
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1' WHERE id <= 5")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, ["warehouse"], once=True)
    fine = run_cdc("verify", "--store", "warehouse", "-o", "json", env=env)
    assert fine.returncode == 0, fine.stdout[-2000:] + fine.stderr[-2000:]
    checked = {c["expectation"] for c in json.loads(fine.stdout)["expectations"]}
    assert {
        "history: no two versions of a key at one position",
        "history: at most one open version per key",
        "history: every live row's version is open",
        "history: no version ends before it begins",
    } <= checked, checked
    # the cut marked itself in the log (the connector confirms its position at once);
    # the apply job reads no such topic
    from cdc.core.topics import CUT_MESSAGE_PREFIX, read_topic

    markers = read_topic(settings.kafka, f"{settings.pipeline.topic_prefix}.message")
    assert any(
        (r.value or {}).get("message", {}).get("prefix") == CUT_MESSAGE_PREFIX for r in markers
    ), markers

    spark = spark_session(settings, "test-verify-history")
    path = history_path(warehouse_root(settings), table)
    schema = spark.read.format("delta").load(path).schema

    def newest(key: int) -> dict[str, Any]:
        """The key's newest version row as written (its update: ids 1 to 5 have one)."""
        history = spark.read.format("delta").load(path)
        row = (
            history.where(f"id = {key}")
            .orderBy(F.desc("_cdc_commit_lsn"), F.desc("_cdc_lsn"))
            .first()
        )
        assert row is not None and row["_cdc_op"] == "u", row
        return row.asDict()

    def append(rows: list[dict[str, Any]]) -> None:
        """History rows (absent columns NULL) appended as the apply job appends them."""
        values = [tuple(r.get(f.name) for f in schema.fields) for r in rows]
        spark.createDataFrame(values, schema).write.format("delta").mode("append").save(path)

    one, two, three = newest(1), newest(2), newest(3)
    # key 1's newest change taken a second time (delivered again at a later offset)
    append([{**one, "_cdc_offset": one["_cdc_offset"] + 1000}])
    broken = run_cdc("verify", "--store", "warehouse", "-o", "json", env=env)
    assert broken.returncode == 1, broken.stdout[-2000:] + broken.stderr[-2000:]
    failed = [c for c in json.loads(broken.stdout)["expectations"] if not c["ok"]]
    assert [(c["expectation"], c["observed"]) for c in failed] == [
        ("history: no two versions of a key at one position", "1 versions taken twice"),
    ], failed

    # key 2's newest version lost: its live row's version (the update) is open nowhere
    DeltaTable.forPath(spark, path).delete(
        f"id = 2 AND _cdc_commit_lsn = {two['_cdc_commit_lsn']} AND _cdc_lsn = {two['_cdc_lsn']}"
    )
    # a version after key 3's newest stamped with no commit time: it has no start, so
    # the version before it never ends either, and the key has two open versions
    append([{**three, "_cdc_commit_lsn": three["_cdc_commit_lsn"] + 1, "_cdc_commit_ts": None}])
    # key 99 (never in the source): three versions around two TRUNCATEs, all before
    # every change of the log; the second TRUNCATE's commit time a day before the first
    # version's, so that version ends (where the next begins) before it begins
    at = one["_cdc_commit_ts"]
    planted = {"id": 99, "body": "planted", "_cdc_op": "u", "_cdc_offset": 0, "_cdc_lsn": 1}
    truncate = {"_cdc_op": "t", "_cdc_lsn": 1}
    append(
        [
            {**planted, "_cdc_commit_lsn": 1, "_cdc_commit_ts": at},
            {**truncate, "_cdc_commit_lsn": 2, "_cdc_commit_ts": at},
            {**planted, "_cdc_commit_lsn": 3, "_cdc_commit_ts": at},
            {**truncate, "_cdc_commit_lsn": 4, "_cdc_commit_ts": at - dt.timedelta(days=1)},
            {**planted, "_cdc_commit_lsn": 5, "_cdc_commit_ts": at},
        ]
    )
    broken = run_cdc("verify", "--store", "warehouse", "-o", "json", env=env)
    assert broken.returncode == 1, broken.stdout[-2000:] + broken.stderr[-2000:]
    failed = [c for c in json.loads(broken.stdout)["expectations"] if not c["ok"]]
    assert [(c["expectation"], c["observed"]) for c in failed] == [
        ("history: no two versions of a key at one position", "1 versions taken twice"),
        ("history: at most one open version per key", "1 keys with several"),
        ("history: every live row's version is open", "1 live rows without"),
        ("history: no version ends before it begins", "1 versions"),
    ], failed


def test_verify_compares_json_text_and_reals_exactly(captured: Capture) -> None:
    """`json` text is data (spaces, key order, a repeated key), `jsonb` keeps its number's
    every digit, and a real differs in its last bit: a store holding the value re-written
    (parsed and printed again, or a real's next float) is drift."""
    from pyspark.sql import SparkSession

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, j json, jb jsonb, r real)",
        """INSERT INTO {name} VALUES
            (1, '{"b":1,  "a" : [1,2], "b": 3}', '{"x": 0.12345678901234567890}', 1.1),
            (2, '[1, {"z": null}]', '{"x": 1}', 1.1)""",
        prefix="exact",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    stores = ["cache", "search", "warehouse"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {name} SELECT 3, j, jb, r FROM {name} WHERE id = 1")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, stores, once=True)
    info = table_info(settings, table)
    results = verify(settings, [info], stores, timeout=60)
    assert [(d.store, d.ok) for d in results] == [(s, True) for s in stores], [
        (d.store, d.different) for d in results
    ]
    # the cache holds PostgreSQL's text, as Debezium sent it
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    key = cache_key(settings.pipeline.topic_prefix, table, '{"id":3}')
    assert client.hget(key, "j") == '{"b":1,  "a" : [1,2], "b": 3}'
    assert client.hget(key, "jb") == '{"x": 0.12345678901234567890}'

    # behind the pipeline's back: values parsed and printed again, a real's next float
    client.hset(key, "j", json.dumps(json.loads('{"b":1,  "a" : [1,2], "b": 3}')))
    one = cache_key(settings.pipeline.topic_prefix, table, '{"id":1}')
    client.hset(one, "jb", json.dumps({"x": 0.12345678901234567890}))
    spark = SparkSession.getActiveSession()
    assert spark is not None
    path = current_path(warehouse_root(settings), table)
    spark.sql(f"UPDATE delta.`{path}` SET r = CAST(1.1000001 AS FLOAT) WHERE id = 2")
    drift = {d.store: d for d in verify(settings, [info], stores, timeout=60)}
    assert drift["cache"].different == ['{"id":1}', '{"id":3}']
    assert drift["warehouse"].different == ['{"id":2}']
    assert drift["search"].ok


@pytest.mark.long
def test_a_table_named_with_a_dot_is_queried_in_backquotes_beside_the_others(
    captured: Capture,
) -> None:
    """`cdc query` registers each table as one identifier: a captured `public."x.ird"`
    broke every query of the pipeline (TEMP_VIEW_NAME_TOO_MANY_NAME_PARTS)."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        "INSERT INTO {name} VALUES (1, 'plain')",
        'CREATE TABLE "{name}.ird" (id int PRIMARY KEY, v text)',
        """INSERT INTO "{name}.ird" VALUES (7, 'dotted')""",
        prefix="dot",
        tables=("public.{name}", "public.{name}.ird"),
    )
    run_apply(t.settings, ["warehouse"], once=True)
    plain = run_cdc("query", f"SELECT v FROM {t.name}", "-o", "json", env=t.env)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == [{"v": "plain"}]
    odd = run_cdc("query", f"SELECT id, v FROM `{t.name}.ird`", "-o", "json", env=t.env)
    assert odd.returncode == 0, odd.stderr
    assert json.loads(odd.stdout) == [{"id": 7, "v": "dotted"}]


def test_a_value_verify_cannot_read_is_one_line(captured: Capture) -> None:
    """An infinite timestamp has no Python form: verify says so in one line naming the
    table (VerifyError, exit 10 at the command line), not with a traceback."""
    from cdc.core.errors import VerifyError

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, at timestamp)",
        "INSERT INTO {name} VALUES (1, '2026-01-01'), (2, 'infinity')",
        prefix="unread",
    )
    run_apply(t.settings, ["cache"], once=True)
    with pytest.raises(VerifyError) as raised:
        verify(t.settings, [table_info(t.settings, t.table)], ["cache"], timeout=60)
    line = str(raised.value)
    assert "\n" not in line and t.table in line and "cannot read" in line, line
