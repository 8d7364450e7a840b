"""What the stores, the source and a topic hold, read for tests that share them."""

from __future__ import annotations

import json

import psycopg
from kafka import KafkaConsumer, TopicPartition

from cdc.clients import kafka_client_kwargs
from cdc.settings import KafkaSettings
from materializers.stores.cache import cache_key, cache_text
from materializers.stores.search import index_name, plain_value
from tests.logcheck import source_rows, table_info
from tests.stores import opensearch_reader, redis_reader


def cache_contents(settings, table: str) -> dict[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    client = redis_reader(settings)
    prefix = cache_key(settings.pipeline.topic_prefix, table, "")
    rows = {}
    for key in client.scan_iter(match=prefix + "*", count=1000):
        entry = client.hgetall(key)
        if "_deleted" not in entry:
            rows[key[len(prefix) :]] = {k: v for k, v in entry.items() if not k.startswith("_")}
    return rows


def expected_cache(settings, table: str) -> dict[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    """The source table in the cache's terms."""
    info = table_info(settings, table)
    return {
        json.dumps(dict(zip(info.key, key, strict=True)), separators=(",", ":")): {
            name: cache_text(value) for name, value in row.items() if value is not None
        }
        for key, row in source_rows(settings, info).items()
    }


def search_contents(settings, table: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    from opensearchpy import helpers

    client = opensearch_reader(settings)
    index = index_name(settings.pipeline.topic_prefix, table)
    client.indices.refresh(index=index)
    return {
        hit["_id"]: {k: v for k, v in hit["_source"].items() if not k.startswith("_cdc")}
        for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}})
    }


def expected_search(settings, table: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    info = table_info(settings, table)

    def plain(value):  # type: ignore[no-untyped-def]
        return [plain(v) for v in value] if isinstance(value, list) else plain_value(value)

    return {
        json.dumps(dict(zip(info.key, key, strict=True)), separators=(",", ":")): {
            name: plain(value) for name, value in row.items()
        }
        for key, row in source_rows(settings, info).items()
    }


def warehouse_rows(settings, table: str, columns: list[str]) -> dict:  # type: ignore[no-untyped-def]
    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import current_path, warehouse_root

    spark = spark_session(settings, "test")
    frame = spark.read.format("delta").load(current_path(warehouse_root(settings), table))
    return {
        r["id"]: tuple(r[c] for c in columns) for r in frame.where("NOT _cdc_deleted").collect()
    }


def history_rows(settings, table: str):  # type: ignore[no-untyped-def]
    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import history_path, warehouse_root

    spark = spark_session(settings, "test")
    return spark.read.format("delta").load(history_path(warehouse_root(settings), table))


def source_tuples(settings, table: str, columns: list[str]) -> dict:  # type: ignore[no-untyped-def]
    with psycopg.connect(settings.postgres.dsn()) as conn:
        cols = ", ".join(columns)
        return {
            r[0]: tuple(r[1:]) for r in conn.execute(f"SELECT id, {cols} FROM {table}").fetchall()
        }


def topic_records(kafka: KafkaSettings, topic: str) -> list:  # type: ignore[type-arg]
    """Every record of the topic, in partition and offset order (kafka-python)."""
    consumer = KafkaConsumer(**kafka_client_kwargs(kafka), enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    ends = consumer.end_offsets(parts)
    records = []
    while any(consumer.position(p) < ends[p] for p in parts):
        for batch in consumer.poll(timeout_ms=1000).values():
            records += batch
    consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))
