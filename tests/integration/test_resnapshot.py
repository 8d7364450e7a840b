"""A snapshot is a generation: `cdc drop` then `cdc snapshot` starts the connector at the new
slot's consistent point, and the first transaction it streams carries that point.

The change topics are read here with a consumer of this module's own.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition
from rich.console import Console

from cdc.capture.connect_client import connect_client
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings
from cdc.core.settings.connections import KafkaSettings
from cdc.core.topics import change_topic
from tests.conftest import Capture, RunningStack
from tests.helpers import run_cdc
from tests.logcheck import pipeline_env
from tests.stores import history_with_ends, warehouse_frame

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Event:
    partition: int
    offset: int
    key: dict[str, Any]
    value: dict[str, Any] | None  # None: a tombstone

    @property
    def op(self) -> str | None:
        return self.value["op"] if self.value is not None else None

    @property
    def sequence(self) -> list[str | None]:
        assert self.value is not None
        return json.loads(self.value["source"]["sequence"])


def read_events(kafka: KafkaSettings, topic: str) -> list[Event]:
    """Every record of the topic up to its end now, in (partition, offset) order."""
    consumer = KafkaConsumer(**kafka_client_kwargs(kafka), enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        events: list[Event] = []
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for tp, batch in consumer.poll(timeout_ms=500).items():
                for r in batch:
                    if r.offset < end[tp]:
                        value = json.loads(r.value) if r.value is not None else None
                        events.append(Event(tp.partition, r.offset, json.loads(r.key), value))
        return sorted(events, key=lambda e: (e.partition, e.offset))
    finally:
        consumer.close()


def wait_events(
    settings: Settings, topic: str, done: Callable[[list[Event]], bool], what: str
) -> list[Event]:
    deadline = time.monotonic() + 90
    while True:
        events = read_events(settings.kafka, topic)
        if done(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


def by_key(events: list[Event]) -> dict[int, list[Event]]:
    keyed: dict[int, list[Event]] = {}
    for event in events:
        keyed.setdefault(event.key["id"], []).append(event)
    return keyed


def env_for(stack: RunningStack, settings: Settings) -> dict[str, str]:
    return pipeline_env(stack.env, settings)


def execute(settings: Settings, *statements: str) -> None:
    """Run the statements in one transaction."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        for statement in statements:
            conn.execute(statement)


def snapshot_lsn(settings: Settings) -> int:
    """The consistent point the pipeline's snapshot recorded, as the 64-bit LSN."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        row = conn.execute(
            "SELECT lsn - '0/0'::pg_lsn FROM cdc.snapshots WHERE pipeline = %s AND status = 'done'",
            (settings.pipeline.name,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


@pytest.fixture
def table(captured: Capture) -> tuple[str, Settings]:
    """A table of 100 rows and a pipeline on it, not snapshotted yet."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 100) g",
        prefix="resnap",
        snapshot=False,
    )
    return t.name, t.settings


def test_a_snapshot_taken_again_after_drop_streams_from_its_own_slot(
    stack: RunningStack, table: tuple[str, Settings]
) -> None:
    name, settings = table
    env = env_for(stack, settings)
    topic = change_topic(settings.pipeline, f"public.{name}")

    first = run_cdc("snapshot", env=env)
    assert first.returncode == 0, first.stderr
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id <= 5")
    wait_events(
        settings,
        topic,
        lambda evs: sum(1 for e in evs if e.op == "u") == 5,
        "the first generation's updates",
    )

    dropped = run_cdc("drop", "--yes", env=env)
    assert dropped.returncode == 0, dropped.stderr
    # between the generations: nothing captures these, the second snapshot holds them
    execute(settings, f"UPDATE {name} SET version = 2 WHERE id BETWEEN 6 AND 10")
    execute(settings, f"DELETE FROM {name} WHERE id BETWEEN 11 AND 15")
    execute(settings, f"INSERT INTO {name} SELECT g, 0, 'new' FROM generate_series(1001, 1005) g")

    second = run_cdc("snapshot", env=env)
    assert second.returncode == 0, second.stderr
    status = connect_client(settings).status(settings.pipeline.connector)
    assert status["connector"]["state"] == "RUNNING", status
    assert [t["state"] for t in status["tasks"]] == ["RUNNING"], status

    # changes after the second snapshot reach the change topic, once each
    execute(settings, f"UPDATE {name} SET version = 3 WHERE id = 20")
    execute(settings, f"DELETE FROM {name} WHERE id = 21")
    execute(settings, f"INSERT INTO {name} VALUES (2001, 0, 'after')")

    def streamed(events: list[Event]) -> bool:
        keyed = by_key(events)
        return (
            any(e.op == "u" for e in keyed.get(20, []))
            and None in [e.op for e in keyed.get(21, [])]
            and any(e.op == "c" for e in keyed.get(2001, []))
        )

    events = wait_events(settings, topic, streamed, "the changes after the second snapshot")
    keyed = by_key(events)
    assert [e.op for e in keyed[20] if e.op != "r"] == ["u"]
    assert keyed[20][-1].value["after"]["version"] == 3  # type: ignore[index]
    assert [e.op for e in keyed[21] if e.op != "r"] == ["d", None]
    assert [e.op for e in keyed[2001]] == ["c"]

    # the second generation's snapshot rows are the table as it was between the generations
    snapshot_rows = {e.key["id"]: e.value["after"] for e in events if e.op == "r"}  # type: ignore[index]
    expected = (set(range(1, 101)) - set(range(11, 16))) | set(range(1001, 1006))
    assert set(snapshot_rows) == expected
    assert {k: v["version"] for k, v in snapshot_rows.items() if k <= 10} == {
        **{k: 1 for k in range(1, 6)},
        **{k: 2 for k in range(6, 11)},
    }


