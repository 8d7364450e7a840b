"""No secret cdc holds shows up anywhere a person or another process could read it."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest

from cdc.capture.connect_client import connect_client
from cdc.capture.role import replication_password
from cdc.capture.source_setup import prepare_source
from tests.conftest import Capture
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration


def _logs(data_dir: Path) -> dict[Path, str]:
    found = {}
    for path in data_dir.rglob("*"):
        if path.is_file() and (path.suffix in (".log", ".out") or "log" in path.parent.name):
            found[path] = path.read_text(errors="replace")
    return found


def _environments() -> str:
    texts = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            texts.append(environ.read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(texts)


def test_no_secret_is_printed_logged_served_or_inherited(captured: Capture) -> None:
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="sec")
    settings = t.settings
    s3_secret = f"s3-{uuid.uuid4().hex}"
    wrong = f"wrong pw {uuid.uuid4().hex[:10]}"
    secrets = {
        "replication password": replication_password(settings).get_secret_value(),
        "spark.conf secret": s3_secret,
        "a wrong password": wrong,
    }
    admin = settings.postgres.password.get_secret_value()
    if admin != "postgres":  # the CI stack's is random; a dev stack's default is a word
        secrets["admin password"] = admin
    env = {
        **t.env,
        "CDC_SPARK__CONF": json.dumps({"spark.hadoop.fs.s3a.secret.key": s3_secret}),
    }

    # the setup statements, logged in full: the password is not among them (a verifier is)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        prepare_source(settings)
    finally:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET log_statement")
            conn.execute("SELECT pg_reload_conf()")

    shown = {
        "cdc config": run_cdc("config", "-o", "json", env=env),
        "cdc config (text)": run_cdc("config", env=env),
        "cdc status -o json": run_cdc("status", "-o", "json", env=env),
        "a wrong admin password": run_cdc(
            "status", "-o", "json", env={**env, "CDC_POSTGRES__PASSWORD": wrong}
        ),
        "a wrong replication password": run_cdc(
            "backfill",
            t.name,
            "--where",
            "id > 0",
            env={**env, "CDC_PIPELINE__REPLICATION_PASSWORD": wrong},
        ),
    }
    assert shown["cdc config"].returncode == 0, shown["cdc config"].stderr
    assert shown["a wrong replication password"].returncode != 0
    texts = {f"`{k}` output": r.stdout + r.stderr for k, r in shown.items()}
    texts["ps"] = subprocess.run(
        ["ps", "-eo", "args"], capture_output=True, text=True, check=True
    ).stdout
    texts["process environments"] = _environments()
    connect = connect_client(settings)
    texts["Connect REST API"] = json.dumps(
        [connect.connectors(), connect.config(settings.pipeline.connector)]
    )
    texts.update({str(path): text for path, text in _logs(settings.data_dir).items()})
    assert any("postgres" in where for where in texts), "no PostgreSQL log was read"

    leaks = [
        f"{what} in {where}"
        for what, secret in secrets.items()
        for where, text in texts.items()
        if secret in text
    ]
    assert not leaks, leaks
