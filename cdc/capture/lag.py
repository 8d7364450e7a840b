"""How far the capture is behind PostgreSQL: commit → in Kafka, in PostgreSQL's time.

Debezium's heartbeat writes the pipeline's row of the heartbeat table every
`pipeline.heartbeat_interval_ms` (its `heartbeat.action.query`), and that change is
captured like any other, to a topic of its own (cdc/core/topics.py `heartbeat_rows_topic`).
The log is in commit order, so once the heartbeat committed at `commit_ms` is in Kafka,
every change committed before it is too. While the capture runs, the next heartbeat
commits one interval later; when none has come for longer than that, the capture has
delivered nothing since: the changes committed after the last heartbeat may be waiting
in PostgreSQL. The capture's lag is therefore

    max(the last heartbeat's own commit → Kafka latency, now - its commit - interval)

which stays near the capture's latency on an idle source (the heartbeats keep coming)
and grows, one second a second, from one interval after the last heartbeat when the
capture stalls or fails (Connect stopped or paused, a task failed, Debezium blocked
behind a long transaction, Kafka refusing its writes). Every store's lag is at least
this: a change not in Kafka yet is a change no store has applied.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from cdc.core.topics import HeartbeatMark

__all__ = ["CaptureLag", "capture_lag"]


@dataclass(frozen=True)
class CaptureLag:
    """The capture's lag, and what it is read from."""

    lag_s: float | None  # None: no heartbeat in the log yet (unknown)
    heartbeat_ms: int | None  # commit time of the newest heartbeat in the log
    latency_s: float | None  # that heartbeat's commit → Kafka
    interval_s: float  # pipeline.heartbeat_interval_ms
    stalled: bool  # the next heartbeat is late by more than half an interval
    why: str  # what the lag is made of (a stall: since when), or why it is unknown

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def capture_lag(
    mark: HeartbeatMark | None,
    interval_s: float,
    now_ms: float,
    connector: str | None = None,
    topic: str = "the heartbeat table's topic",
) -> CaptureLag:
    """The capture's lag at `now_ms` from the newest heartbeat in the log (`mark`);
    `connector`: what is wrong with its connector, if anything, said when it stalls."""
    if mark is None:
        why = (
            f"capture lag unknown: no heartbeat in {topic} yet (the first comes within "
            "pipeline.heartbeat_interval_ms of the connector's start; a pipeline set up "
            "before its heartbeats were captured needs `cdc setup`)"
        )
        return CaptureLag(None, None, None, interval_s, False, why)
    latency = max(mark.captured_ms - mark.commit_ms, 0) / 1000
    silent = max(now_ms - mark.commit_ms, 0) / 1000
    lag = max(latency, silent - interval_s)
    # the next heartbeat is late by more than half an interval (a second at least)
    stalled = silent - interval_s > max(interval_s / 2, 1.0)
    if stalled:
        at = time.strftime("%H:%M:%S", time.localtime(mark.commit_ms / 1000))
        why = (
            f"capture has delivered nothing since {at} ({silent:.0f}s; a heartbeat is "
            f"due every {interval_s:g}s)"
        )
        if connector:
            why += f"; {connector}"
    else:
        why = (
            f"capture is {lag:.1f}s behind PostgreSQL (its last heartbeat reached Kafka "
            f"{latency:.1f}s after its commit)"
        )
    return CaptureLag(round(lag, 3), mark.commit_ms, round(latency, 3), interval_s, stalled, why)
