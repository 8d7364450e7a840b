"""Secrets stay where they belong: masked in what cdc shows, left out of what it hands on."""

from __future__ import annotations

import os
import pickle

from pydantic import SecretStr

from cdc.core.settings import load_settings
from cdc.stack.process import inherited_env
from cdc.stores.registry import executor_settings


def test_spark_conf_values_that_name_a_secret_are_masked() -> None:
    conf = {
        "spark.hadoop.fs.s3a.secret.key": "s3-secret-1",
        "spark.hadoop.fs.s3a.access.key": "s3-access-1",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "azure-key-1",
        "spark.kafka.sasl.jaas.config": "jaas-password-1",
        "spark.sql.shuffle.partitions": "7",
    }
    masked = load_settings(spark={"conf": conf}).masked()["spark"]["conf"]
    assert masked["spark.sql.shuffle.partitions"] == "7"
    for key, value in conf.items():
        if key != "spark.sql.shuffle.partitions":
            assert masked[key] == "**********" and value not in str(masked)


def test_python_workers_get_only_their_own_stores_secret() -> None:
    settings = load_settings(
        postgres={"password": "admin-pw-1"},
        redis={"password": "redis-pw-1"},
        pipeline={"replication_password": "repl-pw-1"},
        spark={"conf": {"spark.hadoop.fs.s3a.secret.key": "s3-secret-1"}},
    )
    shipped = pickle.dumps(executor_settings(settings, "cache"))
    assert b"redis-pw-1" in shipped  # the cache's own
    for secret in (b"admin-pw-1", b"repl-pw-1", b"s3-secret-1"):
        assert secret not in shipped
    search = executor_settings(settings, "search")
    assert search.redis.password is None or search.redis.password.get_secret_value() == ""
    assert search.opensearch == settings.opensearch
    assert isinstance(search.postgres.password, SecretStr)


def test_components_do_not_inherit_cdc_settings(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CDC_POSTGRES__PASSWORD", "admin-pw-2")
    monkeypatch.setenv("PATH", os.environ.get("PATH", "/usr/bin"))
    env = inherited_env()
    assert "CDC_POSTGRES__PASSWORD" not in env and "PATH" in env


def test_a_value_cannot_drive_the_terminal_nor_be_markup() -> None:
    """A row value with ESC sequences (a window title, OSC 52 to the clipboard) reached
    the terminal as it was; a column named `[/x]` crashed the table as markup."""
    import io

    from rich.console import Console

    from cdc.cli.output import Output, RowsForm

    screen = io.StringIO()
    out = Output(RowsForm.text, Console(file=screen, width=200, force_terminal=True))
    out.rows(["id", "[/x]"], [[1, "\x1b]0;PWNED\x07\x1b]52;c;aGk=\x07 [bold]b[/bold]"]])
    text = screen.getvalue()
    assert "\x1b]" not in text and "\x07" not in text
    assert "\\x1b]0;PWNED\\x07" in text and "[bold]b[/bold]" in text and "[/x]" in text