def test_the_first_streamed_transaction_carries_the_consistent_point(
    table: tuple[str, Settings],
) -> None:
    name, settings = table
    topic = change_topic(settings.pipeline, f"public.{name}")
    result = run_snapshot(settings, Console(file=io.StringIO()))
    point = snapshot_lsn(settings)
    assert not result.resumed

    execute(
        settings,
        f"UPDATE {name} SET version = 1 WHERE id = 1",
        f"INSERT INTO {name} VALUES (501, 0, 'first')",
        f"DELETE FROM {name} WHERE id = 2",
    )
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 3")
    events = wait_events(
        settings,
        topic,
        lambda evs: sum(1 for e in evs if e.op in ("c", "u", "d")) == 4,
        "two streamed transactions",
    )
    streamed = [e for e in events if e.op in ("c", "u", "d")]
    first = [e for e in streamed if e.key["id"] in (1, 501, 2)]
    (later,) = [e for e in streamed if e.key["id"] == 3]
    assert len(first) == 3 and len({e.value["source"]["txId"] for e in first}) == 1  # type: ignore[index]

    # sequence = [LSN of the last commit before the change's transaction, the change's LSN]
    for event in first:
        last_commit, change = event.sequence
        assert last_commit is not None, event.value
        assert int(last_commit) >= point, (int(last_commit), point)
        assert change is not None
    assert len({e.sequence[0] for e in first}) == 1
    # the next transaction sits after the first one's commit
    assert later.sequence[0] is not None
    assert int(later.sequence[0]) > int(first[0].sequence[0])  # type: ignore[arg-type]
    assert int(later.sequence[0]) > max(int(e.sequence[1]) for e in first)  # type: ignore[arg-type]


def test_a_rerun_after_the_snapshot_resumes_from_the_connectors_own_offset(
    table: tuple[str, Settings],
) -> None:
    """A connector removed by hand (Connect keeps its offset): `cdc snapshot` starts it again
    from that offset, this generation's, not from the consistent point."""
    name, settings = table
    topic = change_topic(settings.pipeline, f"public.{name}")
    connector = settings.pipeline.connector
    run_snapshot(settings, Console(file=io.StringIO()))
    point = snapshot_lsn(settings)
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 1")
    wait_events(settings, topic, lambda evs: any(e.op == "u" for e in evs), "the first update")

    client = connect_client(settings)
    time.sleep(2)  # Connect commits source offsets every second
    (stored,) = client.offsets(connector)
    print("offset Debezium stored:", stored)
    assert stored["partition"] == {"server": settings.pipeline.topic_prefix}
    assert stored["offset"]["lsn_commit"] > point
    client.delete(connector)
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 2")  # while nothing streams

    result = run_snapshot(settings, Console(file=io.StringIO()))
    assert result.resumed
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 3")
    events = wait_events(
        settings,
        topic,
        lambda evs: {e.key["id"] for e in evs if e.op == "u"} == {1, 2, 3},
        "the updates before and after the rerun",
    )
    updates = {e.key["id"]: e for e in events if e.op == "u"}
    assert sum(1 for e in events if e.op == "u") == 3
    # the update made while the connector was gone follows the first one's commit: the
    # connector resumed from its own offset, not from the consistent point
    assert updates[2].sequence[0] == str(stored["offset"]["lsn_commit"])
    assert int(updates[3].sequence[0]) > int(updates[2].sequence[1])  # type: ignore[arg-type]

    # a connector left STOPPED (as by a start cut short) is started again by a rerun
    client.stop(connector)
    client.wait_stopped(connector)
    assert run_snapshot(settings, Console(file=io.StringIO())).resumed
    assert client.status(connector)["connector"]["state"] == "RUNNING"
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 4")
    events = wait_events(
        settings, topic, lambda evs: any(e.key["id"] == 4 for e in evs if e.op == "u"), "id 4"
    )
    assert sum(1 for e in events if e.op == "u") == 4


