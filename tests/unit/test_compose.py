"""docker-compose.yml runs the same stack that cdc.compose.toml points `cdc` at.

No Docker engine runs here, so the file is checked for what `cdc` relies on.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from cdc.components.connect import CONVERTERS
from cdc.settings import Settings
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose_settings() -> Settings:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CDC_")}
    os.environ["CDC_CONFIG"] = str(ROOT / "cdc.compose.toml")
    try:
        return Settings()
    finally:
        del os.environ["CDC_CONFIG"]
        os.environ.update(saved)


def host_port(service: dict[str, Any], container_port: int) -> int:
    for mapping in service["ports"]:
        host, container = str(mapping).rsplit(":", 1)
        if int(container) == container_port:
            return int(host.rsplit(":", 1)[-1])
    raise AssertionError(f"container port {container_port} is not published")


def test_every_component_is_a_service_with_a_healthcheck(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "kafka", "connect", "opensearch", "redis"}
    for name, service in compose["services"].items():
        assert service["healthcheck"]["test"], name
        assert service["image"], name


def test_state_lives_in_named_volumes(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name in ("postgres", "kafka", "opensearch", "redis"):
        volumes = compose["services"][name]["volumes"]
        assert {v.split(":", 1)[0] for v in volumes} <= declared, name


def test_published_ports_are_the_ones_cdc_compose_toml_uses(
    compose: dict[str, Any], compose_settings: Settings
) -> None:
    s = compose["services"]
    assert host_port(s["postgres"], 5432) == compose_settings.postgres.port
    assert host_port(s["kafka"], 59092) == compose_settings.kafka.port
    assert host_port(s["connect"], 8083) == compose_settings.connect.port
    assert host_port(s["opensearch"], 9200) == compose_settings.opensearch.port
    assert host_port(s["redis"], 6379) == compose_settings.redis.port
    # Kafka tells host clients to come back on the published port
    assert (
        f"localhost:{compose_settings.kafka.port}"
        in s["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    )


def test_cdc_treats_every_compose_service_as_external(compose_settings: Settings) -> None:
    for section in ("postgres", "kafka", "connect", "opensearch", "redis"):
        assert getattr(compose_settings, section).managed is False, section
    # Connect reaches PostgreSQL inside the compose network
    assert compose_settings.postgres.connector_host == "postgres"
    assert compose_settings.postgres.connector_port == 5432


def test_postgres_decodes_logically(compose: dict[str, Any], compose_settings: Settings) -> None:
    service = compose["services"]["postgres"]
    assert "wal_level=logical" in service["command"]
    env = service["environment"]
    assert env["POSTGRES_DB"] == compose_settings.postgres.database
    assert env["POSTGRES_USER"] == compose_settings.postgres.user
    assert env["POSTGRES_PASSWORD"] == compose_settings.postgres.password.get_secret_value()


def test_kafka_runs_kraft_without_topic_auto_creation(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_connect_writes_the_same_bytes_as_the_local_worker(
    compose: dict[str, Any], compose_settings: Settings
) -> None:
    env = compose["services"]["connect"]["environment"]
    assert env["GROUP_ID"] == compose_settings.connect.group_id
    assert env["KEY_CONVERTER"] == CONVERTERS["key.converter"]
    assert env["VALUE_CONVERTER"] == CONVERTERS["value.converter"]
    assert env["CONNECT_KEY_CONVERTER_SCHEMAS_ENABLE"] == CONVERTERS["key.converter.schemas.enable"]
    assert (
        env["CONNECT_VALUE_CONVERTER_SCHEMAS_ENABLE"]
        == CONVERTERS["value.converter.schemas.enable"]
    )
    assert env["BOOTSTRAP_SERVERS"].startswith("kafka:")
    assert "debezium/connect" in compose["services"]["connect"]["image"]
