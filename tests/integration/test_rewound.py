"""A log or a source that goes back behind what a store applied: the apply job stops with
one line naming `cdc rebuild` (exit 11), never refusing the new changes in silence; the
rebuild then leaves the store equal to the source (read with redis-py, not our code)."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
from kafka.admin import NewTopic

from cdc.capture.timeline import timeline_forks
from cdc.core.clients import kafka_admin, kafka_client_kwargs
from cdc.core.errors import SourceError
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, read_topic
from cdc.log.progress import progress_file
from tests.conftest import Capture, Captured
from tests.helpers import run_cdc
from tests.logcheck import poll, table_info, wait_until_equal
from tests.stores import cache

pytestmark = pytest.mark.integration


def cache_rows(settings: Settings, table: str) -> dict[int, str]:
    return {k: row["body"] for k, row in cache(settings, table).items()}


def source(dsn: str, name: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f"SELECT id, body FROM {name}").fetchall())  # type: ignore[arg-type]


class Pipeline:
    """A table of its own, snapshotted and streaming, applied to the cache by `cdc`."""

    def __init__(self, t: Captured) -> None:
        self.name, self.table = t.name, t.table
        self.settings, self.dsn, self.env = t.settings, t.dsn, t.env

    def start(self) -> None:
        """Rows changed after the snapshot, in the log."""
        self.sql(f"UPDATE {self.name} SET body = 'v1' WHERE id <= 20")
        wait_until_equal(self.settings, table_info(self.settings, self.table))

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)

    def apply(self) -> Any:
        return run_cdc("apply", "--once", "--store", "cache", env=self.env)

    def equal(self) -> bool:
        return cache_rows(self.settings, self.table) == source(self.dsn, self.name)


@pytest.fixture
def p(captured: Capture) -> Pipeline:
    """A table of 30 rows and its pipeline, snapshotted."""
    return Pipeline(
        captured(
            "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
            "INSERT INTO {name} SELECT g, 'v0' FROM generate_series(1, 30) g",
            prefix="rew",
        )
    )


def _ends(p: Pipeline) -> int:
    from kafka import KafkaConsumer, TopicPartition

    topic = change_topic(p.settings.pipeline, p.table)
    consumer = KafkaConsumer(**kafka_client_kwargs(p.settings.kafka))
    try:
        parts = [TopicPartition(topic, n) for n in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(parts).values()) if parts else 0
    finally:
        consumer.close()


def rebuilt(p: Pipeline) -> None:
    done = run_cdc("rebuild", "--store", "cache", "--yes", env=p.env)
    assert done.returncode == 0, done.stderr
    applied = p.apply()
    assert applied.returncode == 0, applied.stderr
    assert p.equal()


@pytest.mark.long
def test_a_change_topic_deleted_and_created_again_stops_the_apply(p: Pipeline) -> None:
    p.start()
    assert p.apply().returncode == 0
    assert p.equal()
    topic = change_topic(p.settings.pipeline, p.table)
    admin = kafka_admin(p.settings.kafka)
    try:  # someone deletes the topic and creates it again: its offsets start at 0
        admin.delete_topics([topic])
        poll(lambda: topic not in admin.list_topics(), 60, f"{topic} to go")
        time.sleep(2)
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    p.sql(f"UPDATE {p.name} SET body = 'v2' WHERE id <= 3")
    poll(lambda: _ends(p) > 0, 120, f"{topic} to be written again")
    stopped = p.apply()
    assert stopped.returncode == 11, stopped.stderr
    said = stopped.stderr.strip().splitlines()[-1]
    assert topic in said and "cdc rebuild --store cache" in said, said
    assert not p.equal()  # nothing applied in silence meanwhile
    rebuilt(p)


def _partition_ends(p: Pipeline) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    topic = change_topic(p.settings.pipeline, p.table)
    consumer = KafkaConsumer(**kafka_client_kwargs(p.settings.kafka))
    try:
        parts = [TopicPartition(topic, n) for n in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: end for tp, end in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


@pytest.mark.long
def test_a_change_topic_created_again_and_grown_past_what_was_applied_stops_the_apply(
    p: Pipeline,
) -> None:
    """Offsets alone cannot tell: the new topic holds more records than the store
    applied of the old one, so only its id says it is another topic."""
    p.start()
    assert p.apply().returncode == 0
    topic = change_topic(p.settings.pipeline, p.table)
    applied = json.loads(progress_file(p.settings, "cache").read_text())["applied"]
    partitions = len(_partition_ends(p))
    admin = kafka_admin(p.settings.kafka)
    try:
        admin.delete_topics([topic])
        poll(lambda: topic not in admin.list_topics(), 60, f"{topic} to go")
        time.sleep(2)
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    p.sql(f"INSERT INTO {p.name} SELECT g, 'new' FROM generate_series(1000, 1599) g")
    poll(lambda: sum(_partition_ends(p).values()) >= 600, 120, f"{topic} to be written again")
    grown = _partition_ends(p)
    assert all(end > applied[f"{topic}:{n}"] + 1 for n, end in grown.items()), (grown, applied)
    stopped = p.apply()
    assert stopped.returncode == 11, stopped.stderr
    said = stopped.stderr.strip().splitlines()[-1]
    assert topic in said and "cdc rebuild --store cache" in said, said
    assert not p.equal()  # nothing applied in silence meanwhile
    rebuilt(p)


@pytest.mark.long
def test_a_source_of_another_cluster_or_timeline_stops_the_apply(p: Pipeline) -> None:
    """A restore to a point in time writes on a new timeline, with a WAL that may soon pass
    every position the store holds: the store's record of the source's system identifier
    and timeline tells, not the position. Simulated by the record (the shared PostgreSQL
    cannot be restored): the store applied from another cluster, then from a timeline the
    source does not descend from."""
    p.start()
    assert p.apply().returncode == 0
    path = progress_file(p.settings, "cache")
    recorded = json.loads(path.read_text())
    system, timeline = recorded["source"]
    assert int(system) > 0 and timeline == 1  # what the source is
    p.sql(f"INSERT INTO {p.name} VALUES (100, 'after the restore')")
    wait_until_equal(p.settings, table_info(p.settings, p.table))
    for lineage, said in (
        ([str(int(system) + 1), 1], "another database cluster"),
        ([system, 2], "writes on timeline 1, which does not descend"),
    ):
        path.write_text(json.dumps({**recorded, "source": lineage}))
        stopped = p.apply()
        assert stopped.returncode == 11, stopped.stderr
        line = stopped.stderr.strip().splitlines()[-1]
        assert said in line and "cdc rebuild" in line, line
        assert 100 not in cache_rows(p.settings, p.table)
    # a timeline's history is read with the replication protocol, as the replication role
    with pytest.raises(SourceError, match="could not read timeline 2's history"):
        timeline_forks(p.settings, 2)
    rebuilt(p)


def test_a_source_behind_what_a_store_applied_stops_the_apply(p: Pipeline) -> None:
    """A database restored from a backup (or replaced) writes at LSNs below those the
    store holds: simulated by the progress the store recorded, as a restore cannot be
    done to the shared PostgreSQL."""
    p.start()
    assert p.apply().returncode == 0
    path = progress_file(p.settings, "cache")
    progress = json.loads(path.read_text())
    # the newest source position it applied: the last change's own, not its sequence[0]
    # (Debezium's commit before that change's transaction)
    changes = read_topic(p.settings.kafka, change_topic(p.settings.pipeline, p.table))
    newest = max(r.value["source"]["lsn"] for r in changes if r.value and r.op != "r")
    assert progress["commit_lsn"] >= newest > 0
    progress["commit_lsn"] += 1 << 40  # as if applied from a timeline the source lost
    path.write_text(json.dumps(progress))
    p.sql(f"INSERT INTO {p.name} VALUES (100, 'after the restore')")
    wait_until_equal(p.settings, table_info(p.settings, p.table))
    stopped = p.apply()
    assert stopped.returncode == 11, stopped.stderr
    said = stopped.stderr.strip().splitlines()[-1]
    assert "restored or replaced" in said and "cdc rebuild" in said, said
    assert 100 not in cache_rows(p.settings, p.table)
    rebuilt(p)
