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
        ("connect", {"host": "connect.internal"}, "connect.tls = true"),
        ("connect", {"hosts": ["127.0.0.1:8083", "c2.internal:8083"]}, "c2.internal"),
        (
            "connect",
            {"hosts": ["c1.internal:8083"], "tls": True, "username": None, "password": None},
            "connect.username",
        ),
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


def test_a_remote_connect_group_over_https_with_a_login_is_accepted(tmp_path: Path) -> None:
    settings = secure(tmp_path)
    settings["connect"] = {
        **settings["connect"],
        "hosts": "c1.internal:8083,c2.internal:8083",
        "tls": True,
        "ca_file": str(tmp_path / "ca.pem"),
    }
    connect = load_settings(**settings).connect
    assert connect.urls == ("https://c1.internal:8083", "https://c2.internal:8083")


def test_a_remote_connect_over_http_is_refused_with_what_to_do(tmp_path: Path) -> None:
    settings = secure(tmp_path)
    settings["connect"] = {**settings["connect"], "hosts": ["c1.internal:8083"]}
    with pytest.raises(ConfigError) as refused:
        load_settings(**settings)
    message = str(refused.value)
    assert "\n" not in message and "rest-secret" not in message
    assert "connect.tls = true (https, with ca_file) for the workers on other hosts" in message
    assert "(c1.internal)" in message
