"""A Delta table's log read without Spark: the files of its newest version, its schema,
its partition columns (what the Iceberg publisher needs, cdc/stores/warehouse/
iceberg.py).

A snapshot is the newest checkpoint (Parquet, one part or several) and the JSON commits
after it, replayed in order: an `add` names a live file, a `remove` ends one, `metaData`
holds the schema. Read again with the snapshot read before, only the commits since are
read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from cdc.core.errors import StoreError

__all__ = ["DeltaSnapshot", "newest_version", "read_delta"]


@dataclass
class DeltaSnapshot:
    """A Delta table's newest version: its files (absolute paths, each with its partition
    values as the log writes them), its schema (the log's JSON) and partition columns."""

    path: str
    version: int
    table_id: str
    log_inode: int
    schema: dict[str, Any]
    partition_columns: list[str]
    configuration: dict[str, str]
    files: dict[str, dict[str, str | None]] = field(default_factory=dict)


def _commit(log: Path, version: int) -> Path:
    return log / f"{version:020d}.json"


def _checkpoint(log: Path) -> tuple[int, list[Path]] | None:
    """The newest complete checkpoint: its version and its part files."""
    hint = log / "_last_checkpoint"
    if hint.exists():
        try:
            last = json.loads(hint.read_text())
        except (OSError, ValueError):
            last = None
        if last and "v2Checkpoint" in last:
            raise StoreError(
                f"{log.parent}: a Delta v2 checkpoint, which the Iceberg publisher does not "
                "read; unset delta.checkpointPolicy on the table, or turn off "
                "[stores.warehouse] iceberg"
            )
        if last:
            version, parts = int(last["version"]), last.get("parts")
            files = (
                [
                    log / f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
                    for i in range(1, parts + 1)
                ]
                if parts
                else [log / f"{version:020d}.checkpoint.parquet"]
            )
            if all(f.exists() for f in files):
                return version, files
    singles = sorted(log.glob("*.checkpoint.parquet"))
    if singles:
        return int(singles[-1].name.split(".", 1)[0]), [singles[-1]]
    return None


def _behind(log: Path, version: int) -> bool:
    """Whether the log's newest checkpoint is past `version` (the commits after it may
    have been cleaned from the log: delta.logRetentionDuration)."""
    found = _checkpoint(log)
    return found is not None and found[0] > version


def _file_path(table: str, logged: str) -> str:
    """The absolute path of a file the log names (relative and URL-encoded there)."""
    if "://" in logged:
        return logged
    return f"{table.rstrip('/')}/{unquote(logged)}"


def _apply(snapshot: DeltaSnapshot, action: dict[str, Any]) -> None:
    if add := action.get("add"):
        if add.get("deletionVector"):
            raise StoreError(
                f"{snapshot.path}: a Delta deletion vector, which an Iceberg table cannot "
                "share; turn off delta.enableDeletionVectors on the table (and run REORG "
                "TABLE ... APPLY (PURGE)), or turn off [stores.warehouse] iceberg"
            )
        snapshot.files[_file_path(snapshot.path, add["path"])] = dict(
            add.get("partitionValues") or {}
        )
    elif remove := action.get("remove"):
        snapshot.files.pop(_file_path(snapshot.path, remove["path"]), None)
    elif meta := action.get("metaData"):
        snapshot.table_id = meta["id"]
        snapshot.schema = json.loads(meta["schemaString"])
        snapshot.partition_columns = list(meta.get("partitionColumns") or [])
        snapshot.configuration = dict(meta.get("configuration") or {})


def _read_checkpoint(snapshot: DeltaSnapshot, parts: list[Path]) -> None:
    import pyarrow.parquet as pq

    for part in parts:
        table = pq.read_table(part, columns=["add", "metaData"])
        for row in table.to_pylist():
            add, meta = row.get("add"), row.get("metaData")
            if add:
                values = add.get("partitionValues") or {}
                if isinstance(values, list):  # a Parquet map: (key, value) pairs
                    values = dict(values)
                add["partitionValues"] = values
                _apply(snapshot, {"add": add})
            elif meta:
                meta["configuration"] = dict(meta.get("configuration") or [])
                _apply(snapshot, {"metaData": meta})


def read_delta(path: str, before: DeltaSnapshot | None = None) -> DeltaSnapshot | None:
    """The Delta table's newest snapshot (None: no table at `path`). `before`, the
    snapshot this returned earlier, is advanced by the commits since (or returned as it
    is when there are none); a table removed and made again is read whole."""
    log = Path(path) / "_delta_log"
    try:
        inode = os.stat(log).st_ino
    except FileNotFoundError:
        return None
    if (
        before is not None
        and before.log_inode == inode
        and (_commit(log, before.version + 1).exists() or not _behind(log, before.version))
    ):
        if not _commit(log, before.version + 1).exists():
            return before
        snapshot = replace(before, files=dict(before.files))
        start = before.version + 1
    else:  # the first read, a table made again, or commits since cleaned from the log
        snapshot = DeltaSnapshot(path, -1, "", inode, {}, [], {})
        found = _checkpoint(log)
        start = 0
        if found is not None:
            version, parts = found
            _read_checkpoint(snapshot, parts)
            snapshot.version, start = version, version + 1
        elif not _commit(log, 0).exists():
            return None  # a table being made: its first commit is not written yet
    version = start
    while True:
        try:
            text = _commit(log, version).read_text()
        except FileNotFoundError:
            break
        for line in text.splitlines():
            if line.strip():
                _apply(snapshot, json.loads(line))
        snapshot.version = version
        version += 1
    if not snapshot.table_id:
        raise StoreError(f"{path}: the Delta log names no table (no metaData action)")
    return snapshot


def newest_version(path: str) -> int | None:
    """The Delta table's newest version (None: no table at `path`), its log not read."""
    log = Path(path) / "_delta_log"
    found = _checkpoint(log) if log.is_dir() else None
    version = found[0] if found is not None else -1
    while _commit(log, version + 1).exists():
        version += 1
    return None if version < 0 else version
