"""A snapshot is a generation (contract point 11).

When a snapshot's rows are in the change topics, it records where they end in each
topic partition, with its consistent point. A store that has applied up to those
offsets holds the whole new generation; every row it still holds from before the
consistent point (a row deleted between two snapshots, whose delete no log holds) is
then removed, the way a TRUNCATE at the consistent point would remove it: rows the new
generation wrote sit at or after the consistent point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir

__all__ = ["Generation", "generation_file", "read_generation", "record_generation"]


@dataclass(frozen=True)
class Generation:
    lsn: int  # the slot's consistent point
    ts_ms: int  # when the snapshot was taken
    ends: dict[str, int]  # "topic:partition" -> end offset after the snapshot's rows
    previous: int | None = None  # the consistent point of the generation before, if any

    def applied_by(self, applied: dict[str, int]) -> bool:
        """Whether a store that applied up to `applied` ("topic:partition" -> last offset)
        holds every snapshot row of this generation."""
        return all(applied.get(where, -1) >= end - 1 for where, end in self.ends.items() if end)


def generation_file(settings: Settings) -> Path:
    return settings.data_dir / "checkpoints" / settings.pipeline.name / "generation.json"


def record_generation(
    settings: Settings, lsn: int, ts_ms: int, topics: list[str], earlier: int | None = None
) -> Generation:
    """Note the generation whose snapshot rows `topics` now end with. `earlier`: the point
    of an attempt that stopped before it and started again from nothing, whose rows the
    stores may hold: with no generation before, it counts as the one before (its rows
    are removed once this one is whole)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka_client_kwargs(settings.kafka))
    try:
        parts = [
            TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()
        ]
        ends = {
            f"{tp.topic}:{tp.partition}": end for tp, end in consumer.end_offsets(parts).items()
        }
    finally:
        consumer.close()
    before = read_generation(settings)
    generation = Generation(lsn, ts_ms, ends, before.lsn if before else earlier)
    path = generation_file(settings)
    make_state_dir(settings, path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(generation.__dict__))
    tmp.replace(path)
    return generation


def read_generation(settings: Settings) -> Generation | None:
    try:
        data: dict[str, Any] = json.loads(generation_file(settings).read_text())
        return Generation(
            int(data["lsn"]), int(data["ts_ms"]), dict(data["ends"]), data.get("previous")
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
