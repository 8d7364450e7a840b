"""`cdc down --purge --yes` against a real component (Redis alone, in a data_dir of the
test's own: no second stack): it stops it and removes the folder `cdc` made, and leaves
a folder the user had, even one the component ran in."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.core.state_folders import MARKER
from cdc.stack import Stack
from cdc.stack.process import alive
from tests.conftest import settings_for, stack_env
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdc-purge-"))
    yield path
    Stack(settings_for(stack_env(path))).redis.stop()  # if a test failed half-way
    shutil.rmtree(path, ignore_errors=True)


def start_redis(env: dict[str, str]) -> int:
    redis = Stack(settings_for(env)).redis
    redis.start()
    pid = redis.pid()
    assert pid is not None
    return pid


def test_purge_removes_the_folder_cdc_made_and_stops_its_process(data_dir: Path) -> None:
    env = stack_env(data_dir)
    pid = start_redis(env)
    assert (data_dir / "redis" / MARKER).is_file()
    done = run_cdc("down", "--purge", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert not alive(pid)
    assert not (data_dir / "redis").exists()


def test_purge_leaves_a_folder_the_user_had(data_dir: Path) -> None:
    env = stack_env(data_dir)
    mine = data_dir / "redis"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    pid = start_redis(env)  # Redis runs in the user's folder: it is still not cdc's
    done = run_cdc("down", "--purge", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert not alive(pid)
    assert (mine / "notes.txt").read_text() == "mine"
    assert f"left {mine}" in done.stderr
