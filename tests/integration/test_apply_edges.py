"""Edge cases in every store: TOAST placeholders, primary-key changes, schema changes."""

from __future__ import annotations

import time

import psycopg
import pytest
import redis

from cdc.apply.job import run_apply
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.source_setup import TRUNCATE_TRIGGER, TRUNCATIONS_TABLE
from cdc.check.rebuild import reset_store
from cdc.core.clients import kafka_client_kwargs
from cdc.core.topics import change_topic, read_topic
from tests.conftest import Capture
from tests.contents import expected_cache, expected_search, source_tuples
from tests.helpers import recorded_placeholder
from tests.logcheck import poll
from tests.stores import cache_contents, history_with_ends, search_contents, warehouse_rows

pytestmark = pytest.mark.integration


def test_toast_placeholders_key_changes_and_schema_changes(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, qty int, big text)",
        "ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",  # no compression
        "INSERT INTO {name} SELECT g, g, repeat(md5(g::text), 400) FROM generate_series(1, 20) g",
        prefix="edge",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        # big is TOASTed and unchanged: Debezium sends a placeholder for it
        conn.execute(f"UPDATE {name} SET qty = qty + 100 WHERE id <= 10")
        # a primary-key change: a delete of the old key and a create of the new one
        conn.execute(f"UPDATE {name} SET id = 1000 WHERE id = 20")
        # a column added in PostgreSQL, then filled
        conn.execute(f"ALTER TABLE {name} ADD COLUMN note text")
        conn.execute(f"UPDATE {name} SET note = 'n' || id WHERE id BETWEEN 11 AND 15")

    own = recorded_placeholder(dsn, settings.pipeline.name)  # the pipeline's connector's

    def placeholders() -> int:
        found = read_topic(settings.kafka, change_topic(settings.pipeline, table))
        return sum(
            1
            for r in found
            if r.value and r.value["op"] == "u" and r.value["after"].get("big") == own
        )

    deadline = time.monotonic() + 60
    while placeholders() < 10 and time.monotonic() < deadline:
        time.sleep(1)
    assert placeholders() >= 10  # the case under test really happens
    time.sleep(3)
    run_apply(settings, ["cache", "search", "warehouse"], once=True)

    # The row whose key changed arrives as a create whose unchanged TOASTed value is
    # a placeholder: under REPLICA IDENTITY DEFAULT no event carries that value, so
    # the stores leave it unset (never the placeholder) until the row's next full write.
    moved = '{"id":1000}'
    cache, search = expected_cache(settings, table), expected_search(settings, table)
    del cache[moved]["big"]
    search[moved]["big"] = None
    search_now = search_contents(settings, table)
    for doc in search_now.values():  # documents written before `note` existed lack it
        for column in ("big", "note"):
            doc.setdefault(column, None)
    assert cache_contents(settings, table) == cache
    assert search_now == search
    columns = ["qty", "big", "note"]
    source = source_tuples(settings, table, columns)
    source[1000] = (source[1000][0], None, source[1000][2])
    assert warehouse_rows(settings, table, columns) == source
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    assert len(client.hget(f'{settings.pipeline.topic_prefix}:{table}:{{"id":1}}', "big")) == 12800

    # a type widened and a column dropped in PostgreSQL, capture running throughout
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {name} ALTER COLUMN qty TYPE bigint")
        conn.execute(f"UPDATE {name} SET qty = 5000000000 WHERE id = 2")
        conn.execute(f"ALTER TABLE {name} DROP COLUMN note")
        conn.execute(f"UPDATE {name} SET qty = qty + 1 WHERE id = 11")
        conn.execute(f"INSERT INTO {name} (id, qty, big) VALUES (2000, 7, 'x')")
    poll(
        lambda: any(
            b'"id":2000' in (r.key_bytes or b"")
            for r in read_topic(settings.kafka, change_topic(settings.pipeline, table))
        ),
        60,
        "the changes after the schema changes in the log",
    )
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    rows = warehouse_rows(settings, table, ["qty", "note"])
    assert rows[2] == (5000000000, None) and rows[2000] == (7, None)
    assert rows[11] == (12, None)  # a dropped column holds no value in a live row
    search_now = search_contents(settings, table)
    assert search_now['{"id":2}']["qty"] == 5000000000
    assert "note" not in search_now['{"id":11}']  # documents are rewritten whole
    prefix = settings.pipeline.topic_prefix
    assert client.hget(f'{prefix}:{table}:{{"id":2}}', "qty") == "5000000000"
    assert client.hget(f'{prefix}:{table}:{{"id":11}}', "note") is None
    assert client.hget(f'{prefix}:{table}:{{"id":11}}', "qty") == "12"


