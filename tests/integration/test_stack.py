"""The local stack: every component answers, stops without leftovers, and refuses bad starts."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import requests

from cdc.capture.connect_client import REST_USER, connect_client, rest_password_file
from cdc.stack import Stack
from cdc.stack.process import alive, port_free, read_pid
from tests.conftest import RunningStack, stack_env
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration

COMPONENTS = {"postgres", "kafka", "connect", "opensearch", "redis"}


def status_json(env: dict[str, str]) -> dict[str, dict]:
    result = run_cdc("status", "--output", "json", env=env)
    return {entry["name"]: entry for entry in json.loads(result.stdout)["components"]}


def test_every_component_answers(stack: RunningStack) -> None:
    status = status_json(stack.env)
    assert set(status) == COMPONENTS
    for name, entry in status.items():
        assert entry["up"], f"{name}: {entry['error']}"
        assert entry["version"], name
        assert entry["pid"], name
    assert status["postgres"]["details"]["wal_level"] == "logical"
    assert status["postgres"]["version"].startswith(("15", "16", "17", "18"))
    assert status["kafka"]["version"].startswith("4.")
    assert status["connect"]["version"].startswith("4.")
    assert status["opensearch"]["details"]["health"] in ("green", "yellow")


@pytest.mark.long
def test_down_leaves_nothing_behind_and_up_starts_again(stack: RunningStack) -> None:
    components = Stack(stack.settings).components
    pids = {c.name: c.pid() for c in components}
    ports = [(c.section.host, port) for c in components for port in c.ports()]
    assert all(pids.values()), pids

    result = run_cdc("down", env=stack.env)
    assert result.returncode == 0, result.stderr
    for name, pid in pids.items():
        assert pid is not None and not alive(pid), f"{name} (pid {pid}) still runs"
    for host, port in ports:
        assert port_free(host, port), f"port {port} still in use"
    assert all(read_pid(c.pid_file) is None for c in components)

    result = run_cdc("up", env=stack.env)  # restart on the existing state
    assert result.returncode == 0, result.stderr
    assert all(entry["up"] for entry in status_json(stack.env).values())


def test_a_port_already_taken_is_one_clear_line_and_starts_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path
    env = stack_env(data_dir)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(env["CDC_REDIS__PORT"])))
        squatter.listen()
        result = run_cdc("up", env=env)
    assert result.returncode == 4
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "redis" in lines[0] and env["CDC_REDIS__PORT"] in lines[0]
    assert "already in use" in lines[0]
    assert not any(data_dir.glob("*/*.pid")), "a component was started"


def test_a_missing_install_is_one_clear_line(tmp_path: Path) -> None:
    data_dir = tmp_path
    env = {**stack_env(data_dir), "CDC_CACHE_DIR": str(data_dir / "empty-cache")}
    result = run_cdc("up", env=env)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "not installed" in lines[0] and "make install" in lines[0]
    assert not any(data_dir.glob("*/*.pid"))


def test_connects_rest_api_answers_only_cdcs_login(stack: RunningStack) -> None:
    """Any local user reached the worker on 127.0.0.1: read connector configs, made a
    connector naming the pipeline's secret files, paused, rewound or deleted the
    pipeline's connector. Now every request needs the REST user's password, which only
    `cdc` reads (0600)."""
    url, name = stack.settings.connect.url, stack.settings.pipeline.connector
    probe = {"name": "probe", "config": {"connector.class": "FileStreamSource"}}
    for method, path, body in [
        ("GET", "/connectors", None),
        ("GET", f"/connectors/{name}/config", None),
        ("POST", "/connectors", probe),
        ("PUT", f"/connectors/{name}/pause", None),
        ("PATCH", f"/connectors/{name}/offsets", {"offsets": []}),
        ("DELETE", f"/connectors/{name}", None),
    ]:
        for auth in (None, (REST_USER, "wrong")):
            answer = requests.request(method, url + path, json=body, auth=auth, timeout=10)
            assert answer.status_code == 401, (method, path, auth, answer.status_code)
    assert isinstance(connect_client(stack.settings).connectors(), dict)
    kept = rest_password_file(stack.settings)
    users = stack.settings.data_dir / "connect" / "rest" / "users.properties"
    for path in (kept, users):
        assert path.stat().st_mode & 0o777 == 0o600, path


@pytest.mark.long
def test_the_first_up_with_a_generated_password_reports_no_refusal() -> None:
    """A fresh data_dir without a configured password: the cluster is made with a
    generated one, and the status `cdc up` prints after the start uses it (it did not:
    the settings were loaded before the password existed, and said PostgreSQL refused)."""
    import shutil
    import tempfile

    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-fresh-"))
    data_dir.chmod(0o755)  # reachable by the service user PostgreSQL runs as
    env = {k: v for k, v in stack_env(data_dir).items() if k != "CDC_POSTGRES__PASSWORD"}
    try:
        result = run_cdc("up", env=env)
        said = " ".join((result.stdout + result.stderr).split())
        assert result.returncode == 0, said[-3000:]
        assert "postgres" in said and "refused" not in said, said[-3000:]
    finally:
        run_cdc("down", "--purge", "--yes", env=env)
        shutil.rmtree(data_dir, ignore_errors=True)
