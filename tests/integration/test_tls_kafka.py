"""Kafka over SASL_SSL (SCRAM-SHA-512): the local broker started with a certificate the
test's own CA signed and a SCRAM user created when its storage was formatted.

cdc's kafka-python clients (admin, producer, consumer), the Connect worker and Spark's
Kafka source and sink work through the settings; plain-text, TLS-without-login,
wrong-password and wrong-CA clients are refused; the password is in no file under the
data dir but the 0600 secrets files, and on no `ps` line. A Debezium run over SASL_SSL is
not started here (it needs PostgreSQL too): tests/unit/core/test_kafka_security.py checks that
the worker hands the same login to its connectors' producer, consumer and admin clients.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError
from pydantic import SecretStr

from cdc.core.clients import kafka_admin, kafka_client_kwargs
from cdc.core.errors import ComponentError
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import kafka_options, spark_session
from cdc.core.topics import TopicSpec, end_offsets, ensure_topics, read_topic
from cdc.stack.components._jvm import java, kafka_lib
from cdc.stack.components.connect import Connect
from cdc.stack.components.kafka import Kafka
from tests import tls
from tests.helpers import free_ports

TOKEN = "kafkaPw7f3q"  # found in any copy of the password, however it was escaped
PASSWORD = TOKEN + ' "q" \\ ,]= #1'  # quotes, a backslash, SCRAM and JAAS separators
USER = "cdc_app"
TOPIC = "tls.items"


@pytest.fixture(scope="module")
def tls_kafka() -> Iterator[tuple[Settings, tls.TestCA]]:
    root = Path(tempfile.mkdtemp(prefix="cdc-tls-kafka-"))
    root.chmod(0o755)  # the Connect worker runs as the service user
    try:
        ca = tls.make_ca(root / "ca")
        server = ca.server_cert("kafka")
        kafka_port, controller_port, connect_port = free_ports(3)
        settings = load_settings(
            data_dir=str(root / "data"),
            kafka={
                "port": kafka_port,
                "controller_port": controller_port,
                "heap": "512m",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "username": USER,
                "password": PASSWORD,
                "ca_file": str(ca.ca_file),
                "cert_file": str(server.cert_file),
                "key_file": str(server.key_file),
            },
            connect={"port": connect_port, "heap": "512m", "group_id": "cdc-tls"},
            spark={"driver_memory": "1g", "shuffle_partitions": 1},
        )
        broker = Kafka(settings)
        try:
            broker.start()  # waits until cdc's own admin client (SASL_SSL) sees the broker
            ensure_topics(settings.kafka, [TopicSpec(TOPIC, 2, {})])
            producer = KafkaProducer(**kafka_client_kwargs(settings.kafka), acks="all")
            try:
                for i in range(3):
                    producer.send(TOPIC, key=f"{i}".encode(), value=f"row {i}".encode())
                producer.flush()
            finally:
                producer.close()
            yield settings, ca
        finally:
            broker.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def assert_password_hidden(settings: Settings) -> None:
    """The password is on no command line, and under the data dir only in the secrets
    files, each of mode 0600."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert TOKEN not in ps.stdout
    holders = []
    for path in settings.data_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and TOKEN.encode() in path.read_bytes():
            holders.append(path)
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert {p.relative_to(settings.data_dir).as_posix() for p in holders} <= {
        "kafka/secrets/broker.properties",
        "connect/secrets/kafka.properties",
    }
    assert not (settings.data_dir / "kafka" / "secrets" / "format.args").exists()
    for log in settings.data_dir.rglob("*.log"):
        assert TOKEN not in log.read_text(errors="replace"), log


