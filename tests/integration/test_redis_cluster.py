"""Redis Cluster is refused (issue 69 item 4): the cache writes up to 200 rows' keys in
one Lua script, which a cluster refuses across hash slots. A real redis-server started
here with `--cluster-enabled yes` makes `cdc setup` stop in one line before it changes
anything (the pipeline's slot, publication, topics and connector are not made), and the
apply job's cache refuses it too; a standalone redis-server is not refused."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from cdc.capture.pipeline import setup_stores
from cdc.core.errors import StoreError
from cdc.core.settings import Settings
from cdc.stores.cache.store import CacheStore
from tests.conftest import RunningStack
from tests.helpers import free_ports, run_cdc

pytestmark = pytest.mark.integration

PASSWORD = "cluster-test-pw"


def _redis_server(folder: Path, port: int, *options: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(folder),
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            PASSWORD,
            *options,
        ],
        stdout=(folder / "redis.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=1)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            assert time.monotonic() < deadline, (folder / "redis.log").read_text()
            time.sleep(0.2)


def _cluster_port() -> int:
    """A free port for a cluster-mode redis-server: at most 55535 (its cluster bus listens
    10,000 above, which must be free too); the system's free ports run higher."""
    for _ in range(200):
        port = random.randint(20_000, 55_535)
        try:
            with socket.socket() as one, socket.socket() as bus:
                one.bind(("127.0.0.1", port))
                bus.bind(("127.0.0.1", port + 10_000))
            return port
        except OSError:
            continue
    raise AssertionError("no free port for a cluster-mode redis-server")


@pytest.fixture(scope="module")
def redis_servers() -> Iterator[tuple[int, int]]:
    """A redis-server in cluster mode and a standalone one: their ports."""
    root = Path(tempfile.mkdtemp(prefix="cdc-redis-cluster-"))
    cluster_port, (standalone_port,) = _cluster_port(), free_ports(1)
    (root / "cluster").mkdir()
    (root / "standalone").mkdir()
    processes = []
    try:
        processes.append(
            _redis_server(
                root / "cluster",
                cluster_port,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(root / "cluster" / "nodes.conf"),
            )
        )
        processes.append(_redis_server(root / "standalone", standalone_port))
        yield cluster_port, standalone_port
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _cache(port: int) -> Settings:
    return Settings.model_validate(
        {
            "redis": {"managed": False, "port": port, "password": PASSWORD},
            "apply": {"stores": ["cache"]},
        }
    )


def _refusal(port: int) -> str:
    return (
        f"Redis at redis://127.0.0.1:{port}/0 runs Redis Cluster, which the cache cannot use: "
        "each write is one Lua script over up to 200 rows' keys, and a cluster refuses a "
        "script whose keys lie in several hash slots; point redis.host/port at a standalone "
        "Redis or a Sentinel-managed primary"
    )


def test_redis_cluster_is_refused_and_a_standalone_redis_is_not(
    redis_servers: tuple[int, int],
) -> None:
    cluster, standalone = redis_servers
    with pytest.raises(StoreError) as refused:
        setup_stores(_cache(cluster), ["public.t"])
    assert str(refused.value) == _refusal(cluster)
    # the apply job's cache, as it starts
    store = CacheStore(_cache(cluster).redis, "cdc", 60)
    with pytest.raises(StoreError) as at_apply:
        store.prepare([])
    assert str(at_apply.value) == _refusal(cluster)
    assert setup_stores(_cache(standalone), ["public.t"]) == []
    CacheStore(_cache(standalone).redis, "cdc", 60).prepare([])


def test_cdc_setup_stops_in_one_line_before_it_changes_anything(
    stack: RunningStack, redis_servers: tuple[int, int]
) -> None:
    cluster, _ = redis_servers
    name = f"rc{uuid.uuid4().hex[:8]}"
    table = f"public.{name}"
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    try:
        env = {
            **stack.env,
            "CDC_REDIS__MANAGED": "false",
            "CDC_REDIS__PORT": str(cluster),
            "CDC_REDIS__PASSWORD": PASSWORD,
            "CDC_PIPELINE__NAME": name,
            "CDC_PIPELINE__TOPIC_PREFIX": name,
            "CDC_PIPELINE__TABLES": f'["{table}"]',
        }
        result = run_cdc("setup", env=env)
        assert result.returncode != 0
        said = [line for line in result.stderr.splitlines() if line.strip()]
        assert said == [f"error: {_refusal(cluster)}"], result.stdout + result.stderr
        assert PASSWORD not in result.stdout + result.stderr
        with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
            slots = conn.execute(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                (f"cdc_{name}",),
            ).fetchone()
            publications = conn.execute(
                "SELECT count(*) FROM pg_publication WHERE pubname = %s", (f"cdc_{name}",)
            ).fetchone()
        assert slots == (0,) and publications == (0,)
    finally:
        with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
