"""The write rule every store follows (contract point 4), stated once: the model
(`apply_changes` over `Event` and `Stored`), and from it what each store runs: the
Python writer's choice of a key's newest change in a batch (`supersedes`), the
warehouse MERGE's and TRUNCATE's condition (`older_sql`), and the cache's Lua
(`older_lua`). The search index keeps it with OpenSearch's external versions, a
number that grows with the position (cdc/stores/search/store.py `search_version`).

A change's position is where it sits in the source, not in Kafka: Debezium's
`source.sequence` is `[lastCommitLsn, lsn]`, the LSN of the last commit before the
change's transaction (the same for every change of a transaction, and growing with
commit order) and the change's own LSN (growing within its transaction). So
`(commit_lsn, lsn)` orders the changes of a key the way the source committed them, a
change re-delivered by Debezium (at-least-once, at a new Kafka offset) has the position
it had the first time, and positions survive the log being rebuilt. An initial snapshot
row sits at `(consistent point, 0)`: before every change streamed after it (the
connector of a generation starts with its last commit at the consistent point); a row a
resumed snapshot reads, one nothing changed since, at `(consistent point, 1)`. A
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

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ORDER",
    "Event",
    "Position",
    "Stored",
    "apply_changes",
    "below",
    "is_newer",
    "newest_per_key",
    "older_lua",
    "older_sql",
    "supersedes",
]

# a position's fields, compared in this order: the first that differs decides
ORDER = ("commit_lsn", "lsn")
Position = tuple[int, int]  # (commit_lsn, lsn)


@dataclass(frozen=True)
class Event:
    """One change event of a change topic, as the stores and the write rule see it: its
    envelope parsed (cdc/log/envelope.py), its values still as Debezium encodes them."""

    table: str
    key: str  # the key's JSON text, as in the topic
    partition: int
    offset: int
    op: str  # c, u, r, d
    after: dict[str, Any] | None  # Debezium-encoded values (None for deletes)
    commit_ms: int | None
    lsn: int | None
    commit_lsn: int | None = None  # with lsn, the change's position (None: a tombstone)

    @property
    def position(self) -> tuple[int, int] | None:
        if self.commit_lsn is None or self.lsn is None:
            return None
        return (self.commit_lsn, self.lsn)


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


def supersedes(
    position: Position | None, offset: int, seen: Position | None, seen_offset: int
) -> bool:
    """Whether a change (at `position`, `offset`; None: a tombstone) replaces the one seen
    before it as its key's newest in a batch: the higher position; a tombstone only over
    a tombstone (the later one), and any change over a tombstone."""
    if position is None:
        return seen is None and offset > seen_offset
    return seen is None or position > seen


def newest_per_key(changes: Iterable[Event]) -> dict[Hashable, Event]:
    """Each key's newest change in a batch: the highest position; a tombstone only when it
    is the last record of its key and no change of the key shares the batch."""
    newest: dict[Hashable, Event] = {}
    for change in changes:
        seen = newest.get(change.key)
        if seen is None or supersedes(change.position, change.offset, seen.position, seen.offset):
            newest[change.key] = change
    return newest


def older_sql(held: Sequence[str], change: Sequence[str]) -> str:
    """The rule in SQL: the row whose position columns are `held` (in ORDER) is older than
    the change at `change` (its columns, or literals). A row with no position counts as
    older: any change from the log replaces it."""
    terms = [f"{held[0]} IS NULL"]
    for i in range(len(ORDER)):
        same = [f"{held[j]} = {change[j]}" for j in range(i)]
        less = f"{held[i]} < {change[i]}"
        terms.append(f"({' AND '.join([*same, less])})" if same else less)
    return "(" + " OR ".join(terms) + ")"


def older_lua(prefix: str = "_") -> str:
    """The rule in Lua, for a Redis script: `older(key, position)`, whether the hash at
    `key` holds an older position than `position` (a table of ORDER's numbers; the hash
    keeps them in the fields `<prefix><name>`). A hash with none is older."""
    fields = ", ".join(f"'{prefix}{name}'" for name in ORDER)
    return f"""local function older(key, position)
  local held = redis.call('HMGET', key, {fields})
  if not held[1] then return true end
  for f = 1, {len(ORDER)} do
    local h = tonumber(held[f])
    if h ~= position[f] then return h < position[f] end
  end
  return false
end"""


def apply_changes(state: dict[Hashable, Stored], batch: Iterable[Event]) -> None:
    """Apply one micro-batch to state by the write rule (the model every store implements)."""
    for key, change in newest_per_key(batch).items():
        stored = state.get(key)
        if change.position is None:  # a tombstone: deletes what an earlier record wrote
            if stored is not None and stored.row is not None and stored.offset < change.offset:
                state[key] = Stored(below(stored.position), None, change.offset)
        elif is_newer(change.position, stored):
            state[key] = Stored(change.position, change.after, change.offset)
