"""Where each streaming query of the apply job keeps its Spark checkpoint, and what the
pipeline reads of one.

A query's checkpoint (its offsets, its commits, a view's state) is
`<checkpoints>/<pipeline>/<label>`, the label being the store's name or the view query's.
`[apply] checkpoints` puts them in a folder or in a bucket (s3://, s3a://, reached with
[stores.warehouse.s3] as the warehouse is): on a cluster, the executors write a view's
state there, so they must all reach it. The pipeline's own records (each store's
progress, a view's definition, the generation) stay in the driver's
`<data_dir>/checkpoints/<pipeline>/` (cdc/log/progress.py), whichever is chosen.

Spark writes a checkpoint; the driver reads two things of one (the newest batch it
committed, the query's id) and removes one that must start afresh, through Arrow's
filesystem for the place it is in.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cdc.core.settings import Settings
from cdc.core.state_folders import checkpoint_store

__all__ = ["Checkpoint", "checkpoint", "checkpoints_of_pipeline"]


@dataclass(frozen=True)
class Checkpoint:
    """One streaming query's checkpoint: `location` as Spark is given it, and the
    filesystem and path the driver reads it with."""

    location: str
    filesystem: Any
    path: str

    def __str__(self) -> str:
        return self.location

    @property
    def label(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def last_committed_batch(self) -> int | None:
        """The newest batch the query has committed (its commits/<id> files), or None
        before its first."""
        from pyarrow import fs

        try:
            found = self.filesystem.get_file_info(fs.FileSelector(f"{self.path}/commits"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        batches = [int(f.base_name) for f in found if f.base_name.isdigit()]
        return max(batches, default=None)

    def read(self, name: str) -> str:
        """The text of the checkpoint's file `name` (`offsets/7`, `metadata`)."""
        with self.filesystem.open_input_stream(f"{self.path}/{name}") as stream:
            return str(stream.read().decode())

    def query_id(self) -> str:
        """The id Spark gave the query whose checkpoint this is (kept across restarts)."""
        return str(json.loads(self.read("metadata"))["id"])

    def remove(self) -> None:
        """Remove the checkpoint: its query starts afresh. Its files one by one (a bucket's
        bulk delete took S3Proxy 20-30 s), then, in a folder, the folders left."""
        from pyarrow import fs

        info = self.filesystem.get_file_info(self.path)
        if info.type == fs.FileType.NotFound:
            return
        if info.type != fs.FileType.Directory:
            self.filesystem.delete_file(self.path)
            return
        found = self.filesystem.get_file_info(fs.FileSelector(self.path, recursive=True))
        for file in found:
            if file.type == fs.FileType.File:
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile
                    self.filesystem.delete_file(file.path)
        if isinstance(self.filesystem, fs.LocalFileSystem):
            self.filesystem.delete_dir(self.path)


def _root(settings: Settings) -> str:
    configured = settings.apply.checkpoints
    base = configured.rstrip("/") if configured else str(settings.data_dir / "checkpoints")
    return f"{base}/{settings.pipeline.name}"


def _at(settings: Settings, location: str) -> Checkpoint:
    from pyarrow import fs

    from cdc.core.object_store import pyarrow_s3

    store = checkpoint_store(settings)
    if store is not None:
        url = urlparse(location)
        return Checkpoint(location, pyarrow_s3(store), f"{url.netloc}{url.path}".rstrip("/"))
    url = urlparse(location)
    path = url.path if url.scheme == "file" else location
    return Checkpoint(location, fs.LocalFileSystem(), str(Path(path).expanduser().absolute()))


def checkpoint(settings: Settings, label: str) -> Checkpoint:
    """The checkpoint of the pipeline's query `label` (a store's name, a view query's)."""
    return _at(settings, f"{_root(settings)}/{label}")


def checkpoints_of_pipeline(settings: Settings) -> list[Checkpoint]:
    """Every query checkpoint the pipeline has (none before its first query ran): the
    folders with a query's metadata."""
    from pyarrow import fs

    root = _at(settings, _root(settings))
    try:
        found = root.filesystem.get_file_info(fs.FileSelector(root.path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    # a query's checkpoint begins with its metadata file (a bucket may show the folders
    # of one removed)
    folders = [f.base_name for f in found if f.type == fs.FileType.Directory]
    held = [_at(settings, f"{root.location}/{name}") for name in folders]
    return [
        c for c in held if c.filesystem.get_file_info(f"{c.path}/metadata").type == fs.FileType.File
    ]
