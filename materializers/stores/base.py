"""What a store is to the apply job: it takes each key's newest change of a micro-batch and
writes it by the write rule (materializers/position.py).

A store that does not answer (refused connections, timeouts, 5xx, 429) retries, then
raises StoreUnavailableError: the batch is not committed and is written again once the
store answers. Only a deterministic refusal of one record goes back as `rejected`, for
the dead-letter topic."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc.catalog import Table

__all__ = ["Event", "FrameStore", "RowStore", "Store", "WriteResult"]


@dataclass(frozen=True)
class Event:
    """A key's last change in a batch, decoded for Python stores."""

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


@dataclass
class WriteResult:
    written: int = 0
    stale: int = 0  # refused by the write rule: the store holds something newer
    rejected: list[tuple[Event, str]] = field(default_factory=list)  # refused, and why


class Store(ABC):
    """A derived store, of one of two kinds: a RowStore takes Python events (written by
    Spark's Python workers, each with its own connection), a FrameStore takes the batch
    as a Spark frame (written by the driver)."""

    name: str

    @abstractmethod
    def prepare(self, tables: Iterable[Table]) -> None:
        """Create what the store needs per table (index, mapping...). Idempotent."""

    @abstractmethod
    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        """A TRUNCATE at position `before`: every row written before it goes (idempotent)."""

    @abstractmethod
    def reset(self, table: Table) -> None:
        """Remove everything the store holds of `table` (for a rebuild from the log)."""

    def ping(self) -> None:  # noqa: B027 - optional
        """Raise StoreUnavailableError if the store does not answer."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class RowStore(Store):
    """A store written row by row from Python (cache, search)."""

    @abstractmethod
    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        """Write each event if it is newer than what the store holds for its key."""


class FrameStore(Store):
    """A store written from Spark frames (the warehouse)."""

    @abstractmethod
    def write_frame(self, tables: dict[str, Table], events: Any, present: set[str]) -> None:
        """Write a batch's parsed events (materializers/events.py, with `cut_ms`) of the
        tables in `present`, each key's newest change by the write rule."""
