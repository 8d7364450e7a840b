"""What each store has applied: one record per store, written after every micro-batch.

`<data_dir>/checkpoints/<pipeline>/<store>.progress.json`, the driver's records (beside
the store's Spark checkpoint unless `[apply] checkpoints` puts those elsewhere).
The apply job writes it (and reads it back: the TRUNCATE cut-offs, the generation it
swept, what it applied of each topic partition); `cdc status`, `cdc verify`'s cut,
`cdc rebuild` and the benchmarks read it. A window aggregate keeps the events it
counted too late beside it (`window-<name>.progress.json`), and the definition its
checkpoint was written for (`window-<name>.definition`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir
from cdc.log.checkpoints import Checkpoint, checkpoints_of_pipeline
from cdc.log.position import Position

__all__ = [
    "MAX_CUTS",
    "Progress",
    "add_cut",
    "forget_other_definition",
    "forget_other_view_queries",
    "late_events",
    "note_late",
    "progress_file",
    "read_progress",
    "records_dir",
    "set_waiting",
    "write_progress",
]


def records_dir(settings: Settings) -> Path:
    """The driver's folder of the pipeline's own records (beside its Spark checkpoints
    when those are local: cdc/log/checkpoints.py)."""
    return settings.data_dir / "checkpoints" / settings.pipeline.name


def forget_other_definition(settings: Settings, checkpoint: Checkpoint, definition: str) -> None:
    """Remove a window query's checkpoint when its view was defined otherwise when the
    checkpoint was written (another window, gap, key...): its state and its table would
    mix both definitions. The query then starts afresh from the log's start (it empties
    its table first). The definition is kept in the pipeline's records."""
    marker = records_dir(settings) / f"{checkpoint.label}.definition"
    try:
        held = marker.read_text()
    except OSError:
        held = None
    if held is not None and held != definition:
        checkpoint.remove()
    if held != definition:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(definition)


def forget_other_view_queries(settings: Settings, labels: set[str]) -> None:
    """Remove the checkpoint (and definition) of each view query of the pipeline that
    is not one of `labels` (the queries the views run in now): a view that ran alone and
    now shares a query, or the reverse, or one removed, must not resume from it later
    (its table has been written by another query since); it starts afresh instead."""
    view_query = ("window-", "views-")
    for found in checkpoints_of_pipeline(settings):
        if found.label.startswith(view_query) and found.label not in labels:
            found.remove()
    for marker in records_dir(settings).glob("*.definition"):
        if marker.name.startswith(view_query) and marker.stem not in labels:
            marker.unlink(missing_ok=True)


MAX_CUTS = 20  # the TRUNCATEs kept per table


def add_cut(cuts: list[list[int]], at: Position, commit_ms: int) -> list[list[int]]:
    """`cuts` (oldest first) with the TRUNCATE at `at` (once: a replay meets it again),
    the last MAX_CUTS kept."""
    if any((c[0], c[1]) == at for c in cuts):
        return cuts
    return sorted([*cuts, [at[0], at[1], commit_ms]])[-MAX_CUTS:]


def progress_file(settings: Settings, store: str) -> Path:
    return records_dir(settings) / f"{store}.progress.json"


