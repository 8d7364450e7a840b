"""What the stores should hold (the source in each store's terms), and what the source and a
topic hold, read for tests that share them (the stores themselves: tests/stores.py)."""

from __future__ import annotations

import json

import psycopg
from kafka import KafkaConsumer, TopicPartition

from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings.connections import KafkaSettings
from cdc.types.store_forms import cache_text, plain_value
from tests.logcheck import source_rows, table_info


def expected_cache(settings, table: str) -> dict[str, dict[str, str]]:  # type: ignore[no-untyped-def]
    """The source table in the cache's terms."""
    info = table_info(settings, table)
    return {
        json.dumps(dict(zip(info.key, key, strict=True)), separators=(",", ":")): {
            name: cache_text(value) for name, value in row.items() if value is not None
        }
        for key, row in source_rows(settings, info).items()
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
