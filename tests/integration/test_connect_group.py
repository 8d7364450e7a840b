"""Connect as a group (issue 69): two Kafka Connect workers started here by the stack's own
launcher (cdc/stack/components/connect.py), one group (the same group.id and config,
offset and status topics), distinct REST ports, https with a CA of the test's and one
login, small heaps. cdc reaches them as your own Connect (connect.managed = false,
connect.hosts, tls, ca_file, username/password). Under a 50 TPS load the worker that
runs the Debezium task is SIGKILLed: the task moves to the other worker (Connect's REST
status and `cdc status` say so), the log holds every change, every store ends equal to
the source (read with the test's own readers, tests/stores.py), and the warehouse's
history has one version per change: none lost, none doubled."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdc.capture.connect_client import ConnectClient, connect_client
from cdc.core.settings import Settings
from cdc.core.settings.connections import ConnectSettings
from cdc.stack.components.connect import Connect
from cdc.stack.components.kafka import Kafka
from cdc.stack.process import ServiceUser
from tests.conftest import Capture, RunningStack, settings_for, stack_env
from tests.helpers import free_ports, run_cdc
from tests.source_load import Writer
from tests.survival import assert_nothing_lost_or_doubled
from tests.tls import make_ca

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


class Worker(Connect):
    """One worker of the group: the stack's Connect component with a state folder and a
    pid file of its own (data_dir/connect-<n>)."""

    def __init__(self, settings: Settings, number: int) -> None:
        super().__init__(settings)
        self.number = number

    @property
    def state_dir(self) -> Path:
        return self.settings.data_dir / f"connect-{self.number}"

    @property
    def pid_file(self) -> Path:
        return self.settings.data_dir / "run" / f"connect-{self.number}.pid"

    @property
    def worker_id(self) -> str:
        """How it advertises itself (Connect's tasks[].worker_id)."""
        return f"{self.section.host}:{self.section.port}"

    def kill(self) -> None:
        """SIGKILL, as a machine lost."""
        pid = self.pid()
        assert pid is not None, f"worker {self.number} does not run"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.pid_file.unlink(missing_ok=True)


@dataclass
class Group:
    stack: RunningStack
    workers: list[Worker]


@pytest.fixture(scope="module")
def group() -> Iterator[Group]:
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-connect-group-"))
    data_dir.chmod(0o755)
    ca = make_ca(data_dir / "tls")
    cert = ca.server_cert("connect", ("127.0.0.1", "localhost"))
    ports = free_ports(2)
    password = f"rest {uuid.uuid4().hex[:12]}"
    secrets = data_dir / "connect-secrets"  # shared by the workers and cdc
    secrets.mkdir(mode=0o700)
    env = {
        **stack_env(data_dir),
        "CDC_CONNECT__MANAGED": "false",
        "CDC_CONNECT__HOSTS": ",".join(f"127.0.0.1:{p}" for p in ports),
        "CDC_CONNECT__TLS": "true",
        "CDC_CONNECT__CA_FILE": str(ca.ca_file),
        "CDC_CONNECT__USERNAME": "cdc-group",
        "CDC_CONNECT__PASSWORD": password,
        "CDC_CONNECT__SECRETS_DIR": str(secrets),
    }
    settings = settings_for(env)
    user = ServiceUser.lookup(settings.service_user) if os.geteuid() == 0 else None
    if user is not None:
        user.own(secrets)
    workers = []
    for number, port in enumerate(ports, 1):
        section = ConnectSettings.model_validate(
            {
                "managed": True,
                "port": port,
                "heap": "384m",
                "group_id": settings.connect.group_id,
                "tls": True,
                "ca_file": ca.ca_file,
                "cert_file": cert.cert_file,
                "key_file": cert.key_file,
                "username": "cdc-group",
                "password": password,
                "secrets_dir": secrets,
            }
        )
        workers.append(Worker(settings.model_copy(update={"connect": section}), number))
    kafka = Kafka(settings)
    try:
        kafka.start()  # the workers need it; `cdc up` starts the rest, and asks the group
        for worker in workers:
            worker.start()
        result = run_cdc("up", env=env)
        if result.returncode != 0:
            pytest.fail(f"`cdc up` failed: {result.stderr.strip()}", pytrace=False)
        yield Group(RunningStack(settings, env), workers)
    finally:
        for worker in workers:
            worker.stop()
        run_cdc("down", "--purge", "--yes", env=env)
        kafka.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(group: Group) -> RunningStack:
    """The stack `captured` makes its pipelines on: the one with the Connect group."""
    return group.stack


def _task_worker(client: ConnectClient, connector: str) -> str | None:
    """The worker that runs the connector's task, when it runs."""
    try:
        tasks = client.status(connector).get("tasks", [])
    except Exception:
        return None
    if len(tasks) == 1 and tasks[0].get("state") == "RUNNING":
        return str(tasks[0].get("worker_id"))
    return None


def test_the_task_moves_to_the_other_worker_and_nothing_is_lost(
    group: Group, captured: Capture
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 2000) g",
        prefix="group",
    )
    name, settings = t.name, t.settings
    qualified = f"public.{name}"
    connector = settings.pipeline.connector
    # a client of the test's own, over https with the group's login, on each worker
    client = connect_client(settings)
    assert all(u.startswith("https://") for u in client.urls)
    by_id = {w.worker_id: w for w in group.workers}
    running_on = _task_worker(client, connector)
    assert running_on in by_id, (running_on, list(by_id))
    status = json.loads(run_cdc("status", "--output", "json", env=t.env).stdout)
    assert status["pipeline"]["connector"]["workers"] == [running_on], status["pipeline"]
    text = run_cdc("status", env=t.env).stdout
    assert f"RUNNING on {running_on}" in text, text

    lost = by_id[running_on]
    other = next(w for w in group.workers if w is not lost)
    writer = Writer(t.dsn, qualified, first_new_id=100_000, max_id=2000, rate=50)
    try:
        writer.start()
        time.sleep(10)
        lost.kill()
        at_kill = writer.commits
        killed = time.monotonic()
        # the group notices the lost worker (session timeout) and gives its task to the
        # other one (scheduled.rebalance.max.delay.ms); asked of the live worker over https
        moved = None
        while moved != other.worker_id:
            assert time.monotonic() - killed < 180, f"the task did not move ({moved})"
            time.sleep(2)
            moved = _task_worker(client, connector)
        print(f"task moved to {moved} {time.monotonic() - killed:.0f}s after the kill")
        time.sleep(15)
        assert writer.commits > at_kill + 500  # the source went on changing, 50 a second
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None, writer.error
    print(f"{writer.commits} transactions, worker {lost.worker_id} lost after {at_kill}")
    # `cdc status` names the worker the task runs on now (cdc's client skips the dead one)
    status = json.loads(run_cdc("status", "--output", "json", env=t.env).stdout)
    assert status["pipeline"]["connector"]["workers"] == [other.worker_id], status["pipeline"]
    assert status["pipeline"]["connector"]["tasks"] == ["RUNNING"]

    assert_nothing_lost_or_doubled(settings, qualified)