@dataclass
class Progress:
    """A store's progress record."""

    batch: int = -1  # the last micro-batch written
    applied: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> last offset
    # topic -> the Kafka topic id (KIP-516) those offsets are of: a topic deleted and
    # created again under its name has another, whatever its offsets have grown to
    topic_ids: dict[str, str] = field(default_factory=dict)
    commit_lsn: int = 0  # the newest source position the store took (a change or a TRUNCATE)
    commit_ms: int | None = None  # commit time of the newest change applied
    applied_ms: int | None = None  # when the last batch was written
    last_batch: dict[str, int] | None = None  # its counts (written, stale)
    truncated: dict[str, Position] = field(default_factory=dict)  # table -> last TRUNCATE
    # table -> its TRUNCATEs, [commit_lsn, lsn, commit time], oldest first (the last
    # MAX_CUTS): a version before one ends at the first after it (the warehouse's history)
    truncations: dict[str, list[list[int]]] = field(default_factory=dict)
    generation: int = -1  # the last snapshot generation swept (cdc/capture/generation.py)
    # the source's [system identifier, timeline] when the last batch was written
    source: list[Any] | None = None
    waiting: dict[str, Any] | None = None  # the store did not answer: reason, since_ms, pid
    pid: int | None = None  # the process that wrote its last batch
    freshness: dict[str, Any] | None = None  # commit to visible (cdc/log/freshness.py)
    # tables its faster writer cannot write, and why (FrameStore.written_by_spark)
    written_by_spark: dict[str, str] | None = None
    route: str | None = None  # how its last batch was written (a store's own name for it)
    routes: dict[str, int] = field(default_factory=dict)  # batches written by each route

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        truncated = {}
        for table, at in (known.pop("truncated", None) or {}).items():
            # written as [commit_lsn, lsn]; a bare LSN before positions had two parts
            truncated[table] = (int(at[0]), int(at[1])) if isinstance(at, list) else (int(at), 0)
        if "truncations" not in known:  # a record of the last TRUNCATE's time only
            times = data.get("truncated_ms") or {}
            known["truncations"] = {
                t: [[*at, int(times[t])]] for t, at in truncated.items() if t in times
            }
        return cls(truncated=truncated, **known)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        record["truncated"] = {t: list(at) for t, at in self.truncated.items()}
        return record

    def offset(self, topic: str, partition: int) -> int:
        """The last offset applied of a topic partition (-1: none)."""
        return self.applied.get(f"{topic}:{partition}", -1)

    def backlog(self, ends: dict[str, dict[int, int]]) -> int:
        """The events still to apply, given each topic partition's end offset."""
        return sum(
            max(end - (self.offset(topic, partition) + 1), 0)
            for topic, parts in ends.items()
            for partition, end in parts.items()
        )

    def lag_s(
        self,
        backlog: int,
        now_ms: float,
        snapshot_ms: int | None = None,
        oldest_ms: int | None = None,
    ) -> float | None:
        """How far behind the source the store is: 0 when it holds everything in the log
        (an idle store is caught up, however old its last change); with a backlog, the
        age of the oldest change it has not applied (`oldest_ms`, its commit time), else
        the time since the commit of the newest change it holds (it is at least that far
        behind). A store that has applied no change yet lacks the snapshot's rows: it is
        at least as far behind as the snapshot taken at `snapshot_ms` (None without)."""
        if not backlog:
            return 0.0
        if oldest_ms is not None:
            return max(now_ms - oldest_ms, 0) / 1000
        since = self.commit_ms if self.commit_ms is not None else snapshot_ms
        if since is None:
            return None
        return max(now_ms - since, 0) / 1000

    def last_latency_s(self) -> float | None:
        """Commit to visible of the newest change the store applied: its batch's end minus
        its commit time."""
        if self.commit_ms is None or self.applied_ms is None:
            return None
        return max(self.applied_ms - self.commit_ms, 0) / 1000

    def first_unapplied(self, ends: dict[str, dict[int, int]]) -> set[tuple[str, int, int]]:
        """(topic, partition, offset) of the first record not applied, per partition
        that has one."""
        return {
            (topic, partition, self.offset(topic, partition) + 1)
            for topic, parts in ends.items()
            for partition, end in parts.items()
            if self.offset(topic, partition) + 1 < end
        }

    def behind(self, ends: dict[str, dict[int, int]]) -> list[str]:
        """The topic partitions not applied up to their end ("topic:partition")."""
        return [
            f"{topic}:{partition}"
            for topic, parts in ends.items()
            for partition, end in parts.items()
            if end > 0 and self.offset(topic, partition) < end - 1
        ]

    def applied_of(self, topics: set[str] | dict[str, Any]) -> dict[tuple[str, int], int]:
        """What it applied of `topics`: (topic, partition) -> last offset."""
        found = {}
        for where, offset in self.applied.items():
            topic, _, partition = where.rpartition(":")
            if topic in topics:
                found[(topic, int(partition))] = offset
        return found


def read_progress(settings: Settings, store: str) -> Progress | None:
    try:
        return Progress.from_json(json.loads(progress_file(settings, store).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_progress(settings: Settings, store: str, progress: Progress) -> None:
    path = progress_file(settings, store)
    if not path.parent.is_dir():  # made once (and again after `cdc down --purge`)
        make_state_dir(settings, path.parent)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(progress.to_json()))
    tmp.replace(path)


def set_waiting(settings: Settings, store: str, why: str | None) -> None:
    """Note (or clear) that the store does not answer, for `cdc status`, with the process
    that waits (a note that process left when it was stopped is no wait)."""
    progress = read_progress(settings, store) or Progress()
    progress.waiting = (
        None
        if why is None
        else {"reason": why, "since_ms": int(time.time() * 1000), "pid": os.getpid()}
    )
    write_progress(settings, store, progress)


def _late_file(settings: Settings, window: str) -> Path:
    return progress_file(settings, f"window-{window}")


def late_events(settings: Settings, window: str) -> int | None:
    """The events a window aggregate counted too late (after its watermark), if noted."""
    try:
        return int(json.loads(_late_file(settings, window).read_text())["late"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def forget_late(settings: Settings, window: str) -> None:
    """Forget the late events noted for a window whose query starts afresh."""
    _late_file(settings, window).unlink(missing_ok=True)


def note_late(
    settings: Settings,
    window: str,
    recent: list[dict[str, Any]],
    readers: int = 1,
    steps: slice = slice(None),
) -> None:
    """Add up the late events of the window query's progress reports not noted yet
    (each one dropped by each of the view's `readers` of its topic; `steps`: which of
    the reports' stateful operators are the view's, when its query keeps several).
    A report without operators is a trigger that ran no batch (nothing to read): it
    carries the id the next batch will have, which it must not mark as noted."""
    path = _late_file(settings, window)
    try:
        noted = json.loads(path.read_text())
    except (OSError, ValueError):
        noted = {"late": 0, "batch": -1}
    fresh = [p for p in recent if p["batchId"] > noted["batch"] and p.get("stateOperators")]
    if not fresh:
        return
    dropped = 0
    for report in fresh:
        for operator in report.get("stateOperators", [])[steps]:
            dropped += int(operator.get("numRowsDroppedByWatermark", 0))
    noted["late"] += dropped // readers
    noted["batch"] = max(p["batchId"] for p in fresh)
    make_state_dir(settings, path.parent)
    path.write_text(json.dumps(noted))
