"""The write rule every store follows (contract point 4).

Each change event has a log position: its partition and offset in the change
topic. A key always lives in one partition, so for one key the offset orders
its events. A store keeps, per key, the position of the event that last wrote
it (also for a deleted key, as a marker) and takes a write only if the write's
position is newer. Within a micro-batch only each key's last event is written.
Replays, retries and restarts from any checkpoint therefore converge to the
state of applying each key's last event once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "Stored", "apply_changes", "is_newer", "last_per_key"]


@dataclass(frozen=True)
class Change:
    """One event of a change topic, as the stores see it."""

    key: Hashable
    partition: int
    offset: int
    row: Mapping[str, Any] | None  # None: the key was deleted (a delete or a tombstone)


@dataclass(frozen=True)
class Stored:
    """What a store holds for a key: the row (None: a deleted marker) and its position."""

    offset: int
    row: Mapping[str, Any] | None


def is_newer(offset: int, stored: Stored | None) -> bool:
    return stored is None or offset > stored.offset


def last_per_key(changes: Iterable[Change]) -> dict[Hashable, Change]:
    """Each key's last event in a batch (the batch may hold them in any order)."""
    last: dict[Hashable, Change] = {}
    for change in changes:
        seen = last.get(change.key)
        if seen is None or change.offset > seen.offset:
            last[change.key] = change
    return last


def apply_changes(state: dict[Hashable, Stored], batch: Iterable[Change]) -> None:
    """Apply one micro-batch to state by the write rule (the model every store implements)."""
    for key, change in last_per_key(batch).items():
        if is_newer(change.offset, state.get(key)):
            state[key] = Stored(change.offset, change.row)
