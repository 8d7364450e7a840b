"""`cdc down --purge` removes only the folders `cdc` made (marked), under data_dir, with
the pipelines' checkpoints and warehouse; it leaves a user's folders, follows no link,
never touches anything outside data_dir, and asks first (`--yes` to skip)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.core.settings import Settings
from cdc.core.state_folders import MARKER, make_state_dir, prepare_job_state
from cdc.stack import Stack
from cdc.stores.warehouse.settings import with_warehouse
from tests.helpers import ROOT, run_cdc


def settings_in(data_dir: Path, warehouse_path: str | None = None) -> Settings:
    settings = Settings(data_dir=data_dir)  # type: ignore[call-arg]
    return with_warehouse(settings, path=warehouse_path)


def made_by_cdc(settings: Settings, relative: str) -> Path:
    """A folder as cdc makes it, holding a file."""
    path = make_state_dir(settings, settings.data_dir / relative)
    (path / "state.bin").write_text("x")
    return path


def users_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "mine.txt").write_text("keep me")
    return path


def test_a_folder_is_marked_only_when_cdc_makes_it(tmp_path: Path) -> None:
    settings = settings_in(tmp_path / "data")
    users_folder(tmp_path / "data" / "redis")
    make_state_dir(settings, tmp_path / "data" / "redis")
    assert not (tmp_path / "data" / "redis" / MARKER).exists()
    # the topmost folder it makes carries the marker
    make_state_dir(settings, tmp_path / "data" / "checkpoints" / "p1")
    assert (tmp_path / "data" / "checkpoints" / MARKER).is_file()
    assert not (tmp_path / "data" / MARKER).exists()  # data_dir itself is never marked
    # outside data_dir nothing is marked
    make_state_dir(settings, tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere" / MARKER).exists()


def test_purge_removes_marked_folders_and_leaves_the_rest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_in(data)
    removed = [made_by_cdc(settings, name) for name in ("postgres", "kafka", "opensearch")]
    removed += [made_by_cdc(settings, "checkpoints/pipe"), made_by_cdc(settings, "warehouse")]
    removed += [made_by_cdc(settings, "spark/tmp")]
    users_redis = users_folder(data / "redis")  # the user's own folder named like a component
    outside = users_folder(tmp_path / "outside")
    (outside / MARKER).write_text("a marker does not make a folder outside data_dir ours\n")
    (data / "connect").symlink_to(outside)  # a link out of data_dir: never followed
    (data / "kafka" / "link-out").symlink_to(outside)  # a link inside a removed folder
    others = users_folder(data / "notes")  # a folder cdc does not know

    stack = Stack(settings)
    plan = stack.purge_plan()
    assert sorted(plan.remove) == sorted(data / p.relative_to(data).parts[0] for p in removed)
    said: list[str] = []
    stack.purge(plan, said.append)

    for path in removed:
        assert not (data / path.relative_to(data).parts[0]).exists()
    assert (users_redis / "mine.txt").read_text() == "keep me"
    assert (outside / "mine.txt").read_text() == "keep me"
    assert (data / "connect").is_symlink()
    assert (others / "mine.txt").exists()
    left = [line for line in said if line.startswith("left ")]
    assert any(str(users_redis) in line and "rm -rf" in line for line in left), said
    assert any(str(data / "connect") in line and "link" in line for line in left), said


@pytest.mark.parametrize("where", ["outside", "file", "s3"])
def test_a_warehouse_outside_data_dir_is_never_removed(tmp_path: Path, where: str) -> None:
    data = tmp_path / "data"
    outside = tmp_path / "lake"
    path = {"outside": str(outside), "file": f"file://{outside}", "s3": "s3a://bucket/lake"}
    settings = settings_in(data, warehouse_path=path[where])
    users_folder(outside)
    (outside / MARKER).write_text("marked, yet outside data_dir\n")
    made_by_cdc(settings, "checkpoints/pipe")

    stack = Stack(settings)
    plan = stack.purge_plan()
    assert plan.remove == [data / "checkpoints"]
    said: list[str] = []
    stack.purge(plan, said.append)
    assert (outside / "mine.txt").exists()
    assert sum("warehouse" in line and "never removes" in line for line in said) == 1, said


def test_a_warehouse_under_data_dir_is_removed_with_the_checkpoints(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_in(data, warehouse_path=str(data / "lake" / "delta"))
    prepare_job_state(settings)  # what every Spark job of the pipeline does first
    made_by_cdc(settings, "lake/delta/public.t")
    made_by_cdc(settings, "checkpoints/pipe/warehouse")
    users_folder(data / "lake-of-mine")
    stack = Stack(settings)
    stack.purge(stack.purge_plan())
    assert not (data / "lake" / "delta").exists()
    assert not (data / "checkpoints").exists() and not (data / "spark").exists()
    assert (data / "lake-of-mine" / "mine.txt").exists()


def test_a_data_dir_reached_through_a_link_is_purged_inside_only(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "data").symlink_to(real)
    settings = settings_in(tmp_path / "data")
    made_by_cdc(settings, "kafka")
    stack = Stack(settings)
    stack.purge(stack.purge_plan())
    assert not (real / "kafka").exists()
    assert real.is_dir()


def cli_env(data: Path, **extra: str) -> dict[str, str]:
    return {"CDC_DATA_DIR": str(data), **extra}


def test_the_cli_refuses_without_a_terminal_and_purges_with_yes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = settings_in(data)
    made_by_cdc(settings, "kafka")
    made_by_cdc(settings, "checkpoints/pipe")
    users_redis = users_folder(data / "redis")

    refused = run_cdc("down", "--purge", env=cli_env(data), timeout=120)  # stdin: /dev/null
    assert refused.returncode != 0
    assert "--yes" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert (data / "kafka" / "state.bin").exists()

    done = run_cdc("down", "--purge", "--yes", env=cli_env(data), timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (data / "kafka").exists() and not (data / "checkpoints").exists()
    assert (users_redis / "mine.txt").exists()
    assert "left" in done.stderr and str(users_redis) in done.stderr


def on_a_terminal(data: Path, answer: str, **extra: str) -> tuple[int, str]:
    """`cdc down --purge` with a terminal on stdin, answering the prompt."""
    main, other = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_") and k != "CI"}
    try:
        os.write(main, answer.encode())
        done = subprocess.run(
            [sys.executable, "-m", "cdc", "down", "--purge"],
            env={**env, **cli_env(data, **extra)},
            stdin=other,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    finally:
        os.close(main)
        os.close(other)
    return done.returncode, done.stdout + done.stderr


def test_the_cli_asks_once_on_a_terminal(tmp_path: Path) -> None:
    data = tmp_path / "data"
    made_by_cdc(settings_in(data), "kafka")
    code, said = on_a_terminal(data, "n\n")
    assert code != 0 and "Continue? [y/N]" in said and f"kafka under {data}" in said, said
    assert (data / "kafka").exists()
    code, said = on_a_terminal(data, "y\n", CI="true")  # CI: no one to ask, even on a tty
    assert code != 0 and "--yes" in said and (data / "kafka").exists(), said
    code, said = on_a_terminal(data, "y\n")
    assert code == 0 and not (data / "kafka").exists(), said
