"""The dead-letter topic read back and replayed (`cdc dlq`): a repair.

A dead letter names the store, the error, and where the change came from (topic,
partition, offset, key); the apply job writes them (cdc/apply/dead_letters.py).
Replaying them backfills their keys through the log (an incremental snapshot of just
those keys), so every store takes the source's current rows through its own guarded
writes once the cause is fixed; what was replayed is remembered per store, so a replay
takes only the dead letters that came after the last.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.capture.source_reader import captured_tables
from cdc.check.repair import backfill_keys, key_filters
from cdc.core.clients import kafka_client_kwargs
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir
from cdc.core.topics import change_topic, dead_letter_topic
from cdc.log.progress import records_dir

__all__ = ["DeadLetter", "held_back", "read_dead_letters", "replay_dead_letters"]


@dataclass(frozen=True)
class DeadLetter:
    partition: int  # in the dead-letter topic
    offset: int
    store: str
    error: str
    topic: str  # where the change came from
    source_partition: int
    source_offset: int
    key: str | None


def read_dead_letters(settings: Settings, store: str | None = None) -> list[DeadLetter]:
    """Every dead letter of the pipeline (of `store`), oldest first."""
    from kafka import KafkaConsumer, TopicPartition

    topic = dead_letter_topic(settings.pipeline)
    consumer = KafkaConsumer(**kafka_client_kwargs(settings.kafka), enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        letters = []
        while any(consumer.position(p) < ends[p] for p in parts):
            for batch in consumer.poll(timeout_ms=1000).values():
                for record in batch:
                    letter = _letter(record)
                    if letter is not None and (store is None or letter.store == store):
                        letters.append(letter)
        return sorted(letters, key=lambda x: (x.partition, x.offset))
    finally:
        consumer.close()


def _letter(record: Any) -> DeadLetter | None:
    try:
        body = json.loads(record.value)
        key = body.get("key")
        return DeadLetter(
            record.partition,
            record.offset,
            str(body.get("store")),
            str(body.get("error")),
            str(body.get("topic")),
            int(body.get("partition") or 0),
            int(body.get("offset") or 0),
            key if isinstance(key, str) else None,
        )
    except (TypeError, ValueError, AttributeError, RecursionError):  # not one of ours
        return None


def _replayed_file(settings: Settings, store: str) -> Path:
    return records_dir(settings) / f"{store}.dlq-replayed.json"


def _replayed(settings: Settings, store: str) -> dict[str, int]:
    try:
        return {
            k: int(v) for k, v in json.loads(_replayed_file(settings, store).read_text()).items()
        }
    except (OSError, ValueError):
        return {}


def replay_dead_letters(settings: Settings, stores: list[str], say: Say) -> dict[str, int]:
    """Backfill the keys of the dead letters of `stores`, and of the capture's (an event
    over kafka.max_message_bytes), not replayed yet; returns per table the keys
    backfilled. Dead letters whose key names no row are reported."""
    tables = captured_tables(settings)
    by_topic = {change_topic(settings.pipeline, name): name for name in tables}
    pending: dict[str, set[str]] = {}
    marks: dict[str, dict[str, int]] = {}
    # the capture's own (kafka.oversized = "dead_letter": an event no store took) with them
    for store in [*stores, "capture"]:
        done = _replayed(settings, store)
        marks[store] = dict(done)
        for letter in read_dead_letters(settings, store):
            if letter.offset < done.get(str(letter.partition), 0):
                continue
            marks[store][str(letter.partition)] = letter.offset + 1
            table = by_topic.get(letter.topic)
            if table is None or not letter.key or not _is_key(letter.key, tables[table].key):
                say(
                    f"{store}: dead letter at offset {letter.offset} names no row of a "
                    f"captured table ({letter.topic}, key {letter.key!r}); left as it is"
                )
                continue
            pending.setdefault(table, set()).add(letter.key)
    for name, keys in sorted(pending.items()):
        captured = tables[name]
        backfill_keys(settings, captured, key_filters(captured, sorted(keys)), len(keys), say)
    for store, mark in marks.items():
        path = _replayed_file(settings, store)
        make_state_dir(settings, path.parent)
        path.write_text(json.dumps(mark))
    return {name: len(keys) for name, keys in pending.items()}


def held_back(settings: Settings) -> dict[str, list[str]]:
    """Per captured table, the keys of the capture's dead letters (an event over
    kafka.max_message_bytes, kafka.oversized = "dead_letter") not replayed yet: the
    stores hold those rows as they were before it. Empty when Kafka does not answer."""
    try:
        letters = read_dead_letters(settings, "capture")
        tables = captured_tables(settings)
    except Exception:  # a figure beside the verification, not a check of its own
        return {}
    by_topic = {change_topic(settings.pipeline, name): name for name in tables}
    done = _replayed(settings, "capture")
    found: dict[str, list[str]] = {}
    for letter in letters:
        if letter.offset < done.get(str(letter.partition), 0) or letter.key is None:
            continue
        keys = found.setdefault(by_topic.get(letter.topic, letter.topic), [])
        if letter.key not in keys:
            keys.append(letter.key)
    return found


def _is_key(text: str, columns: tuple[str, ...]) -> bool:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and all(c in value for c in columns)
