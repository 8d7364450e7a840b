"""docker-compose.yml runs the same stack that cdc.compose.toml points `cdc` at.

No Docker engine runs here, so the file is checked for what `cdc` relies on, and for
what keeps it safe on a laptop: ports on 127.0.0.1 only, passwords from an `.env` that is
never committed, images pinned by digest (or saying how to pin them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from typing import Any

import pytest
import yaml

from cdc.core.settings import Settings
from cdc.stack.components.connect import CONVERTERS
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


# what a person puts in .env (and exports for cdc: `set -a; . ./.env; set +a`)
DOT_ENV = {"CDC_POSTGRES__PASSWORD": "pg pass 'quoted'", "CDC_REDIS__PASSWORD": "redis-pass-1"}
REQUIRED = re.compile(r"^\$\{(?P<name>[A-Z][A-Z0-9_]*):\?[^}]+\}$")


@pytest.fixture(scope="module")
def compose_settings() -> Settings:
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("CDC_")}
    os.environ.update(DOT_ENV, CDC_CONFIG=str(ROOT / "cdc.compose.toml"))
    try:
        return Settings()
    finally:
        for name in ["CDC_CONFIG", *DOT_ENV]:
            del os.environ[name]
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


def test_connect_loads_the_transform_and_signal_actions_the_install_builds(
    compose: dict[str, Any],
) -> None:
    transforms, signals = compose["services"]["connect"]["volumes"]
    host, inside, _ = transforms.split(":")
    assert host == "./.cache/jvm/connect-plugins/cdc-transforms"
    assert inside.startswith("/kafka/connect/")  # the image's plugin.path
    assert (ROOT / host / "cdc-transforms-1.jar").exists(), "run ./install.sh"
    # the signal actions go into Debezium's own folder (its class loader finds them)
    host, inside, _ = signals.split(":")
    assert host == "./.cache/jvm/connect-plugins/debezium-connector-postgres/cdc-signals-1.jar"
    assert inside == "/kafka/connect/debezium-connector-postgres/cdc-signals-1.jar"
    assert (ROOT / host).exists(), "run ./install.sh"


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
    # as the local stack: a slot nobody reads cannot fill the disk
    assert (
        f"max_slot_wal_keep_size={Settings().postgres.max_slot_wal_keep_size}" in service["command"]
    )
    env = service["environment"]
    assert env["POSTGRES_DB"] == compose_settings.postgres.database
    assert env["POSTGRES_USER"] == compose_settings.postgres.user
    # the container's password and cdc's are the same variable of .env
    required = REQUIRED.match(env["POSTGRES_PASSWORD"])
    assert required, env["POSTGRES_PASSWORD"]
    assert compose_settings.postgres.password.get_secret_value() == DOT_ENV[required["name"]]


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


def test_every_published_port_is_on_loopback_only(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            assert str(mapping).startswith("127.0.0.1:"), f"{name} publishes {mapping}"


def test_no_password_is_written_in_the_compose_files(compose: dict[str, Any]) -> None:
    """Every password in the compose file is a required variable of .env (compose stops
    with its name when it is unset or empty); cdc.compose.toml holds none."""
    secret = re.compile(r"PASS|SECRET|TOKEN|CREDENTIAL", re.IGNORECASE)
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if secret.search(key):
                assert REQUIRED.match(str(value)), f"{name}: {key} is written in the file"

    def keys(table: dict[str, Any]) -> list[str]:
        found = []
        for key, value in table.items():
            if isinstance(value, dict):
                found += keys(value)
            elif not isinstance(value, bool):  # a switch (inline_secrets) holds no secret
                found.append(key)
        return found

    settings_keys = keys(tomllib.loads((ROOT / "cdc.compose.toml").read_text()))
    assert not [k for k in settings_keys if secret.search(k)], settings_keys


def test_env_example_names_every_variable_with_no_value(compose: dict[str, Any]) -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):\?", text))
    assert used == set(DOT_ENV), used
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert set(example) == used
    # placeholders only: a copied, unedited .env.example makes compose stop, not run
    assert all(value.strip() == "" for value in example.values()), example


def test_redis_admits_only_its_acl_user(
    compose: dict[str, Any], compose_settings: Settings
) -> None:
    service = compose["services"]["redis"]
    required = REQUIRED.match(service["environment"]["REDIS_PASSWORD"])
    assert required and required["name"] == "CDC_REDIS__PASSWORD"
    script = "\n".join(service["command"])
    user = compose_settings.redis.username
    assert user, "cdc.compose.toml names the Redis ACL user"
    assert "user default off" in script
    assert f"user {user} on >$$REDIS_PASSWORD " in script
    # the password reaches redis-server on stdin, not in its arguments
    assert re.search(r"redis-server - .*<<", script), script
    assert compose_settings.redis.password is not None
    assert compose_settings.redis.password.get_secret_value() == DOT_ENV["CDC_REDIS__PASSWORD"]
    assert f"--user {user}" in service["healthcheck"]["test"][1]


def test_every_image_is_pinned_by_digest_or_says_how(compose: dict[str, Any]) -> None:
    lines = (ROOT / "docker-compose.yml").read_text().splitlines()
    images = [
        (i, line.split("image:", 1)[1].strip())
        for i, line in enumerate(lines)
        if line.strip().startswith("image:")
    ]
    assert len(images) == len(compose["services"])
    for i, image in images:
        if re.fullmatch(r"[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}", image):
            continue
        assert ":" in image and "@" not in image, image
        assert lines[i - 1].strip() == f"# pin: docker buildx imagetools inspect {image}", (
            f"{image} is neither pinned by digest nor says how to pin it (make compose-pin)"
        )
    assert "\ncompose-pin:" in (ROOT / "Makefile").read_text()


def test_dot_env_is_ignored_and_not_tracked() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        assert ".env" in (ROOT / ".gitignore").read_text().splitlines()
        return
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".env is not in .gitignore"
    tracked = subprocess.run(
        ["git", "ls-files", "--", ".env"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert tracked.stdout == "", ".env is committed"
    # the example is what is shipped
    assert (ROOT / ".env.example").is_file()
