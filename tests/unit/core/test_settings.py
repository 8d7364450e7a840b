from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from tests.helpers import run_cdc

pytestmark = pytest.mark.usefixtures("clean_env")


def test_defaults_do_not_collide_with_system_services() -> None:
    s = load_settings()
    ports = [
        s.postgres.port,
        s.kafka.port,
        s.kafka.controller_port,
        s.connect.port,
        s.opensearch.port,
        s.opensearch.transport_port,
        s.redis.port,
    ]
    assert len(set(ports)) == len(ports)
    assert not {5432, 9092, 9093, 8083, 9200, 9300, 6379} & set(ports)


def test_environment_overrides_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_KAFKA__PORT", "19092")
    monkeypatch.setenv("CDC_POSTGRES__MANAGED", "false")
    s = load_settings()
    assert s.kafka.port == 19092
    assert s.kafka.bootstrap == "127.0.0.1:19092"
    assert s.postgres.managed is False


def test_file_then_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "cdc.toml").write_text("[redis]\nport = 16379\n[kafka]\nport = 19000\n")
    monkeypatch.setenv("CDC_KAFKA__PORT", "19001")
    s = load_settings()
    assert s.redis.port == 16379  # from the file
    assert s.kafka.port == 19001  # the environment wins over the file


def test_cdc_config_names_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    named = tmp_path / "other.toml"
    named.write_text("[connect]\nport = 18083\n")
    monkeypatch.setenv("CDC_CONFIG", str(named))
    assert load_settings().connect.url == "http://127.0.0.1:18083"
    monkeypatch.setenv("CDC_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="not a file"):
        load_settings()


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.kafka.port = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        s.data_dir = Path("/elsewhere")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("CDC_KAFKA__PORT", "70000", "kafka.port"),
        ("CDC_CONNECT__HEAP", "lots", "connect.heap"),
        ("CDC_REDIS__PORT", "six", "redis.port"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "\n" not in message
    assert expected in message and name in message


def test_an_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cdc.toml").write_text("[kafka]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"kafka\.prot"):
        load_settings()


def test_secrets_are_masked_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_POSTGRES__PASSWORD", "s3cret-value")
    monkeypatch.setenv("CDC_REDIS__PASSWORD", "other-s3cret")
    s = load_settings()
    assert s.postgres.password.get_secret_value() == "s3cret-value"
    for text in (repr(s), str(s), str(s.masked())):
        assert "s3cret" not in text
    assert s.masked()["postgres"]["password"] == "**********"


def test_cdc_config_prints_settings_without_secrets() -> None:
    result = run_cdc("config", env={"CDC_POSTGRES__PASSWORD": "s3cret-value"})
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    assert "**********" in result.stdout and "55432" in result.stdout


def test_a_bad_setting_stops_the_cli_with_one_line() -> None:
    result = run_cdc("status", env={"CDC_KAFKA__PORT": "0"})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "kafka.port" in result.stderr and "CDC_KAFKA__PORT" in result.stderr


def test_paths_are_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDC_DATA_DIR", "relative/data")
    assert Settings().data_dir == tmp_path / "relative" / "data"


def test_a_home_folder_of_a_user_this_machine_lacks_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pathlib raises RuntimeError for `~nosuchuser`: a setting says so instead
    for name, value in (
        ("CDC_DATA_DIR", "~nosuchuser-cdc/data"),
        ("CDC_CONNECT__CA_FILE", "~0/ca"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValidationError, match="home folder of a user this machine"):
            Settings()
        monkeypatch.delenv(name)
    monkeypatch.setenv("CDC_CONFIG", "~nosuchuser-cdc/cdc.toml")
    with pytest.raises(ConfigError, match=r"CDC_CONFIG: .* home folder of a user"):
        load_settings()
