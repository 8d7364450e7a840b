"""Kafka as a cluster (issue 69): three KRaft brokers started here from the installed
Kafka. The pipeline's topics get kafka.replication_factor replicas and
min.insync.replicas; a topic an older setting made with one replica is named by `cdc
status`'s check, and the plan of the command it gives (kafka-reassign-partitions with
the file it wrote) raises it in place, records kept; the idempotent acks=all producers write with a
broker SIGKILLed; too few live brokers for the setting is said in one line."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from cdc.core.clients import kafka_admin, kafka_producer_kwargs
from cdc.core.errors import TopicError
from cdc.core.settings import load_settings
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.topics import (
    ensure_topics,
    pipeline_topic_specs,
    read_topic,
    replication_factors,
    under_replicated,
)
from tests.kafka_brokers import kafka_brokers

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def _described(settings_kafka: object, names: list[str]) -> dict[str, tuple[int, str]]:
    """Per topic: its replication factor and its min.insync.replicas."""
    admin = kafka_admin(settings_kafka, 10000)  # type: ignore[arg-type]
    try:
        described = [t for t in admin.describe_topics(names) if not t["error_code"]]
        copies = replication_factors(described)
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        )
    finally:
        admin.close()
    (by_name,) = configs.values()
    isr = {name: entries["min.insync.replicas"]["value"] for name, entries in by_name.items()}
    return {n: (copies[n], isr[n]) for n in names}


def test_topics_get_the_replicas_and_a_short_one_is_raised_in_place(tmp_path: Path) -> None:
    with kafka_brokers(load_settings(), 3) as brokers:
        old = brokers.kafka_settings().kafka  # replication_factor 1, as before issue 69
        new = brokers.kafka_settings(replication_factor=3, min_insync_replicas=2).kafka
        pipe = PipelineSettings(topic_prefix=f"r{uuid.uuid4().hex[:8]}")
        specs = pipeline_topic_specs(pipe, ["public.orders"])
        names = [s.name for s in specs]

        # a pipeline set up before: one replica each; a change written to it
        ensure_topics(old, specs)
        assert {c for c, _ in _described(old, names).values()} == {1}
        producer = KafkaProducer(**kafka_producer_kwargs(old))
        producer.send(names[0], key=b'{"id":1}', value=b'{"op":"c"}').get(timeout=30)
        producer.close()

        # `cdc setup` with the new settings: min.insync.replicas at most what each has
        ensure_topics(new, specs)
        assert {v for v in _described(new, names).values()} == {(1, "1")}
        plan = tmp_path / "kafka-replicas.json"
        line = under_replicated(new, names, plan)
        assert line is not None and "\n" not in line
        assert f"{len(names)} pipeline topic(s)" in line and "never recreate" in line
        command = re.search(r"`(kafka-reassign-partitions\.sh [^`]+)`", line)
        assert command is not None, line
        args = command.group(1).split()[1:]
        assert args == [
            "--bootstrap-server",
            ",".join(brokers.bootstrap),
            "--reassignment-json-file",
            str(plan),
            "--execute",
        ]
        # a data_dir this user cannot write (`cdc status` as another user): the plan is
        # written to a file of its own in the temporary folder, and the line names that
        elsewhere = under_replicated(new, names, Path("/proc/cdc-none/kafka-replicas.json"))
        assert elsewhere is not None and "/proc/" not in elsewhere, elsewhere
        other_plan = re.search(r"--reassignment-json-file (\S+) --execute", elsewhere)
        assert other_plan is not None and Path(other_plan.group(1)).is_file(), elsewhere
        assert json.loads(Path(other_plan.group(1)).read_text()) == json.loads(plan.read_text())
        Path(other_plan.group(1)).unlink()

        # the plan as the command hands it to Kafka: kafka-reassign-partitions.sh reads the
        # file and asks for each partition's replicas (Admin.alterPartitionReassignments);
        # the project installs Kafka's server jars, not its tools, so the same call is made
        # here through the admin client
        plan_json = json.loads(plan.read_text())
        admin = kafka_admin(new, 30000)
        try:
            refused = admin.alter_partition_reassignments(
                {
                    TopicPartition(p["topic"], p["partition"]): p["replicas"]
                    for p in plan_json["partitions"]
                }
            )
        finally:
            admin.close()
        assert not [e for e in refused.values() if e is not None], refused
        deadline = time.monotonic() + 120
        while under_replicated(new, names, plan) is not None:
            assert time.monotonic() < deadline, "the reassignment did not finish"
            time.sleep(1)
        ensure_topics(new, specs)  # then `cdc setup`
        assert {v for v in _described(new, names).values()} == {(3, "2")}
        assert len(read_topic(new, names[0], timeout=60)) == 1  # its record kept

        # a pipeline made with the setting: every topic 3 replicas, 2 in sync at least
        fresh = PipelineSettings(topic_prefix=f"f{uuid.uuid4().hex[:8]}")
        fresh_specs = pipeline_topic_specs(fresh, ["public.orders", "sales.items"])
        fresh_names = [s.name for s in fresh_specs]
        assert ensure_topics(new, fresh_specs) == fresh_names
        assert {v for v in _described(new, fresh_names).values()} == {(3, "2")}
        assert under_replicated(new, fresh_names, plan) is None

        # a broker lost: acks=all still has its 2 in-sync replicas, the write goes through
        brokers.kill(brokers.brokers[0])
        producer = KafkaProducer(**kafka_producer_kwargs(new), request_timeout_ms=60000)
        for i in range(20):
            producer.send(fresh_names[0], key=b'{"id":%d}' % i, value=b"{}").get(timeout=90)
        producer.close()
        assert len(read_topic(new, fresh_names[0], timeout=90)) == 20

        # too few live brokers for a new topic: one line, before Kafka refuses it (the
        # lost broker counts until its session times out and the controller fences it)
        brokers.wait_ready(count=2)
        deadline = time.monotonic() + 60
        while True:
            admin = kafka_admin(new, 5000)
            try:
                fenced = [b for b in admin.describe_cluster()["brokers"] if b.get("is_fenced")]
            finally:
                admin.close()
            if fenced:
                break
            assert time.monotonic() < deadline, "the lost broker was never fenced"
            time.sleep(1)
        other = pipeline_topic_specs(
            PipelineSettings(topic_prefix=f"o{uuid.uuid4().hex[:8]}"), ["public.x"]
        )
        with pytest.raises(TopicError) as refused:
            ensure_topics(new, other)
        assert str(refused.value) == (
            "kafka.replication_factor is 3 but the Kafka cluster at "
            f"{new.bootstrap} has 2 broker(s): add brokers, or lower it"
        )