def test_a_new_generation_starts_at_its_point_over_an_older_generations_offset(
    table: tuple[str, Settings],
) -> None:
    """The connector deleted by hand before `cdc drop`: its offset stays in Connect, and the
    next generation's connector, of the same name, must not resume from it."""
    name, settings = table
    topic = change_topic(settings.pipeline, f"public.{name}")
    connector = settings.pipeline.connector
    client = connect_client(settings)
    run_snapshot(settings, Console(file=io.StringIO()))
    execute(settings, f"UPDATE {name} SET version = 1 WHERE id = 1")
    wait_events(settings, topic, lambda evs: any(e.op == "u" for e in evs), "the first update")
    time.sleep(2)  # Connect commits source offsets every second
    old = client.offsets(connector)
    assert old and "lsn_proc" in old[0]["offset"]
    client.delete(connector)
    drop_pipeline(settings)  # slot, publication, state: nothing left to reset the offset of

    execute(settings, f"UPDATE {name} SET version = 2 WHERE id = 2")
    result = run_snapshot(settings, Console(file=io.StringIO()))
    assert not result.resumed
    point = snapshot_lsn(settings)
    assert point > old[0]["offset"]["lsn_proc"]
    assert client.status(connector)["connector"]["state"] == "RUNNING"
    execute(settings, f"UPDATE {name} SET version = 3 WHERE id = 3")
    events = wait_events(
        settings, topic, lambda evs: any(e.op == "u" for e in evs), "an update after it"
    )
    (update,) = [e for e in events if e.op == "u"]
    assert update.key["id"] == 3
    assert int(update.sequence[0]) >= point  # type: ignore[arg-type]


def test_rows_deleted_between_two_snapshots_leave_every_store(
    stack: RunningStack, table: tuple[str, Settings]
) -> None:
    """A snapshot is a generation: what the new one does not hold goes from every store
    once the store holds it whole, and its history version is closed (read with readers
    of the test's own: Redis hashes, OpenSearch over HTTP, the Delta files)."""
    import redis
    import requests

    from cdc.apply.job import run_apply

    name, settings = table
    qualified = f"public.{name}"
    env = env_for(stack, settings)
    stores = ["cache", "search", "warehouse"]
    assert run_cdc("snapshot", env=env).returncode == 0
    run_apply(settings, stores, once=True)
    assert run_cdc("drop", "--yes", env=env).returncode == 0
    execute(settings, f"DELETE FROM {name} WHERE id BETWEEN 11 AND 15")  # not captured
    assert run_cdc("snapshot", env=env).returncode == 0
    run_apply(settings, stores, once=True)

    with psycopg.connect(settings.postgres.dsn()) as conn:
        expected = {r[0] for r in conn.execute(f"SELECT id FROM {name}").fetchall()}
    assert len(expected) == 95
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    prefix = f"{settings.pipeline.topic_prefix}:{qualified}:"
    cached = {
        json.loads(k[len(prefix) :])["id"]
        for k in client.scan_iter(match=prefix + "*")
        if not client.hexists(k, "_deleted")
    }
    assert cached == expected
    index = f"{settings.pipeline.topic_prefix}.{qualified}".lower()
    url = settings.opensearch.url
    requests.post(f"{url}/{index}/_refresh", timeout=30).raise_for_status()
    hits = requests.post(f"{url}/{index}/_search", json={"size": 1000}, timeout=30).json()
    assert {h["_source"]["id"] for h in hits["hits"]["hits"]} == expected
    current = warehouse_frame(settings, qualified)  # a session of the tests' own, if none
    assert sorted(r["id"] for r in current.collect()) == sorted(expected)  # live rows only
    history = history_with_ends(settings, qualified)  # the ends as the test derives them
    still_open = {r["id"] for r in history.where("valid_to IS NULL").collect()}
    assert still_open == expected  # the deleted rows' versions are closed
    assert {r["id"] for r in history.collect()} == expected | set(range(11, 16))
