"""Kafka's security settings and what every client is given from them: kafka-python's
keyword arguments, Spark's options and the Connect worker's properties (its own clients
and its connectors' producer, consumer and admin clients, Debezium's among them)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from cdc.core.clients import kafka_client_kwargs
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import kafka_options
from cdc.stack.components.connect import Connect

PASSWORD = 'pw "q" \\ x'


def _files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for what, name in (("ca", "ca.crt"), ("crt", "kafka.crt"), ("key", "kafka.key")):
        (tmp_path / name).write_text("PEM\n")
        files[what] = str(tmp_path / name)
    return files


def _prepare(worker: Connect) -> None:
    worker.state_dir.mkdir(parents=True)  # as Component.start does
    worker.prepare()


def _sasl_ssl(tmp_path: Path, **kafka: Any) -> Settings:
    files = _files(tmp_path)
    return load_settings(
        data_dir=str(tmp_path / "data"),
        kafka={
            "security_protocol": "SASL_SSL",
            "username": "cdc_app",
            "password": PASSWORD,
            "ca_file": files["ca"],
            "cert_file": files["crt"],
            "key_file": files["key"],
            **kafka,
        },
    )


@pytest.mark.parametrize(
    ("kafka", "says"),
    [
        ({"security_protocol": "SASL_SSL", "managed": False}, "needs a kafka username"),
        ({"username": "u", "password": "p"}, "set it to SASL_SSL"),
        ({"security_protocol": "SSL"}, "set kafka cert_file and key_file"),
        ({"security_protocol": "SSL", "cert_file": "{crt}"}, "go together"),
        ({"ca_file": "{ca}"}, "set it to SSL or SASL_SSL"),
        ({"security_protocol": "SSL", "managed": False, "ca_file": "/no/such.pem"}, "not a file"),
        (
            {"security_protocol": "SASL_PLAINTEXT", "username": "u", "password": "p"}
            | {"sasl_mechanism": "PLAIN"},
            "authenticates with SCRAM",
        ),
        (
            {"security_protocol": "SASL_PLAINTEXT", "username": "a,b", "password": "p"},
            "letters, digits",
        ),
    ],
)
def test_a_bad_combination_is_one_line(tmp_path: Path, kafka: dict[str, Any], says: str) -> None:
    files = _files(tmp_path)
    kafka = {k: v.format(**files) if isinstance(v, str) else v for k, v in kafka.items()}
    with pytest.raises(ConfigError, match=says) as caught:
        load_settings(kafka=kafka)
    assert "\n" not in str(caught.value)
    assert "p'" not in str(caught.value) and PASSWORD not in str(caught.value)


def test_an_external_broker_with_sasl_ssl_and_the_system_trust_store() -> None:
    section = load_settings(
        kafka={
            "managed": False,
            "host": "kafka.example.com",
            "port": 9096,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "username": "app",
            "password": "secret",
        }
    ).kafka
    assert kafka_client_kwargs(section) == {
        "bootstrap_servers": "kafka.example.com:9096",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "app",
        "sasl_plain_password": "secret",
        "ssl_check_hostname": True,
    }


def test_plaintext_by_default() -> None:
    settings = load_settings()
    assert kafka_client_kwargs(settings.kafka) == {
        "bootstrap_servers": settings.kafka.bootstrap,
        "security_protocol": "PLAINTEXT",
    }
    assert kafka_options(settings) == {
        "kafka.bootstrap.servers": settings.kafka.bootstrap,
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_spark_gets_the_login_and_the_ca_as_a_pem_trust_store(tmp_path: Path) -> None:
    settings = _sasl_ssl(tmp_path)
    options = kafka_options(settings)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == str(tmp_path / "ca.crt")
    # JAAS quoting: the quote and the backslash of the password are escaped
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="cdc_app" password="pw \\"q\\" \\\\ x";'
    )


def test_the_worker_and_its_connectors_clients_log_in_from_a_secrets_file(
    tmp_path: Path,
) -> None:
    settings = _sasl_ssl(tmp_path)
    _prepare(Connect(settings))
    properties = (settings.data_dir / "connect" / "worker.properties").read_text()
    assert "pw " not in properties  # the password is not in worker.properties
    values = dict(line.split("=", 1) for line in properties.splitlines())
    login = settings.data_dir / "connect" / "secrets" / "kafka.properties"
    for prefix in ("", "producer.", "consumer.", "admin."):
        assert values[f"{prefix}security.protocol"] == "SASL_SSL"
        assert values[f"{prefix}sasl.mechanism"] == "SCRAM-SHA-512"
        assert values[f"{prefix}sasl.jaas.config"] == f"${{file:{login}:sasl.jaas.config}}"
        assert values[f"{prefix}ssl.truststore.type"] == "PEM"
        assert values[f"{prefix}ssl.truststore.location"] == str(tmp_path / "ca.crt")
    assert values["config.providers"] == "file"
    assert stat.S_IMODE(login.stat().st_mode) == 0o600
    assert stat.S_IMODE(login.parent.stat().st_mode) == 0o700
    # java.util.Properties reads the backslash back as one
    assert login.read_text() == (
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="cdc_app" password="pw \\\\"q\\\\" \\\\\\\\ x";\n'
    )


def test_a_plaintext_worker_has_no_login(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path / "data"))
    _prepare(Connect(settings))
    properties = (settings.data_dir / "connect" / "worker.properties").read_text()
    assert "sasl" not in properties
    assert not (settings.data_dir / "connect" / "secrets" / "kafka.properties").exists()
