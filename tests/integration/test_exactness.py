"""Every guard acts: changes Debezium delivers again (at new offsets, after newer ones) and
older changes arriving after newer ones change nothing in any store, and add no history
version. The stores are read with readers of this test's own (redis-py hashes,
OpenSearch documents over HTTP, the Delta files through a Spark reader)."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
import redis
import requests
from kafka import KafkaProducer

from cdc.apply.job import run_apply
from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings.connections import KafkaSettings
from cdc.core.topics import change_topic
from tests.conftest import Capture
from tests.contents import topic_records
from tests.helpers import recorded_placeholder, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.stores import cache, history_with_ends, search, warehouse_frame

pytestmark = pytest.mark.integration


def deliver_again(kafka: KafkaSettings, topic: str, records: list) -> None:  # type: ignore[type-arg]
    """What Debezium does after a crash: the same events again, at new offsets."""
    producer = KafkaProducer(**kafka_client_kwargs(kafka), acks="all")
    for r in records:
        producer.send(topic, key=r.key, value=r.value, partition=r.partition).get(timeout=30)
    producer.close()


def redis_rows(settings, table: str) -> dict[int, str]:  # type: ignore[no-untyped-def]
    return {k: row["body"] for k, row in cache(settings, table).items()}


def search_rows(settings, table: str) -> dict[int, str]:  # type: ignore[no-untyped-def]
    return {k: row["body"] for k, row in search(settings, table).items()}


def delta_frames(settings, table: str):  # type: ignore[no-untyped-def]
    return warehouse_frame(settings, table), warehouse_frame(settings, table, history=True)


def source(dsn: str, name: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT id, body FROM {name}").fetchall())  # type: ignore[arg-type]


# a small batch of the cache and the search index is written by the driver, a larger one
# by Spark's Python workers (apply.driver_batch_events), in one task per topic partition
# or shuffled by key into more (apply.row_store_tasks, off unless set: in test-long, and
# under load in the cluster profile in test-scale): every path keeps every guard
@pytest.mark.parametrize(
    ("driver_batch_events", "row_store_tasks"),
    [
        pytest.param(10_000, 0, id="driver"),
        pytest.param(0, 0, id="workers"),
        pytest.param(0, 3, id="shuffled", marks=pytest.mark.long),
    ],
)
def test_redelivered_and_older_changes_change_nothing(
    captured: Capture, driver_batch_events: int, row_store_tasks: int
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} SELECT g, 'v0' FROM generate_series(1, 20) g",
        prefix="exact",
    )
    name, table, dsn = t.name, t.table, t.dsn
    settings = t.settings.model_copy(
        update={
            "apply": t.settings.apply.model_copy(
                update={
                    "driver_batch_events": driver_batch_events,
                    "row_store_tasks": row_store_tasks,
                }
            )
        }
    )
    kafka = settings.kafka
    topic = change_topic(settings.pipeline, table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1' WHERE id <= 10")
        conn.execute(f"UPDATE {name} SET body = 'v2' WHERE id <= 5")
        with conn.transaction():  # two changes of a key in one transaction
            conn.execute(f"UPDATE {name} SET body = 'v3a' WHERE id = 6")
            conn.execute(f"UPDATE {name} SET body = 'v3b' WHERE id = 6")
        conn.execute(f"DELETE FROM {name} WHERE id IN (11, 12)")
        conn.execute(f"INSERT INTO {name} VALUES (30, 'new')")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    expected = source(dsn, name)
    assert redis_rows(settings, table) == expected
    assert search_rows(settings, table) == expected
    _, history = delta_frames(settings, table)
    versions = history.count()
    assert versions == 20 + 10 + 5 + 2 + 2 + 1

    # a delete applied in a later batch than the row it deletes
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {name} WHERE id = 20")
    wait_until_equal(settings, table_info(settings, table))
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    expected = source(dsn, name)
    versions += 1
    assert 20 not in expected and redis_rows(settings, table) == expected
    assert search_rows(settings, table) == expected
    current, history = delta_frames(settings, table)
    live = current.select("id", "body").collect()
    assert {r["id"]: r["body"] for r in live} == expected
    assert current.count() == len(expected)  # the deleted keys' rows are gone
    for deleted in (11, 12, 20):  # their newest versions are deletes
        chain = history.where(f"id = {deleted}").orderBy("_cdc_commit_lsn", "_cdc_lsn")
        assert chain.collect()[-1]["_cdc_op"] == "d"

    records = topic_records(kafka, topic)
    by_key: dict[int, list] = {}  # type: ignore[type-arg]
    for r in records:
        by_key.setdefault(json.loads(r.key)["id"], []).append(r)
    # older changes, alone in a batch after the newer ones were applied: key 1's first
    # update (live key), key 11's snapshot row (deleted key), key 6's first change of
    # its two-change transaction
    older = [by_key[1][1], by_key[11][0], by_key[6][2]]
    assert json.loads(older[2].value)["after"]["body"] == "v3a"

    def applied_again(records: list) -> Any:  # type: ignore[type-arg]
        """Deliver `records` again, apply them: every store still equals the source,
        and nothing delivered again is a new version. Returns the history."""
        deliver_again(kafka, topic, records)
        run_apply(settings, ["cache", "search", "warehouse"], once=True)
        assert redis_rows(settings, table) == expected
        assert search_rows(settings, table) == expected
        current, history = delta_frames(settings, table)
        live = current.select("id", "body").collect()
        assert {r["id"]: r["body"] for r in live} == expected
        assert current.count() == len(expected)  # no deleted key came back
        assert history.count() == versions
        return history

    applied_again(older)
    # Debezium after a crash: everything from some point on, again, in order
    history = applied_again(records[len(records) // 3 :])
    assert history.select("id", "_cdc_commit_lsn", "_cdc_lsn").distinct().count() == versions
    # the versions' ends as the test derives them: each live row is its key's open
    # version (same position, same values), and a deleted key's open version its delete
    ended = history_with_ends(settings, table)
    assert ended.count() == versions
    opened = ended.where("valid_to IS NULL").collect()
    current, _ = delta_frames(settings, table)
    assert sorted(
        (r["id"], r["body"], r["_cdc_commit_lsn"], r["_cdc_lsn"])
        for r in opened
        if r["_cdc_op"] != "d"
    ) == sorted(
        (r["id"], r["body"], r["_cdc_commit_lsn"], r["_cdc_lsn"]) for r in current.collect()
    )
    assert sorted(r["id"] for r in opened if r["_cdc_op"] == "d") == [11, 12, 20]
    key6 = history.where("id = 6").orderBy("_cdc_commit_lsn", "_cdc_lsn").collect()
    assert [r["body"] for r in key6] == ["v0", "v1", "v3a", "v3b"]


def test_a_stored_toasted_value_is_kept_across_batches(captured: Capture) -> None:
    """An update of another column arrives with Debezium's placeholder for the unchanged
    TOASTed value, in a batch after the one that wrote the value: every store keeps it,
    and the history version of the update carries it."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text, big text)",
        "ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO {name} SELECT g, 'v0', repeat(md5(g::text), 400) FROM generate_series(1, 5) g",
        prefix="toast",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1'")
    kafka, topic = settings.kafka, change_topic(settings.pipeline, table)
    deadline = time.monotonic() + 60
    while True:
        updates = [
            json.loads(r.value)
            for r in topic_records(kafka, topic)
            if r.value and json.loads(r.value)["op"] == "u"
        ]
        if len(updates) == 5 or time.monotonic() > deadline:
            break
        time.sleep(1)
    own = recorded_placeholder(dsn, settings.pipeline.name)  # the pipeline's connector's
    assert [u["after"]["big"] for u in updates] == [own] * 5
    run_apply(settings, ["cache", "search", "warehouse"], once=True)

    with psycopg.connect(dsn) as conn:
        expected = {
            r[0]: (r[1], r[2]) for r in conn.execute(f"SELECT id, body, big FROM {name}").fetchall()
        }
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    cached = {
        json.loads(k[len(prefix) :])["id"]: (client.hget(k, "body"), client.hget(k, "big"))
        for k in client.scan_iter(match=prefix + "*")
    }
    assert cached == expected
    index = f"{settings.pipeline.topic_prefix}.{table}".lower()
    url = settings.opensearch.url
    requests.post(f"{url}/{index}/_refresh", timeout=30).raise_for_status()
    hits = requests.post(f"{url}/{index}/_search", json={"size": 100}, timeout=30).json()
    found = {
        h["_source"]["id"]: (h["_source"]["body"], h["_source"]["big"])
        for h in hits["hits"]["hits"]
    }
    assert found == expected
    current, history = delta_frames(settings, table)
    rows = current.select("id", "body", "big").collect()
    assert {r["id"]: (r["body"], r["big"]) for r in rows} == expected
    updated = history.where("_cdc_op = 'u'").select("id", "body", "big").collect()
    assert {r["id"]: (r["body"], r["big"]) for r in updated} == expected


