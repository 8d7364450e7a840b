"""The folders `cdc` makes under data_dir, each marked so that a purge knows it is ours.

A folder is marked (a `.cdc-state` file naming what it holds) when, and only when,
`cdc` creates it: a folder that was there before, a user's own or one made by a
version of `cdc` without markers, never is, and `cdc down --purge` leaves it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from cdc.core.object_store import ObjectStore, object_store, object_store_at
from cdc.core.settings import Settings

__all__ = [
    "MARKER",
    "PIPELINE_STATE",
    "checkpoint_store",
    "inside",
    "is_marked",
    "local_warehouse",
    "make_state_dir",
    "prepare_job_state",
    "warehouse_path",
    "warehouse_store",
]

MARKER = ".cdc-state"
# what the apply job and the snapshot keep under data_dir, meaningless once the change
# topics are gone: checkpoints (Spark's, progress, generations, schemas), Spark's own
# scratch and logs, the benchmarks' pipelines; and the generated replication passwords
# (a new setup generates and sets a new one)
PIPELINE_STATE = ("checkpoints", "spark", "bench", "secrets", "run")


def inside(path: Path, root: Path) -> bool:
    """Whether path, symbolic links resolved, is root or below it."""
    return path.resolve().is_relative_to(root.resolve())


def is_marked(path: Path) -> bool:
    return (path / MARKER).is_file()


def make_state_dir(settings: Settings, path: Path, mode: int = 0o700) -> Path:
    """Create the folder `path` (and its parents) under data_dir, marking as `cdc`'s the
    topmost folder this call creates and `path` itself if this call creates it. A path
    outside data_dir is only created. The folders it makes are their owner's alone: they
    hold captured rows (checkpoints, Spark's scratch, the warehouse) or secrets."""
    data_dir = settings.data_dir
    made: list[Path] = []
    if path.is_relative_to(data_dir):
        for folder in [path, *path.parents]:
            if folder == data_dir or folder.exists():
                break
            made.append(folder)
    path.mkdir(parents=True, exist_ok=True, mode=mode)
    for folder in {made[0], made[-1]} if made else ():
        what = folder.relative_to(data_dir).as_posix()
        (folder / MARKER).write_text(
            f"{what}: created by cdc; `cdc down --purge` removes this folder\n"
        )
    return path


def warehouse_path(settings: Settings) -> str | None:
    """The warehouse's root as configured ([stores.warehouse] path), or None: under
    data_dir."""
    path: str | None = settings.store_section("warehouse").path
    return path


def warehouse_store(settings: Settings) -> ObjectStore | None:
    """The object store the warehouse is on ([stores.warehouse] path s3://…, and its
    [stores.warehouse.s3]), or None: a local folder or another filesystem."""
    return object_store(settings.store_section("warehouse"))


def checkpoint_store(settings: Settings) -> ObjectStore | None:
    """The object store the Spark checkpoints are on ([apply] checkpoints s3://…, reached
    with [stores.warehouse.s3] as the warehouse is), or None: a local folder."""
    section = settings.store_section("warehouse")
    return object_store_at(settings.apply.checkpoints, section.s3, "[apply] checkpoints")


def local_warehouse(settings: Settings) -> Path | None:
    """The warehouse's root as a local folder, or None when it is not on this machine's
    filesystem (s3://, hdfs://, …)."""
    configured = warehouse_path(settings)
    if not configured:
        return settings.data_dir / "warehouse"
    url = urlparse(configured)
    if url.scheme == "file":
        return Path(url.path).absolute()
    if url.scheme and len(url.scheme) > 1:  # a Spark filesystem of its own
        return None
    return Path(configured).expanduser().absolute()


def prepare_job_state(settings: Settings) -> None:
    """Create and mark the folders a Spark job of the pipeline writes in: Spark's own,
    the checkpoints, and the warehouse when it lies under data_dir."""
    folders = [settings.data_dir / name for name in ("spark", "checkpoints")]
    warehouse = local_warehouse(settings)
    if warehouse is not None and warehouse.is_relative_to(settings.data_dir):
        folders.append(warehouse)
    for folder in folders:
        make_state_dir(settings, folder)
        if is_marked(folder) and folder.stat().st_uid == os.geteuid():
            folder.chmod(0o700)  # made before they were made so: the rows are no one else's
