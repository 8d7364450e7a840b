"""Edge cases in every store: TOAST placeholders, primary-key changes, schema changes."""

from __future__ import annotations

import io
import time
import uuid

import psycopg
import pytest
import redis
from rich.console import Console

from cdc.pipeline import drop_pipeline
from cdc.topics import read_topic
from materializers.apply import run_apply
from snapshot.initial import run_snapshot
from tests.conftest import RunningStack
from tests.integration.test_apply import (
    cache_contents,
    expected_cache,
    expected_search,
    search_contents,
)
from tests.logcheck import pipeline_for

pytestmark = pytest.mark.integration


def warehouse_rows(settings, table: str, columns: list[str]) -> dict:  # type: ignore[no-untyped-def]
    from cdc.spark import spark_session
    from materializers.apply import warehouse_root
    from materializers.stores.warehouse import current_path

    spark = spark_session(settings, "test")
    frame = spark.read.format("delta").load(current_path(warehouse_root(settings), table))
    return {
        r["id"]: tuple(r[c] for c in columns) for r in frame.where("NOT _cdc_deleted").collect()
    }


def source_tuples(settings, table: str, columns: list[str]) -> dict:  # type: ignore[no-untyped-def]
    with psycopg.connect(settings.postgres.dsn()) as conn:
        cols = ", ".join(columns)
        return {
            r[0]: tuple(r[1:]) for r in conn.execute(f"SELECT id, {cols} FROM {table}").fetchall()
        }


def test_toast_placeholders_key_changes_and_new_columns(stack: RunningStack) -> None:
    name = "edge_" + uuid.uuid4().hex[:8]
    table = f"public.{name}"
    settings = pipeline_for(stack.settings, [table])
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, qty int, big text)")
        conn.execute(f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL")  # no compression
        conn.execute(
            f"INSERT INTO {name} SELECT g, g, repeat(md5(g::text), 400) "
            "FROM generate_series(1, 20) g"
        )
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        with psycopg.connect(dsn, autocommit=True) as conn:
            # big is TOASTed and unchanged: Debezium sends a placeholder for it
            conn.execute(f"UPDATE {name} SET qty = qty + 100 WHERE id <= 10")
            # a primary-key change: a delete of the old key and a create of the new one
            conn.execute(f"UPDATE {name} SET id = 1000 WHERE id = 20")
            # a column added in PostgreSQL, then filled
            conn.execute(f"ALTER TABLE {name} ADD COLUMN note text")
            conn.execute(f"UPDATE {name} SET note = 'n' || id WHERE id BETWEEN 11 AND 15")

        def placeholders() -> int:
            found = read_topic(settings.kafka.bootstrap_servers, settings.pipeline.topic(table))
            return sum(
                1
                for r in found
                if r.value
                and r.value["op"] == "u"
                and r.value["after"].get("big") == "__debezium_unavailable_value"
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
        assert (
            len(client.hget(f'{settings.pipeline.topic_prefix}:{table}:{{"id":1}}', "big")) == 12800
        )
    finally:
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


def test_a_poison_event_goes_to_the_dead_letter_topic_and_the_pipeline_goes_on(
    stack: RunningStack,
) -> None:
    from kafka import KafkaProducer

    from cdc.pipeline import pipeline_status
    from materializers.apply import dead_letter_topic

    name = "poison_" + uuid.uuid4().hex[:8]
    table = f"public.{name}"
    settings = pipeline_for(stack.settings, [table])
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, qty int)")
        conn.execute(f"INSERT INTO {name} SELECT g, g FROM generate_series(1, 50) g")
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        producer = KafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        sent = producer.send(
            settings.pipeline.topic(table), key=b'{"id":7}', value=b"\x00 not json {"
        ).get(timeout=30)
        producer.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {name} SET qty = -qty WHERE id <= 5")
        deadline = time.monotonic() + 60
        topic = settings.pipeline.topic(table)

        def updates() -> int:  # the poison record is not JSON: look at bytes only
            found = read_topic(settings.kafka.bootstrap_servers, topic)
            return sum(1 for r in found if b'"op":"u"' in (r.value_bytes or b""))

        while updates() < 5:
            assert time.monotonic() < deadline
            time.sleep(1)
        run_apply(settings, ["cache", "search", "warehouse"], once=True)

        assert cache_contents(settings, table) == expected_cache(settings, table)
        assert search_contents(settings, table) == expected_search(settings, table)
        assert warehouse_rows(settings, table, ["qty"]) == source_tuples(settings, table, ["qty"])
        letters = [
            r.value
            for r in read_topic(settings.kafka.bootstrap_servers, dead_letter_topic(settings))
        ]
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
    finally:
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