def test_a_poison_event_goes_to_the_dead_letter_topic_and_the_pipeline_goes_on(
    captured: Capture,
) -> None:
    from kafka import KafkaProducer

    from cdc.check.status import pipeline_status
    from cdc.core.topics import dead_letter_topic

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, qty int)",
        "INSERT INTO {name} SELECT g, g FROM generate_series(1, 50) g",
        prefix="poison",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    producer = KafkaProducer(**kafka_client_kwargs(settings.kafka))
    sent = producer.send(
        change_topic(settings.pipeline, table), key=b'{"id":7}', value=b"\x00 not json {"
    ).get(timeout=30)
    producer.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET qty = -qty WHERE id <= 5")
    deadline = time.monotonic() + 60
    topic = change_topic(settings.pipeline, table)

    def updates() -> int:  # the poison record is not JSON: look at bytes only
        found = read_topic(settings.kafka, topic)
        return sum(1 for r in found if b'"op":"u"' in (r.value_bytes or b""))

    while updates() < 5:
        assert time.monotonic() < deadline
        time.sleep(1)
    run_apply(settings, ["cache", "search", "warehouse"], once=True)

    assert cache_contents(settings, table) == expected_cache(settings, table)
    assert search_contents(settings, table) == expected_search(settings, table)
    assert warehouse_rows(settings, table, ["qty"]) == source_tuples(settings, table, ["qty"])
    letters = [r.value for r in read_topic(settings.kafka, dead_letter_topic(settings.pipeline))]
    assert len(letters) == 3  # one per store
    assert {(d["topic"], d["partition"], d["offset"]) for d in letters} == {
        (topic, sent.partition, sent.offset)
    }
    assert {d["store"] for d in letters} == {"cache", "search", "warehouse"}
    assert all(d["error"] for d in letters)
    status = pipeline_status(settings, [table])
    assert status.dead_letters == 3
    assert {s: v["backlog_events"] for s, v in status.stores.items()} == {
        "cache": 0,
        "search": 0,
        "warehouse": 0,
    }


def test_a_truncate_empties_the_table_in_every_store(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, qty int)",
        "INSERT INTO {name} SELECT g, g FROM generate_series(1, 40) g",
        prefix="trunc",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    stores = ["cache", "search", "warehouse"]
    run_apply(settings, stores, once=True)
    assert len(cache_contents(settings, table)) == 40
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET qty = 0 WHERE id <= 10")  # before the truncate
        conn.execute(f"TRUNCATE {name}")
        conn.execute("SELECT pg_sleep(1.5)")  # the two TRUNCATEs' times apart
        conn.execute(f"INSERT INTO {name} VALUES (5, 55), (100, 1)")  # after it
        with conn.transaction():  # inserts on both sides of a TRUNCATE in one transaction
            conn.execute(f"INSERT INTO {name} VALUES (200, 2)")
            conn.execute(f"TRUNCATE {name}")
            conn.execute(f"INSERT INTO {name} VALUES (5, 555), (300, 3)")
    kafka = settings.kafka
    truncations = change_topic(settings.pipeline, TRUNCATIONS_TABLE)
    poll(
        lambda: (
            sum(
                f'"{table}"'.encode() in (r.value_bytes or b"")
                for r in read_topic(kafka, truncations)
            )
            == 2
        ),
        60,
        "both TRUNCATEs as rows of cdc.truncations in the log",
    )
    poll(
        lambda: any(
            b'"id":300' in (r.key_bytes or b"")
            for r in read_topic(kafka, change_topic(settings.pipeline, table))
        ),
        60,
        "the rows inserted after the TRUNCATEs in the log",
    )
    run_apply(settings, stores, once=True)
    assert set(cache_contents(settings, table)) == {'{"id":5}', '{"id":300}'}
    assert cache_contents(settings, table) == expected_cache(settings, table)
    assert search_contents(settings, table) == expected_search(settings, table)
    assert warehouse_rows(settings, table, ["qty"]) == {5: (555,), 300: (3,)}
    # history (its ends as the test derives them): the truncated rows' versions are
    # closed; only the survivors are open
    open_versions = history_with_ends(settings, table).where("valid_to IS NULL")
    assert sorted(r["id"] for r in open_versions.collect()) == [5, 300]
    # ... and each closed one ends at the first TRUNCATE after it, not the last
    with psycopg.connect(dsn) as conn:
        first, second = (
            r[0].timestamp()
            for r in conn.execute(
                "SELECT truncated_at FROM cdc.truncations WHERE table_name = %s ORDER BY id",
                (table,),
            ).fetchall()
        )
    ends = {
        (r["id"], r["_cdc_op"]): r["valid_to"].timestamp()
        for r in history_with_ends(settings, table).where("valid_to IS NOT NULL").collect()
    }
    for key in (1, 2, 3, 4, 6, 7, 8, 9, 10):
        assert abs(ends[(key, "u")] - first) < 1, (key, ends[(key, "u")], first, second)
    for key in (100, 200):
        assert abs(ends[(key, "c")] - second) < 1, (key, ends[(key, "c")], first, second)
    # rebuilt from the log, the history ends its versions at the same TRUNCATEs (their
    # positions were kept without their times: the versions ended in 1970)
    reset_store(settings, "warehouse", [table], lambda _: None)
    run_apply(settings, ["warehouse"], once=True)
    rebuilt = {
        (r["id"], r["_cdc_op"]): r["valid_to"].timestamp()
        for r in history_with_ends(settings, table).where("valid_to IS NOT NULL").collect()
    }
    for key in (1, 2, 3, 4, 6, 7, 8, 9, 10):
        assert abs(rebuilt[(key, "u")] - first) < 1, (key, rebuilt[(key, "u")], first)
    assert warehouse_rows(settings, table, ["qty"]) == {5: (555,), 300: (3,)}

    def truncate_triggers() -> int:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname = %s AND tgrelid = %s::regclass",
                (TRUNCATE_TRIGGER, name),
            ).fetchone()
        return int(row[0]) if row else -1

    assert truncate_triggers() == 1
    drop_pipeline(settings)  # a table no pipeline captures loses the trigger
    assert truncate_triggers() == 0
