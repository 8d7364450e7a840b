"""Two tiers: tests/unit (pure logic, seconds) and tests/integration (the real stack).

The integration tier starts the real stack once per test run, on free ports in
a temporary directory, and always stops it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdc.settings import Settings
from tests.helpers import free_ports, run_cdc


@dataclass(frozen=True)
class RunningStack:
    """The running test stack: its settings and the CDC_* environment that selects it."""

    settings: Settings
    env: dict[str, str]


def stack_env(data_dir: Path) -> dict[str, str]:
    ports = free_ports(8)
    return {
        "CDC_DATA_DIR": str(data_dir),
        "CDC_POSTGRES__PORT": str(ports[0]),
        "CDC_KAFKA__PORT": str(ports[1]),
        "CDC_KAFKA__CONTROLLER_PORT": str(ports[2]),
        "CDC_CONNECT__PORT": str(ports[3]),
        "CDC_OPENSEARCH__PORT": str(ports[4]),
        "CDC_OPENSEARCH__TRANSPORT_PORT": str(ports[5]),
        "CDC_REDIS__PORT": str(ports[6]),
        "CDC_KAFKA__HEAP": "512m",
        "CDC_CONNECT__HEAP": "512m",
        "CDC_OPENSEARCH__HEAP": "512m",
    }


def settings_for(env: dict[str, str]) -> Settings:
    saved = {k: v for k, v in os.environ.items() if k.startswith("CDC_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for key in env:
            del os.environ[key]
        os.environ.update(saved)


@pytest.fixture(scope="session")
def stack() -> Iterator[RunningStack]:
    reuse = os.environ.get("CDC_TEST_STACK")
    if reuse:  # a stack someone else runs (tests/mutants.py): its CDC_* environment
        env = json.loads(Path(reuse).read_text())
        yield RunningStack(settings_for(env), env)
        return
    # PostgreSQL and OpenSearch run as the unprivileged service user when tests run as root:
    # the state directory must be reachable by it.
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-"))
    data_dir.chmod(0o755)
    env = stack_env(data_dir)
    try:
        result = run_cdc("up", env=env)
        if result.returncode != 0:
            pytest.fail(f"`cdc up` failed: {result.stderr.strip()}", pytrace=False)
        yield RunningStack(settings_for(env), env)
    finally:
        run_cdc("down", "--purge", env=env)
        shutil.rmtree(data_dir, ignore_errors=True)
