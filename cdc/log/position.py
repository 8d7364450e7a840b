"""The write rule every store follows (contract point 4), and where a change sits.

A change's position is where it sits in the source, not in Kafka: Debezium's
`source.sequence` is `[lastCommitLsn, lsn]`, the LSN of the last commit before the
change's transaction (the same for every change of a transaction, and growing with
commit order) and the change's own LSN (growing within its transaction). So
`(commit_lsn, lsn)` orders the changes of a key the way the source committed them, a
change re-delivered by Debezium (at-least-once, at a new Kafka offset) has the position
it had the first time, and positions survive the log being rebuilt. An initial snapshot
row sits at `(consistent point, 0)`: before every change streamed after it (the
connector of a generation starts with its last commit at the consistent point). A
backfill row sits at `(the commit Debezium had last seen when it emitted its chunk, 0)`:
after every change of its key that the chunk read saw (changes inside the chunk's window
were taken out of it), before every change of a transaction committed later.

A store keeps, per key, the position of the change that last wrote it (also for a
deleted key, as a marker) and takes a write only if the write's position is newer;
within a micro-batch only each key's newest change is written. A tombstone (null value,
no position) follows its key's delete in the same partition: it deletes only what an
earlier offset of that partition wrote, and its marker sits just below the position it
deleted (`below`). Replays, retries,
duplicates and restarts from any checkpoint therefore converge to the state of applying
each key's newest change once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "Change",
    "Position",
    "Stored",
    "apply_changes",
    "below",
    "event_position",
    "is_newer",
    "newest_per_key",
]

Position = tuple[int, int]  # (commit_lsn, lsn)


def event_position(op: str, source: Mapping[str, Any]) -> Position | None:
    """A change event's position from its `source` block (None: no position in it).

    Debezium's incremental-snapshot (backfill) rows carry no `lsn`, only their sequence."""
    lsn = source.get("lsn")
    sequence = source.get("sequence")
    commit = change = None
    if sequence:
        try:
            commit, change = orjson.loads(sequence)[:2]
        except (orjson.JSONDecodeError, TypeError, ValueError):
            commit = change = None
    if change is None:
        change = lsn
    if change is None:
        return None
    if commit is None:
        if op == "r":  # an initial snapshot row: at its consistent point, before the stream
            return (int(change), 0)
        return (int(change), int(change))  # a connector started without an offset (not by cdc)
    if op == "r" and source.get("snapshot") == "incremental":
        # a backfill row: read before its window's closing watermark committed (`commit`),
        # so before any change of a later transaction, whose commit_lsn is at least that
        # even when its change's own LSN is lower (it began before the watermark)
        return (int(commit), 0)
    return (int(commit), int(change))


@dataclass(frozen=True)
class Change:
    """One event of a change topic, as the stores see it (position None: a tombstone)."""

    key: Hashable
    partition: int
    offset: int
    position: Position | None
    row: Mapping[str, Any] | None  # None: the key was deleted (a delete or a tombstone)


@dataclass(frozen=True)
class Stored:
    """What a store holds for a key: the row (None: a deleted marker), its position, and
    the offset of the record that last touched it."""

    position: Position
    row: Mapping[str, Any] | None
    offset: int = -1


def below(position: Position) -> Position:
    """The position a tombstone's deleted marker keeps: just below the change it deleted,
    so that every older change is refused and that change itself, if Debezium delivers it
    again after a tombstone it delivered again, is taken again."""
    return (position[0], position[1] - 1)


def is_newer(position: Position, stored: Stored | None) -> bool:
    return stored is None or position > stored.position


def newest_per_key(changes: Iterable[Change]) -> dict[Hashable, Change]:
    """Each key's newest change in a batch: the highest position; a tombstone only when it
    is the last record of its key and no change of the key shares the batch."""
    newest: dict[Hashable, Change] = {}
    for change in changes:
        seen = newest.get(change.key)
        if seen is None:
            newest[change.key] = change
        elif change.position is None:
            if seen.position is None and change.offset > seen.offset:
                newest[change.key] = change
        elif seen.position is None or change.position > seen.position:
            newest[change.key] = change
    return newest


def apply_changes(state: dict[Hashable, Stored], batch: Iterable[Change]) -> None:
    """Apply one micro-batch to state by the write rule (the model every store implements)."""
    for key, change in newest_per_key(batch).items():
        stored = state.get(key)
        if change.position is None:  # a tombstone: deletes what an earlier record wrote
            if stored is not None and stored.row is not None and stored.offset < change.offset:
                state[key] = Stored(below(stored.position), None, change.offset)
        elif is_newer(change.position, stored):
            state[key] = Stored(change.position, change.row, change.offset)