def test_cdc_clients_work_over_sasl_ssl(tls_kafka: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_kafka
    status = Kafka(settings).status()
    assert status.up, status.error
    assert status.details["topics"] >= 1
    records = read_topic(settings.kafka, TOPIC, timeout=60)
    assert sorted(r.value_bytes for r in records) == [b"row 0", b"row 1", b"row 2"]
    assert sum(end_offsets(settings.kafka, [TOPIC])[TOPIC].values()) == 3
    properties = (settings.data_dir / "kafka" / "server.properties").read_text()
    assert "listeners=SASL_SSL://127.0.0.1:" in properties
    assert "PLAINTEXT://" not in properties.replace("CONTROLLER://", "")
    assert_password_hidden(settings)


def test_plaintext_unauthenticated_wrong_password_and_wrong_ca_are_refused(
    tls_kafka: tuple[Settings, tls.TestCA],
) -> None:
    settings, ca = tls_kafka
    good = kafka_client_kwargs(settings.kafka)
    other_ca = tls.make_ca(ca.directory / "other", "another-ca")
    attempts = {
        "plaintext": {"bootstrap_servers": good["bootstrap_servers"]},
        "tls without a login": {
            "bootstrap_servers": good["bootstrap_servers"],
            "security_protocol": "SSL",
            "ssl_cafile": str(ca.ca_file),
        },
        "wrong password": {**good, "sasl_plain_password": PASSWORD + "x"},
        "wrong CA": {**good, "ssl_cafile": str(other_ca.ca_file)},
    }
    for what, kwargs in attempts.items():
        with pytest.raises(KafkaError):
            admin = KafkaAdminClient(**kwargs, request_timeout_ms=3000, bootstrap_timeout_ms=5000)
            try:
                admin.list_topics()
            finally:
                admin.close()
            pytest.fail(f"a client with {what} was let in")
    log = (settings.data_dir / "kafka" / "kafka.log").read_text(errors="replace")
    assert "invalid credentials" in log  # the wrong password reached SCRAM and failed there


def test_connect_worker_runs_over_sasl_ssl(tls_kafka: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_kafka
    worker = Connect(settings)
    try:
        worker.start()  # ready once the worker joined its group: its clients log in
        admin = kafka_admin(settings.kafka)
        try:
            topics = set(admin.list_topics())
        finally:
            admin.close()
        assert {"_cdc-tls-configs", "_cdc-tls-offsets", "_cdc-tls-status"} <= topics
        assert worker.client().connectors() == {}
        properties = (settings.data_dir / "connect" / "worker.properties").read_text()
        assert "producer.sasl.jaas.config=${file:" in properties
        assert_password_hidden(settings)
    finally:
        worker.stop()


def test_spark_reads_and_writes_over_sasl_ssl(tls_kafka: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_kafka
    spark = spark_session(settings, "cdc-tls-kafka")
    try:
        read = (
            spark.read.format("kafka")
            .options(**kafka_options(settings))
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
        )
        assert sorted(bytes(r.value) for r in read.collect()) == [b"row 0", b"row 1", b"row 2"]
        # as executors on other machines read: the CA's text in the options, not its path
        inline = kafka_options(settings, inline_ca=True)
        assert "kafka.ssl.truststore.location" not in inline
        read = spark.read.format("kafka").options(**inline).option("subscribe", TOPIC)
        rows = read.option("startingOffsets", "earliest").load().collect()
        assert sorted(bytes(r.value) for r in rows) == [b"row 0", b"row 1", b"row 2"]
        ensure_topics(settings.kafka, [TopicSpec("tls.written", 1, {})])
        (
            spark.createDataFrame([("k", "from spark")], "key string, value string")
            .write.format("kafka")
            .options(**kafka_options(settings))
            .option("topic", "tls.written")
            .save()
        )
        assert_password_hidden(settings)
    finally:
        spark.stop()
    assert [r.value_bytes for r in read_topic(settings.kafka, "tls.written", 60)] == [b"from spark"]


def test_another_password_is_refused_before_any_file_changes(
    tls_kafka: tuple[Settings, tls.TestCA],
) -> None:
    settings, _ = tls_kafka
    other = settings.kafka.model_copy(update={"password": SecretStr("another password")})
    changed = settings.model_copy(update={"kafka": other})
    login = settings.data_dir / "kafka" / "secrets" / "broker.properties"
    before = login.read_bytes()
    with pytest.raises(ComponentError, match=f"user '{USER}'"):
        Kafka(changed).prepare()
    assert login.read_bytes() == before


def test_the_controller_listener_lets_no_stranger_change_a_topic(
    tls_kafka: tuple[Settings, tls.TestCA],
) -> None:
    """KIP-919 lets an admin client talk to the controller itself (`--bootstrap-controller`):
    without a login there, any local user could change a topic's settings (here a
    retention of 1 ms, which deletes every event) or the broker's. The attempt fails and
    the topic keeps its settings."""
    settings, _ = tls_kafka
    options = settings.data_dir.parent / "stranger.properties"
    options.write_text("request.timeout.ms=5000\ndefault.api.timeout.ms=15000\n")
    attempt = subprocess.run(
        [
            str(java(settings)),
            "-cp",
            str(kafka_lib(settings) / "*"),
            "kafka.admin.ConfigCommand",
            "--bootstrap-controller",
            f"127.0.0.1:{settings.kafka.controller_port}",
            "--command-config",
            str(options),
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            TOPIC,
            "--add-config",
            "retention.ms=1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert attempt.returncode != 0, attempt.stdout + attempt.stderr
    admin = kafka_admin(settings.kafka)
    try:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, TOPIC)])
    finally:
        admin.close()
    (changed,) = described.values()
    assert "retention.ms" not in changed[TOPIC], changed  # the settings it had: none changed
    assert sorted(r.value_bytes for r in read_topic(settings.kafka, TOPIC, timeout=60)) == [
        b"row 0",
        b"row 1",
        b"row 2",
    ]
    properties = (settings.data_dir / "kafka" / "server.properties").read_text()
    assert "CONTROLLER:SASL_PLAINTEXT" in properties
    assert "StandardAuthorizer" in properties
