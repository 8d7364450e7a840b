"""`posture = "production"`: one setting that refuses every component left without TLS
or a login (the default local stack trusts everyone who reaches 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc.core.errors import ConfigError
from cdc.core.settings import load_settings

pytestmark = pytest.mark.usefixtures("clean_env")


def secure(tmp_path: Path) -> dict[str, Any]:
    """Settings of a production deployment: every component its own, over TLS, with a login."""
    (tmp_path / "ca.pem").write_text("a CA")  # only its presence is checked here
    ca = str(tmp_path / "ca.pem")
    return {
        "posture": "production",
        "postgres": {
            "managed": False,
            "password": "a long one",
            "sslmode": "verify-full",
            "ca_file": ca,
        },
        "kafka": {
            "managed": False,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "username": "cdc",
            "password": "kafka-secret",
            "ca_file": ca,
        },
        "connect": {"managed": False, "username": "cdc", "password": "rest-secret"},
        "redis": {"managed": False, "tls": True, "ca_file": ca, "password": "redis-secret"},
        "opensearch": {
            "managed": False,
            "tls": True,
            "ca_file": ca,
            "username": "cdc",
            "password": "os-secret",
        },
    }


def test_the_default_local_stack_is_not_production() -> None:
    assert load_settings().posture == "local"
    with pytest.raises(ConfigError) as refused:
        load_settings(posture="production")
    message = str(refused.value)
    assert "\n" not in message
    for needed in (
        "postgres.sslmode = verify-full",
        "kafka.security_protocol = SASL_SSL",
        "redis.tls and redis.password",
        "opensearch.tls, .username and .password",
    ):
        assert needed in message


def test_a_deployment_with_tls_and_logins_everywhere_is_accepted(tmp_path: Path) -> None:
    assert load_settings(**secure(tmp_path)).posture == "production"


@pytest.mark.parametrize(
    ("section", "change", "named"),
    [
        ("postgres", {"sslmode": "require", "ca_file": None}, "postgres.sslmode"),
        ("postgres", {"password": "postgres"}, "postgres.password"),
        (
            "kafka",
            {"security_protocol": "SASL_PLAINTEXT", "ca_file": None},
            "kafka.security_protocol",
        ),
        ("kafka", {"security_protocol": "SSL", "username": None, "password": None}, "kafka"),
        ("connect", {"inline_secrets": True}, "connect.inline_secrets"),
        ("connect", {"username": None, "password": None}, "connect.username"),
        ("connect", {"host": "connect.internal"}, "connect.host"),
        ("redis", {"password": None}, "redis.tls and redis.password"),
        ("redis", {"tls": False, "ca_file": None}, "redis.tls and redis.password"),
        ("opensearch", {"tls": False}, "opensearch.tls"),
    ],
)
def test_each_gap_is_named_in_one_line_without_its_secret(
    tmp_path: Path, section: str, change: dict[str, Any], named: str
) -> None:
    settings = secure(tmp_path)
    settings[section] = {**settings[section], **change}
    if section == "opensearch" and change.get("tls") is False:
        settings[section] = {"managed": False, "tls": False}  # no password without TLS
    with pytest.raises(ConfigError, match="posture = production needs") as refused:
        load_settings(**settings)
    message = str(refused.value)
    assert named in message and "\n" not in message
    for secret in ("a long one", "kafka-secret", "rest-secret", "redis-secret", "os-secret"):
        assert secret not in message


def test_a_store_left_out_needs_nothing(tmp_path: Path) -> None:
    settings = secure(tmp_path)
    settings["redis"] = {"managed": False}
    settings["opensearch"] = {"managed": False}
    settings["apply"] = {"stores": ["warehouse"]}
    assert load_settings(**settings).apply.stores == ["warehouse"]


def test_the_posture_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_POSTURE", "production")
    with pytest.raises(ConfigError, match="posture = production needs"):
        load_settings()
    monkeypatch.setenv("CDC_POSTURE", "staging")
    with pytest.raises(ConfigError, match="invalid setting posture"):
        load_settings()