def test_dead_letters_are_listed_and_replayed(captured: Capture) -> None:
    """A poison record (not a Debezium envelope) goes to the dead-letter topic, the batch
    goes on; `cdc dlq list` shows it, and `cdc dlq replay` backfills its key, so the store
    takes the source's row."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} SELECT g, 'v0' FROM generate_series(1, 3) g",
        prefix="dlq",
    )
    name, table, settings, dsn, env = t.name, t.table, t.settings, t.dsn, t.env
    run_apply(settings, ["cache"], once=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1' WHERE id = 2")
    kafka, topic = settings.kafka, change_topic(settings.pipeline, table)
    deadline = time.monotonic() + 60
    while not any(r.value and b'"v1"' in r.value for r in topic_records(kafka, topic)):
        assert time.monotonic() < deadline, "the update never reached the log"
        time.sleep(1)
    key = next(r for r in topic_records(kafka, topic) if json.loads(r.key)["id"] == 2)
    poison = type(key)(**{**key._asdict(), "value": b"not json at all"})
    deliver_again(kafka, topic, [poison])
    run_apply(settings, ["cache"], once=True)  # the batch goes on past the poison

    listed = run_cdc("dlq", "list", "-o", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)
    assert [(x["store"], x["key"], x["error"]) for x in letters] == [
        ("cache", key.key.decode(), "not a change event")
    ]
    # what the poison stood for is not in the cache (here: drifted behind its back)
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    client.hset(f"{settings.pipeline.topic_prefix}:{table}:" + '{"id":2}', "body", "lost")
    assert redis_rows(settings, table) != source(dsn, name)
    replayed = run_cdc("dlq", "replay", "--store", "cache", env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert "1 key(s) backfilled" in replayed.stderr

    def backfilled() -> bool:
        return any(
            r.value and b'"incremental"' in r.value and json.loads(r.key)["id"] == 2
            for r in topic_records(kafka, topic)
        )

    deadline = time.monotonic() + 60
    while not backfilled():  # Debezium's chunk may reach the topic after its notice
        assert time.monotonic() < deadline, "the backfilled row never reached the log"
        time.sleep(1)
    run_apply(settings, ["cache"], once=True)
    assert redis_rows(settings, table) == source(dsn, name)
    again = run_cdc("dlq", "replay", "--store", "cache", env=env)
    assert "no dead letters to replay" in again.stderr
