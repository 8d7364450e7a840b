"""The position guard of every batch: before a store takes a batch, the log and the
source must still be the ones it applied from. A change topic deleted and created again
(its offsets start over), a source behind what the store applied (restored, replaced),
or on a timeline that left the store's (a point-in-time restore, an early promotion):
each stops the apply with what to do, rather than be written as if nothing happened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc.capture.slot import int_to_lsn
from cdc.core.clients import kafka_admin, kafka_client_kwargs
from cdc.core.errors import LogRewoundError, SourceRewoundError
from cdc.core.settings import Settings
from cdc.log.progress import Progress

__all__ = ["EndOffsets", "backlog", "check_source_lineage", "check_source_not_rewound"]


class EndOffsets:
    """The change topics' end offsets, asked of Kafka by the driver before each batch."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: Any = None
        self._admin: Any = None
        self.ids: dict[str, str] = {}  # topic -> its id, as the last check found it

    def read(self, topics: dict[str, str]) -> dict[tuple[str, int], int]:
        """The end offset of each partition of `topics` (a deleted topic has none)."""
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(
                **kafka_client_kwargs(self.settings.kafka), enable_auto_commit=False
            )
        parts = [
            TopicPartition(t, p)
            for t in topics
            for p in self._consumer.partitions_for_topic(t) or ()
        ]
        if not parts:
            return {}
        return {(tp.topic, tp.partition): e for tp, e in self._consumer.end_offsets(parts).items()}

    def check_not_rewound(self, store: str, topics: dict[str, str], progress: Progress) -> int:
        """Raise LogRewoundError if a topic ends before what `store` has applied of it
        (the topic was deleted and created again: its offsets started over, and what the
        store holds no longer matches the log): its id is not the one the store applied
        records of, a partition the store applied is gone, or a partition ends before
        what the store applied. Returns how many records of the log the store is behind
        (backlog)."""
        ends = self.read(topics)
        wanted = progress.applied_of(topics)
        self.ids = self._topic_ids(sorted({t for t, _ in ends}))

        def rewound(topic: str, why: str) -> LogRewoundError:
            return LogRewoundError(
                f"change topic {topic} {why}: the topic was deleted and created again; "
                f"rebuild that store's table from the log with `cdc rebuild --store {store} "
                f"--table {topics[topic]}`"
            )

        for topic, held in sorted(self.ids.items()):
            if progress.topic_ids.get(topic, held) != held:
                raise rewound(
                    topic, f"is not the one the {store} applied records of (its id changed)"
                )
        present = {t for t, _ in ends}
        for (topic, partition), offset in sorted(wanted.items()):
            end = ends.get((topic, partition))
            if topic in present and end is None:
                raise rewound(topic, f"has no partition {partition}, which the {store} applied")
            if end is not None and end <= offset:
                raise rewound(
                    topic,
                    f"partition {partition} ends at offset {end}, before offset {offset} "
                    f"that the {store} has applied",
                )
        return backlog(ends, wanted)

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Each topic's id (KIP-516), as Kafka describes it now."""
        if not topics:
            return {}
        if self._admin is None:
            self._admin = kafka_admin(self.settings.kafka, timeout_ms=30000)
        return {
            t["name"]: str(t["topic_id"])
            for t in self._admin.describe_topics(topics)
            if t.get("topic_id") and not t.get("error_code")
        }


def backlog(ends: dict[tuple[str, int], int], applied: dict[tuple[str, int], int]) -> int:
    """The log's records after what a store has applied (its last offset per partition)."""
    return sum(max(0, end - applied.get(where, -1) - 1) for where, end in ends.items())


def check_source_not_rewound(store: str, wal: int, progress: Progress) -> None:
    """Raise SourceRewoundError if the source's WAL is behind a position `store` has
    applied (a change or a TRUNCATE): the database was restored from a backup or
    replaced, and every change it makes now would be refused as older."""
    taken = [progress.commit_lsn or 0]
    taken += [commit for commit, _ in progress.truncated.values()]
    if wal and wal < max(taken):
        raise SourceRewoundError(
            f"PostgreSQL's WAL is at {int_to_lsn(wal)}, behind changes the {store} store "
            f"has applied (up to {int_to_lsn(max(taken))}): the database was restored or "
            "replaced, and its changes would be refused as older. Stop `cdc apply`, run "
            "`cdc drop`, set a new pipeline.topic_prefix (the old topics hold what it "
            "lost), `cdc snapshot`, then `cdc rebuild --store S` for each store"
        )


def check_source_lineage(
    store: str,
    lineage: tuple[str, int | None] | None,
    forks: Callable[[int], dict[int, int]],
    progress: Progress,
) -> None:
    """Raise SourceRewoundError if the source is not the database `store` applied changes
    of (another system identifier), or has moved to a timeline that left the one the
    store applied from before a position the store holds: restored to a point in time,
    or a standby promoted before it had received those changes. `forks(timeline)`: per
    ancestor timeline, where the current one left it (its history file)."""
    if lineage is None or not progress.source:
        return
    (system, timeline), (now_system, now_timeline) = progress.source, lineage
    remedy = (
        "Stop `cdc apply`, run `cdc drop`, set a new pipeline.topic_prefix (the old topics "
        "hold what it lost), `cdc snapshot`, then `cdc rebuild --store S` for each store"
    )
    if system != now_system:
        raise SourceRewoundError(
            f"PostgreSQL is another database cluster (system identifier {now_system}) than "
            f"the one the {store} store applied changes of ({system}): it was replaced. " + remedy
        )
    if now_timeline is None or timeline is None or now_timeline == timeline:
        return
    taken = max([progress.commit_lsn or 0, *(c for c, _ in progress.truncated.values())])
    left = forks(now_timeline).get(timeline)
    if left is None or taken >= left:
        where = f"left it at {int_to_lsn(left)}" if left is not None else "does not descend from it"
        raise SourceRewoundError(
            f"PostgreSQL writes on timeline {now_timeline}, which {where}, and the {store} "
            f"store applied changes of timeline {timeline} up to {int_to_lsn(taken)}: the "
            "database was restored to an earlier point, or a standby was promoted before it "
            "had them, and those changes are gone from it. " + remedy
        )
