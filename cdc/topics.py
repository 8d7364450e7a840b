"""Reading change topics: every record from the start up to the current end."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

__all__ = ["ChangeRecord", "read_topic", "wait_for_records"]


@dataclass(frozen=True)
class ChangeRecord:
    """One record of a change topic: its position, key and Debezium envelope (None: tombstone)."""

    partition: int
    offset: int
    key_bytes: bytes | None
    value_bytes: bytes | None

    @property
    def key(self) -> Any:
        return json.loads(self.key_bytes) if self.key_bytes is not None else None

    @property
    def value(self) -> dict[str, Any] | None:
        return json.loads(self.value_bytes) if self.value_bytes is not None else None

    @property
    def op(self) -> str | None:
        """c, u, d, r, t — or None for a tombstone."""
        value = self.value
        return None if value is None else value.get("op")


def read_topic(bootstrap_servers: str, topic: str, timeout: float = 10.0) -> list[ChangeRecord]:
    """Every record of topic, partition by partition in offset order, up to its end now."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        consumer_timeout_ms=int(timeout * 1000),
        request_timeout_ms=30000,
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        records: list[ChangeRecord] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                break
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records += [ChangeRecord(tp.partition, r.offset, r.key, r.value) for r in batch]
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def wait_for_records(
    bootstrap_servers: str, topic: str, count: int, timeout: float = 60.0
) -> list[ChangeRecord]:
    """Read topic until it holds at least count records (or timeout: returns what it has)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_topic(bootstrap_servers, topic)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.5)
