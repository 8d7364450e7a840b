"""A Kafka broker lost under load loses nothing (issue 69): the stack runs on three KRaft
brokers started here (replication factor 3, min.insync.replicas 2); one is SIGKILLed
under a 50 TPS load (the first of kafka.bootstrap_servers, so clients start from the
others), the cache is applied while it is down, and it is started again later. The log
holds every change, every store ends equal to the source, the warehouse's history has
one version per change, and every topic of the pipeline (and Connect's own) has 3
replicas. Stores read with readers of the test's own (tests/stores.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition

from cdc.apply.job import run_apply
from cdc.core.clients import kafka_admin
from cdc.core.settings import Settings, load_settings
from cdc.core.topics import (
    connect_topics,
    dead_letter_topic,
    pipeline_topic_specs,
    replication_factors,
    under_replicated,
)
from tests.conftest import Capture, RunningStack, settings_for, stack_env
from tests.helpers import run_cdc
from tests.kafka_brokers import Brokers, kafka_brokers
from tests.source_load import Writer
from tests.survival import assert_nothing_lost_or_doubled

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def brokers() -> Iterator[Brokers]:
    with kafka_brokers(load_settings(), 3, heap="320m") as started:
        yield started


@pytest.fixture(scope="module")
def stack(brokers: Brokers) -> Iterator[RunningStack]:
    """The test stack (tests/conftest.py) on the three brokers: `cdc up` starts the rest."""
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-brokers-"))
    data_dir.chmod(0o755)
    env = {
        **stack_env(data_dir),
        "CDC_KAFKA__MANAGED": "false",
        "CDC_KAFKA__BOOTSTRAP_SERVERS": ",".join(brokers.bootstrap),
        "CDC_KAFKA__REPLICATION_FACTOR": "3",
        "CDC_KAFKA__MIN_INSYNC_REPLICAS": "2",
    }
    try:
        result = run_cdc("up", env=env)
        if result.returncode != 0:
            pytest.fail(f"`cdc up` failed: {result.stderr.strip()}", pytrace=False)
        yield RunningStack(settings_for(env), env)
    finally:
        run_cdc("down", "--purge", "--yes", env=env)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_broker_lost_under_load_loses_nothing(
    stack: RunningStack, captured: Capture, brokers: Brokers
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 2000) g",
        prefix="broker",
    )
    name, settings = t.name, t.settings
    qualified = f"public.{name}"
    writer = Writer(t.dsn, qualified, first_new_id=100_000, max_id=2000, rate=50)
    lost = brokers.brokers[0]
    try:
        writer.start()
        time.sleep(10)
        brokers.kill(lost)  # SIGKILL: no controlled shutdown, leaders moved by the controller
        at_kill = writer.commits
        time.sleep(5)
        # the apply job reads the log with a broker gone (from the other bootstrap brokers)
        run_apply(settings, ["cache"], once=True)
        time.sleep(15)
        assert writer.commits > at_kill + 500  # the source went on changing, 50 a second
        brokers.start(lost)
        brokers.wait_ready()
        time.sleep(10)
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None, writer.error
    print(f"{writer.commits} transactions, broker {lost.node_id} lost after {at_kill}")

    assert_nothing_lost_or_doubled(settings, qualified)

    # every topic of the pipeline, and the Connect worker's own, has its 3 replicas
    names = [s.name for s in pipeline_topic_specs(settings.pipeline, [qualified])]
    names += connect_topics(settings.connect.group_id).values()
    admin = kafka_admin(settings.kafka, 10000)
    try:
        described = [t for t in admin.describe_topics(names) if not t["error_code"]]
    finally:
        admin.close()
    assert replication_factors(described) == dict.fromkeys(names, 3)
    assert under_replicated(settings.kafka, names, Path(tempfile.mkdtemp()) / "plan.json") is None
    status = run_cdc("status", "--output", "json", env=t.env)
    pipeline = json.loads(status.stdout)["pipeline"]
    assert names[0] in pipeline["topics"] and pipeline["replication"] is None, pipeline

    # a topic of the pipeline down to one replica (as one made before the setting):
    # `cdc status` names it and writes the plan its command runs; the plan raises it
    dlq = dead_letter_topic(settings.pipeline)
    _reassign(settings, {TopicPartition(dlq, 0): [brokers.brokers[1].node_id]})
    deadline = time.monotonic() + 120
    while True:
        status = run_cdc("status", "--output", "json", env=t.env)
        said = json.loads(status.stdout)["pipeline"]["replication"]
        if said is not None:
            break
        assert time.monotonic() < deadline, "the topic kept its replicas"
        time.sleep(2)
    plan = settings.data_dir / "kafka-replicas.json"
    assert said.startswith(f"1 pipeline topic(s) ({dlq}) have fewer replicas than "), said
    assert (
        f"`kafka-reassign-partitions.sh --bootstrap-server {settings.kafka.bootstrap} "
        f"--reassignment-json-file {plan} --execute`, then `cdc setup`"
    ) in said
    text = run_cdc("status", env=t.env)
    assert "replicas" in text.stdout, text.stdout + text.stderr
    moves = json.loads(plan.read_text())["partitions"]
    assert [(m["topic"], m["partition"], len(m["replicas"])) for m in moves] == [(dlq, 0, 3)]
    _reassign(settings, {TopicPartition(m["topic"], m["partition"]): m["replicas"] for m in moves})
    deadline = time.monotonic() + 120
    while json.loads(run_cdc("status", "--output", "json", env=t.env).stdout)["pipeline"][
        "replication"
    ]:
        assert time.monotonic() < deadline, "the plan did not raise the topic's replicas"
        time.sleep(2)


def _reassign(settings: Settings, replicas: dict[TopicPartition, list[int]]) -> None:
    """What kafka-reassign-partitions.sh --execute asks of Kafka (the project installs
    Kafka's server, not its tools)."""
    admin = kafka_admin(settings.kafka, 30000)
    try:
        refused = admin.alter_partition_reassignments(replicas)
    finally:
        admin.close()
    assert not [e for e in refused.values() if e is not None], refused
