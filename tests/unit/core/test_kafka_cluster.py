"""Kafka as a cluster (issue 69): several bootstrap brokers, the replicas of every topic
the pipeline makes, durable producers, and the line `cdc status` says of a topic with
fewer replicas than the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from cdc.capture.connector_config import connector_config
from cdc.core.clients import kafka_client_kwargs, kafka_producer_kwargs
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import kafka_options
from cdc.core.topics import (
    live_brokers,
    reassignment_plan,
    replication_factors,
    replication_problem,
    topic_kafka_configs,
)
from cdc.stack.components.connect import Connect

pytestmark = pytest.mark.usefixtures("clean_env")

CLUSTER = {"managed": False, "replication_factor": 3, "min_insync_replicas": 2}


def _kafka(**kafka: Any) -> Settings:
    return Settings.model_validate({"kafka": kafka})


@pytest.mark.parametrize(
    "given",
    [
        ["k1:9092", "k2:9092", "k3:9093"],
        "k1:9092,k2:9092, k3:9093",
        '["k1:9092", "k2:9092", "k3:9093"]',
    ],
)
def test_bootstrap_servers_take_a_list_or_one_string(given: object) -> None:
    kafka = _kafka(managed=False, bootstrap_servers=given).kafka
    assert kafka.brokers == ("k1:9092", "k2:9092", "k3:9093")
    assert kafka.bootstrap == "k1:9092,k2:9092,k3:9093"
    # every client of the pipeline is handed them all
    assert kafka_client_kwargs(kafka)["bootstrap_servers"] == kafka.bootstrap
    settings = _kafka(managed=False, bootstrap_servers=given)
    assert kafka_options(settings)["kafka.bootstrap.servers"] == kafka.bootstrap


def test_one_address_still_works_and_none_is_host_and_port() -> None:
    assert _kafka(managed=False, bootstrap_servers="k1:9092").kafka.bootstrap == "k1:9092"
    assert _kafka(host="k9", port=9999).kafka.bootstrap == "k9:9999"
    assert _kafka(managed=False, bootstrap_servers="[::1]:9092").kafka.brokers == ("[::1]:9092",)


def test_the_environment_takes_a_comma_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_KAFKA__MANAGED", "false")
    monkeypatch.setenv("CDC_KAFKA__BOOTSTRAP_SERVERS", "a:1,b:2")
    assert load_settings().kafka.brokers == ("a:1", "b:2")


@pytest.mark.parametrize(
    ("kafka", "said"),
    [
        ({"managed": False, "bootstrap_servers": "k1"}, "'k1' is not host:port"),
        ({"managed": False, "bootstrap_servers": "k1:0"}, "'k1:0' is not host:port"),
        ({"managed": False, "bootstrap_servers": "a:1,a:1"}, "names an address twice"),
        ({"managed": False, "bootstrap_servers": '["a:1"'}, "not a JSON list"),
        ({"bootstrap_servers": "k1:9092"}, "set managed = false"),
        ({"replication_factor": 3}, "the local stack runs one"),
        ({"managed": False, "replication_factor": 0}, "greater than or equal to 1"),
        (
            {"managed": False, "replication_factor": 2, "min_insync_replicas": 3},
            "min_insync_replicas 3 is above replication_factor 2",
        ),
    ],
)
def test_a_bad_cluster_setting_is_one_line(
    monkeypatch: pytest.MonkeyPatch, kafka: dict[str, Any], said: str
) -> None:
    for key, value in kafka.items():
        monkeypatch.setenv(f"CDC_KAFKA__{key.upper()}", str(value))
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "\n" not in message and message.startswith("invalid setting kafka"), message
    assert said in message, message


def test_the_defaults_keep_the_one_broker_stack() -> None:
    kafka = Settings().kafka
    assert (kafka.replication_factor, kafka.min_insync_replicas) == (1, 1)
    assert topic_kafka_configs(kafka)["min.insync.replicas"] == "1"


def test_every_topic_gets_its_copies_and_never_more_than_it_has() -> None:
    kafka = _kafka(**CLUSTER).kafka
    assert topic_kafka_configs(kafka) == {
        "max.message.bytes": str(kafka.max_message_bytes),
        "min.insync.replicas": "2",
    }
    # a topic made before with one replica: 2 would refuse every write to it
    assert topic_kafka_configs(kafka, 1)["min.insync.replicas"] == "1"


def test_debezium_makes_its_topics_with_the_replicas_and_produces_durably() -> None:
    config = connector_config(
        _kafka(**CLUSTER), topic_prefix="x", tables=["a.b"], slot="s", publication="p"
    )
    assert config["topic.creation.default.replication.factor"] == "3"
    assert config["topic.creation.default.min.insync.replicas"] == "2"
    assert config["producer.override.acks"] == "all"
    assert config["producer.override.enable.idempotence"] == "true"
    local = connector_config(
        Settings(), topic_prefix="x", tables=["a.b"], slot="s", publication="p"
    )
    assert local["topic.creation.default.replication.factor"] == "1"


def test_connects_own_topics_and_producers(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {"data_dir": str(tmp_path), "kafka": {**CLUSTER, "bootstrap_servers": "a:1,b:2"}}
    )
    worker = Connect(settings)
    worker.state_dir.mkdir(parents=True)
    worker.prepare()
    lines = (worker.state_dir / "worker.properties").read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines)
    assert values["bootstrap.servers"] == "a:1,b:2"
    for kind in ("config", "offset", "status"):
        assert values[f"{kind}.storage.replication.factor"] == "3"
        assert values[f"{kind}.storage.min.insync.replicas"] == "2"
    assert values["config.storage.topic"] == "_cdc-connect-configs"
    assert values["producer.acks"] == "all"
    assert values["producer.enable.idempotence"] == "true"


def test_every_python_producer_waits_for_the_replicas_and_is_idempotent() -> None:
    from cdc.apply.dead_letters import producer_config

    kafka = _kafka(**CLUSTER).kafka
    for config in (kafka_producer_kwargs(kafka), producer_config(kafka)):
        assert config["acks"] == "all" and config["enable_idempotence"] is True
        assert set(config) <= set(KafkaProducer.DEFAULT_CONFIG)


def _topic(name: str, *replicas: list[int]) -> dict[str, Any]:
    return {
        "name": name,
        "error_code": 0,
        "partitions": [
            {"partition_index": i, "replica_nodes": nodes} for i, nodes in enumerate(replicas)
        ],
    }


def test_a_topics_replication_factor_is_its_fewest_replicas() -> None:
    described = [_topic("a", [1, 2, 3], [2]), _topic("b", [1, 2], [2, 3]), _topic("c")]
    assert replication_factors(described) == {"a": 1, "b": 2}


def test_the_plan_keeps_each_partitions_replicas_and_spreads_the_new_ones() -> None:
    described = [_topic("t", [1], [2], [3]), _topic("u", [1, 2, 3])]
    plan = reassignment_plan(described, [1, 2, 3, 4], 3)
    assert plan["version"] == 1
    moves = {(m["topic"], m["partition"]): m["replicas"] for m in plan["partitions"]}
    assert set(moves) == {("t", 0), ("t", 1), ("t", 2)}  # u has its 3 already
    for (_, partition), replicas in moves.items():
        assert replicas[0] == partition + 1  # the leader stays first
        assert len(set(replicas)) == 3
    added = [b for r in moves.values() for b in r[1:]]
    # broker 4 held nothing: it takes the most; none takes more than 3 of the 6 new copies
    assert added.count(4) == 3 and max(added.count(b) for b in (1, 2, 3)) <= 3


def test_status_says_how_to_raise_the_replicas_in_place(tmp_path: Path) -> None:
    kafka = _kafka(**CLUSTER, bootstrap_servers="k1:9092,k2:9092").kafka
    plan = tmp_path / "kafka-replicas.json"
    line = replication_problem(kafka, ["cdc.public.a", "cdc.dlq"], plan, 3)
    assert "\n" not in line
    assert "2 pipeline topic(s) (cdc.public.a, cdc.dlq)" in line
    assert "kafka.replication_factor 3" in line
    assert (
        "`kafka-reassign-partitions.sh --bootstrap-server k1:9092,k2:9092 "
        f"--reassignment-json-file {plan} --execute`, then `cdc setup`"
    ) in line
    assert "never recreate" in line
    short = replication_problem(kafka, [f"t{i}" for i in range(5)], None, 2)
    assert "t0, t1, t2 and 2 more" in short and "has 2 broker(s): add brokers" in short


def test_a_login_is_never_in_the_line(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    kafka = _kafka(
        **CLUSTER,
        security_protocol="SASL_SSL",
        username="u",
        password="s3cret-pw",
        ca_file=str(ca),
    ).kafka
    line = replication_problem(kafka, ["t"], tmp_path / "p.json", 3)
    assert "s3cret-pw" not in line and "--command-config <your client properties>" in line


def test_fenced_brokers_do_not_count() -> None:
    cluster = {
        "brokers": [
            {"broker_id": 2, "is_fenced": False},
            {"broker_id": 1, "is_fenced": False},
            {"broker_id": 3, "is_fenced": True},
        ]
    }
    assert live_brokers(cluster) == [1, 2]
