"""What a store is, in two halves: the apply job writes it (StoreWriter: each key's newest
change of a micro-batch, by the write rule), and verify, repair, rebuild and `cdc get`
read and mend it (StoreReader: `rows`, `form`, `remove`, `reset`, `get`). A store's
class has both; each side asks the registry for the half it uses, by name.

A store that does not answer (refused connections, timeouts, 5xx, 429) retries, then
raises StoreUnavailableError: the batch is not committed and is written again once the
store answers. Only a deterministic refusal of one record goes back as `rejected`, for
the dead-letter topic."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc.core.catalog import Table
from cdc.log.position import Event

__all__ = [
    "Entry",
    "FrameStore",
    "RowStore",
    "Rows",
    "StoreReader",
    "StoreWriter",
    "WriteResult",
]

# a table's rows as verify compares them: by key text (cdc/types/keys.py), each row
# in its store's comparison form
Rows = dict[str, dict[str, Any]]


@dataclass
class WriteResult:
    written: int = 0
    stale: int = 0  # refused by the write rule: the store holds something newer
    rejected: list[tuple[Event, str]] = field(default_factory=list)  # refused, and why


@dataclass(frozen=True)
class Entry:
    """What a store holds for one key: its fields as the store keeps them (the columns and
    the store's metadata: the position, offset, partition), and whether it is a deleted
    marker kept to refuse a stale write."""

    fields: dict[str, Any]
    deleted: bool = False


class StoreWriter(ABC):
    """What the apply job writes: a store of one of two kinds. A RowStore takes Python
    events (written by Spark's Python workers, each with its own connection), a
    FrameStore takes the batch as a Spark frame (written by the driver)."""

    name: str

    @abstractmethod
    def prepare(self, tables: Iterable[Table]) -> None:
        """Create what the store needs per table (index, mapping...). Idempotent."""

    @abstractmethod
    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        """A TRUNCATE at position `before`: every row written before it goes (idempotent)."""

    def ping(self) -> None:  # noqa: B027 - optional
        """Raise StoreUnavailableError if the store does not answer."""

    def bulk(self, tables: Iterable[Table], on: bool) -> None:  # noqa: B027 - optional
        """A batch of a backlog (catch-up) is about to be written (`on`), or has been
        (not `on`): the store may trade what its readers see during that batch for
        throughput, and must give it back when the batch ends."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class StoreReader(ABC):
    """What `cdc verify`, repair, rebuild and `cdc get` read back and mend."""

    name: str

    @abstractmethod
    def reset(self, table: Table) -> None:
        """Remove everything the store holds of `table` (for a rebuild from the log)."""

    @abstractmethod
    def rows(self, table: Table) -> Rows:
        """The live rows the store holds of `table` (no deleted markers), by key text, in
        the store's comparison form."""

    @abstractmethod
    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        """A source row (values as verify reads them from PostgreSQL) in the form `rows`
        gives the same row in."""

    @abstractmethod
    def remove(self, table: Table, keys: list[str]) -> None:
        """Remove the rows with these key texts, which the source does not have."""

    @abstractmethod
    def get(self, table: Table, key: str) -> Entry | None:
        """What the store holds for `key` (Debezium's key JSON), or None."""

    def ping(self) -> None:  # noqa: B027 - optional
        """Raise StoreUnavailableError if the store does not answer."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class RowStore(StoreWriter):
    """A store written row by row from Python (cache, search)."""

    @abstractmethod
    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        """Write each event if it is newer than what the store holds for its key."""


class FrameStore(StoreWriter):
    """A store written from Spark frames (the warehouse)."""

    def written_by_spark(self) -> dict[str, str]:
        """The tables its faster writer cannot write in this process, each with why
        (Spark writes them, slower): `cdc status` shows them."""
        return {}

    def decodes_arrow(self) -> bool:
        """Whether it takes a batch decoded in Arrow (write_frame's `decoded`)."""
        return False

    @abstractmethod
    def write_frame(
        self,
        tables: dict[str, Table],
        events: Any,
        present: set[str],
        toasted: set[str] | None = None,
        sizes: dict[str, int] | None = None,
        decoded: dict[str, Any] | None = None,
    ) -> None:
        """Write a batch's parsed events (cdc/log/envelope.py, with `cut_ms`) of the
        tables in `present`, each key's newest change by the write rule (`toasted`: the
        tables whose events may carry a TOAST placeholder, None: any of them; `sizes`:
        per table, the characters of its events' row images, None: not known; `decoded`:
        the batch decoded in Arrow, cdc/log/arrow_events.py, per table, and then
        `events` a function that makes the frame, called only if the store needs it)."""
