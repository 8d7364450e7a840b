"""What a store is to the apply job: it takes each key's last change of a micro-batch and
writes it by the write rule (materializers/position.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cdc.catalog import Table

__all__ = ["Event", "Store", "WriteResult"]


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


@dataclass
class WriteResult:
    written: int = 0
    stale: int = 0  # refused by the write rule: the store holds something newer
    rejected: list[tuple[Event, str]] | None = None  # what the store refused, and why


class Store(ABC):
    """A derived store. Implementations keep their own connection per executor partition."""

    name: str

    @abstractmethod
    def prepare(self, tables: Iterable[Table]) -> None:
        """Create what the store needs per table (index, mapping...). Idempotent."""

    @abstractmethod
    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        """Write each event if it is newer than what the store holds for its key."""

    @abstractmethod
    def truncate(self, table: Table, before_lsn: int, commit_ms: int) -> None:
        """A TRUNCATE at before_lsn: every row written before it goes (idempotent)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""
