"""What a store holds of the change topics because the snapshot wrote it there itself.

A store with the "snapshot" ability (the warehouse) takes the snapshot's rows from the
same Spark read that writes them to Kafka (cdc/apply/snapshot_into.py), group by group:
each group goes to Kafka first, then into the store, with each row's partition and an
offset no lower than its record's. Once a group is in the store, its record here says,
per topic partition, the end offset the store holds the snapshot's records through
(`Held.ends`). The store's apply query then skips those records (cdc/apply/batch.py):
only the snapshot writes the change topics before the connector starts, so every
record below such an end is one of its rows the store holds.

While the snapshot writes a store, it holds a PostgreSQL advisory lock for it (on a
connection of its own: the lock ends with the process, however it ends). The store's
apply batches wait while the lock is held, so the two never write the store at once.

A new snapshot (not a resumed one) forgets every record: what an earlier one held was in
records the new one deletes. A store emptied to be rebuilt from the log forgets its own.

A store's apply query that starts anew (no checkpoint yet) starts each held partition at
its end, and its progress record takes the records below as applied (cdc/apply/job.py):
it reads none of them."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from cdc.core.errors import SourceUnavailableError, StoreBusyError
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir

__all__ = [
    "Held",
    "forget_held",
    "read_held",
    "record_held",
    "snapshot_writes",
    "writing_lock",
]


@dataclass(frozen=True)
class Held:
    lsn: int  # the snapshot's consistent point
    ends: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> end offset

    def covers(self, applied: dict[str, int]) -> bool:
        """Whether a store that applied up to `applied` ("topic:partition" -> last offset)
        is past every record this says it holds."""
        return all(applied.get(where, -1) >= end - 1 for where, end in self.ends.items() if end)


def _file(settings: Settings, store: str) -> Path:
    folder = settings.data_dir / "checkpoints" / settings.pipeline.name
    return folder / f"snapshot-held-{store}.json"


def record_held(settings: Settings, store: str, held: Held) -> None:
    """Note what `store` holds (written whole, then moved into place)."""
    path = _file(settings, store)
    make_state_dir(settings, path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"lsn": held.lsn, "ends": held.ends}))
    tmp.replace(path)


def read_held(settings: Settings, store: str) -> Held | None:
    try:
        data: dict[str, Any] = json.loads(_file(settings, store).read_text())
        return Held(int(data["lsn"]), {str(k): int(v) for k, v in data["ends"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def forget_held(settings: Settings, store: str | None = None) -> None:
    """A new snapshot starts, or `store` is emptied to be rebuilt from the log: it holds
    nothing the snapshot wrote (None: no store does)."""
    if store is not None:
        _file(settings, store).unlink(missing_ok=True)
        return
    folder = settings.data_dir / "checkpoints" / settings.pipeline.name
    for path in folder.glob("snapshot-held-*.json"):
        path.unlink(missing_ok=True)


def _lock_key(settings: Settings, store: str) -> int:
    name = f"cdc snapshot writes:{settings.pipeline.name}:{store}".encode()
    return int.from_bytes(hashlib.sha256(name).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def writing_lock(settings: Settings, store: str) -> Iterator[None]:
    """Hold the lock that says the snapshot writes `store` (module doc) while the block
    runs; StoreBusyError when another snapshot of this pipeline holds it."""
    try:
        conn = psycopg.connect(
            settings.postgres.dsn(),
            autocommit=True,
            application_name=f"cdc snapshot ({store})",
            connect_timeout=10,
        )
    except psycopg.Error as exc:
        raise SourceUnavailableError(
            f"{store}: could not take the snapshot's lock in PostgreSQL "
            f"({str(exc).strip().splitlines()[0]}): check `cdc status`"
        ) from None
    with conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (_lock_key(settings, store),))
        taken = row.fetchone()
        if not (taken and taken[0]):
            raise StoreBusyError(
                f"another `cdc snapshot` of pipeline {settings.pipeline.name} writes {store}: "
                "let it end first"
            )
        yield


def snapshot_writes(settings: Settings, store: str) -> bool:
    """Whether a snapshot writes `store` now (holds its lock)."""
    key = _lock_key(settings, store) & 0xFFFFFFFFFFFFFFFF
    try:
        with psycopg.connect(settings.postgres.dsn(), autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = %s::oid AND objid = %s::oid AND objsubid = 1)",
                (key >> 32, key & 0xFFFFFFFF),
            ).fetchone()
    except psycopg.Error as exc:
        raise SourceUnavailableError(
            f"PostgreSQL does not answer ({str(exc).strip().splitlines()[0]})"
        ) from None
    return bool(row and row[0])
