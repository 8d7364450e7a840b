"""What a store is, in two halves: the apply job writes it (StoreWriter: each key's newest
change of a micro-batch, by the write rule), and verify, repair, rebuild and `cdc get`
read and mend it (StoreReader: `rows`, `form`, `remove`, `reset`, `get`). A store's
class has both; each side asks the registry for the half it uses, by name.

A store that does not answer (refused connections, timeouts, 5xx, 429) retries, then
raises StoreUnavailableError: the batch is not committed and is written again once the
store answers. Only a deterministic refusal of one record goes back as `rejected`, for
the dead-letter topic."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from cdc.core.catalog import Column, Table
from cdc.core.errors import StoreError, StoreUnavailableError
from cdc.core.settings import Settings
from cdc.core.settings.views import ViewSettings
from cdc.core.topics import ChangeRecord
from cdc.log.checkpoints import Checkpoint
from cdc.log.position import Event

__all__ = [
    "BatchContext",
    "BatchOutcome",
    "DerivedQuery",
    "DerivedView",
    "DerivedViews",
    "DigestReader",
    "Entry",
    "Expected",
    "FrameReader",
    "FrameStore",
    "RowForm",
    "RowStore",
    "Rows",
    "SqlReader",
    "StoreReader",
    "StoreWriter",
    "StreamingDerivedView",
    "TextSearcher",
    "ValueForm",
    "Verifier",
    "ViewReader",
    "WriteResult",
    "row_digest",
    "unavailable_on",
]

# a table's rows as verify compares them: by key text (cdc/types/keys.py), each row
# in its store's comparison form
Rows = dict[str, dict[str, Any]]

# a source row (values as verify reads them from PostgreSQL) in a store's comparison form
RowForm = Callable[[Table, dict[str, Any]], dict[str, Any]]


def row_digest(form: dict[str, Any]) -> bytes:
    """The content hash verify compares a row by: its comparison form (a source row
    brought to a store's form, or the store's row) as sorted JSON, SHA-1.

    The JSON is orjson's (a tenth of the json module's time: this runs for every row of
    every side), with json's meaning: what it has no type for is its str(), as for json's
    `default=str`. Where orjson's text would say less than json's, json's is hashed
    instead: NaN and infinities (orjson writes null), integers past 64 bits and lone
    surrogates (orjson refuses them). The two texts never meet: json's separators have
    spaces, orjson's none."""
    try:
        text = orjson.dumps(form, default=str, option=_DIGEST_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        text = None
    if text is None or (b"null" in text and _unfinite(form)):
        json_text = json.dumps(form, sort_keys=True, default=str, ensure_ascii=False)
        text = json_text.encode("utf-8", "surrogatepass")
    return hashlib.sha1(text).digest()


# datetimes to str() as json's default=str does (orjson writes its own ISO 8601)
_DIGEST_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def _unfinite(value: Any) -> bool:
    """Whether `value` holds a NaN or an infinity (which orjson writes as null)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_unfinite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_unfinite(v) for v in value)
    return False


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


@dataclass
class BatchContext:
    """What the apply job hands a store with each micro-batch (cdc/apply/batch.py), once
    the source and the log are still the ones it applied from."""

    batch_id: int
    started_ms: int  # when the batch started: its events' ages are counted from here
    topics: dict[str, str]  # change topic -> captured table (and the TRUNCATEs' topic)
    tables: dict[str, Table]  # the captured tables, as the source's catalog has them now
    behind: int  # records of the log the store was behind at the batch's start
    # table -> its last TRUNCATE's position (Progress.truncated); the store adds the
    # batch's TRUNCATEs
    last_truncate: dict[str, tuple[int, int]]
    # table -> its TRUNCATEs, [commit_lsn, lsn, commit time], oldest first
    # (Progress.truncations)
    truncate_log: dict[str, list[list[int]]]
    # the captured table a TRUNCATE recorded under a name (and relation id) emptied
    emptied_by: Callable[[str, int | None], str | None]
    # a poison event (a row with its topic, partition, offset, key, value and error),
    # for the dead-letter topic
    dead_letter: Callable[[Any], None]
    # how many records the batch holds, when known (a snapshot's group); None: at most
    # `behind`, and at most the store's max_offsets of its query
    records: int | None = None


@dataclass
class BatchOutcome:
    """What a store wrote of a batch, for its progress record (cdc/log/progress.py)."""

    n: int = 0  # the changes of captured tables in it
    commit_ms: int | None = None  # the newest commit time among them
    commit_lsn: int = 0  # the newest source position among them
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> last offset
    ages: dict[int, int] = field(default_factory=dict)  # age bucket -> changes (freshness)
    counts: dict[str, int] | None = None  # written and stale, where the store counts them
    dead: int = 0  # events sent to the dead-letter topic
    route: str = ""  # how the batch was written (a store's own names: its log, metrics)
    written_by_spark: dict[str, str] | None = None  # FrameStore.written_by_spark


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

    def max_offsets(self, default: int) -> int:
        """The most records one micro-batch of its query takes (apply.max_offsets_per_trigger
        by default)."""
        return default

    def take_views(self, views: Sequence[DerivedView]) -> None:
        """Keep these derived views (a store declaring the "views" ability): those it
        refreshes from its batches, it refreshes after each."""
        if views:
            raise TypeError(f"store {self.name} keeps no views")

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


def unavailable_on(*down: type[BaseException]) -> Callable[[Callable[..., Any]], Any]:
    """A store's method that reads or mends it, with the store's client errors that mean
    it does not answer (`down`: refused, timed out) raised as StoreUnavailableError, in
    the store's words (its `unavailable(exc)`); a generator's as it is iterated. So verify,
    repair, rebuild and `cdc get` say in one line which store is down, whenever it went."""

    def wrap(method: Callable[..., Any]) -> Any:
        if inspect.isgeneratorfunction(method):

            @functools.wraps(method)
            def rows(self: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    yield from method(self, *args, **kwargs)
                except down as exc:
                    raise StoreUnavailableError(self.unavailable(exc)) from None

            return rows

        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except down as exc:
                raise StoreUnavailableError(self.unavailable(exc)) from None

        return call

    return wrap


class StoreReader(ABC):
    """What `cdc verify`, repair, rebuild and `cdc get` read back and mend."""

    name: str
    # it reads a row by its name (held_keys) and its names without their rows (key_texts)
    reads_by_name: bool = False

    @abstractmethod
    def reset(self, table: Table) -> None:
        """Remove everything the store holds of `table` (for a rebuild from the log)."""

    @abstractmethod
    def rows(self, table: Table) -> Rows:
        """The live rows the store holds of `table` (no deleted markers), by key text, in
        the store's comparison form."""

    def held(self, table: Table) -> Iterable[tuple[str, dict[str, Any]]]:
        """`rows`, one (key text, row) at a time: what verify reads (a store that can
        read its rows in turn overrides it, so that they are never all in memory)."""
        return self.rows(table).items()

    def held_keys(
        self, table: Table, names: dict[str, str]
    ) -> Iterable[tuple[str, dict[str, Any]]]:
        """`held`, of only the keys of `names` (key text -> the key's name in the store:
        its change events' key, cdc/check/keyed.py); a store that `reads_by_name`."""
        raise NotImplementedError

    def key_texts(self, table: Table, wanted: set[str]) -> set[str]:
        """Which of the key texts `wanted` the store holds a live row of, under whatever
        name (one written by another writer, say), every name it holds of the table
        read without the rows; a store that `reads_by_name`."""
        raise NotImplementedError

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

    def unavailable(self, exc: BaseException) -> str:
        """What the store says when it does not answer (`exc`: its client's error)."""
        return f"store {self.name} does not answer ({type(exc).__name__})"

    def unreadable(self, table: Table, exc: BaseException) -> StoreError | None:
        """What the store says of `exc`, met reading `table`, when it means the store's
        copy of the table is broken (a data file its log names is gone, say) and what
        mends it; None for any other error."""
        return None

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class RowStore(StoreWriter):
    """A store written row by row from Python (cache, search)."""

    @abstractmethod
    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        """Write each event if it is newer than what the store holds for its key."""


class FrameStore(StoreWriter):
    """A store written from Spark frames (the warehouse): it takes each micro-batch whole,
    chooses how to write it, and says what it wrote."""

    def written_by_spark(self) -> dict[str, str]:
        """The tables its faster writer cannot write in this process, each with why
        (Spark writes them, slower): `cdc status` shows them."""
        return {}

    @abstractmethod
    def write_batch(self, raw: Any, ctx: BatchContext) -> BatchOutcome:
        """Write the micro-batch `raw` (the Kafka source's frame: key, value, topic,
        partition, offset; generated columns computed) of the tables in `ctx`: each key's
        newest change by the write rule, its TRUNCATEs (added to `ctx.last_truncate` and
        `ctx.truncate_log`), its poison events to `ctx.dead_letter`."""


# What a store's reader can do beyond StoreReader, by the abilities its declaration names
# (cdc/core/store_declarations.py); cdc/stores/registry.py `reader_with` finds the store.


@runtime_checkable
class ViewReader(Protocol):
    """The "views" ability: the derived views a store keeps, read back."""

    name: str

    def view_rows(self, view: Table, name: str) -> Rows:
        """The rows of the view `name` (`view`: its columns and key, as a table), by key
        text, in the store's comparison form (`form`)."""
        ...

    def view_frame(self, name: str) -> Any | None:
        """The view `name` as a Spark frame, or None while it has none."""
        ...

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class DigestReader(Protocol):
    """A store verify reads on Spark's executors (cdc/check/spark_verify.py): each key's
    content hash of its live row, computed where the rows are read, so that only the
    keys that differ reach the `cdc` process."""

    name: str

    def source_form(self) -> RowForm:
        """`form` as a function of the row alone (a module's function, which Spark ships
        to the executors), bringing the source's rows to the store's form there."""
        ...

    def unreadable(self, table: Table, exc: BaseException) -> StoreError | None:
        """As StoreReader's: the store's copy of `table` is broken, said with its mend."""
        ...

    def digest_frame(self, spark: Any, table: Table, parts: int, shipped: Any) -> Any:
        """A Spark frame (`key` string, `digest` binary) of the live rows of `table`: each
        key's text and row_digest of the row as `rows` gives it, computed on the executors
        in about `parts` tasks. `shipped`: the settings the executors open the store with
        (every secret but the store's blanked)."""
        ...


@runtime_checkable
class FrameReader(Protocol):
    """The "expectations" ability: a table's live rows and history as Spark frames."""

    name: str
    spark: Any

    def holds(self, table: Table) -> bool:
        """Whether the store has the table at all."""
        ...

    def live_frame(self, table: Table) -> Any | None: ...

    def history_frame(self, table: Table) -> Any | None: ...


@runtime_checkable
class SqlReader(Protocol):
    """The "sql" ability: its tables registered for Spark SQL (`cdc query`)."""

    name: str
    spark: Any

    def register_for_sql(
        self, tables: list[str], views: list[str], as_of: str | None = None
    ) -> dict[str, str]:
        """Register, in its Spark session, each of `tables` (qualified) and `views` it
        holds under its SQL name (as of a version, digits, or a time); SQL name -> where
        it lives. Raises QueryError for a state it does not have."""
        ...


@runtime_checkable
class TextSearcher(Protocol):
    """The "text_search" ability: a table's rows found by text (`cdc search`)."""

    name: str

    def find(
        self, table: Table, text: str, limit: int
    ) -> list[tuple[float, dict[str, Any]]] | None:
        """The best `limit` rows matching `text`, each with its score; None when the store
        has no index for the table yet."""
        ...


# The "views" ability: the derived views (`apply.joins`, `apply.windows`) as the apply job
# and the checks see them, whatever store keeps them (its declaration's `views` door,
# cdc/stores/registry.py `derived_views`; the warehouse's: cdc/stores/warehouse/views/).

# a value of either side in one comparable form (the warehouse's, warehouse_value)
ValueForm = Callable[[Column, Any], Any]
# a view's rows computed from the log: per row's key, its values and when it is due (ms)
Expected = dict[Any, tuple[Any, int]]


class Verifier(Protocol):
    """The comparisons `cdc verify` runs (cdc/check/view_checks.py); each view says which
    is its own (`DerivedView.verify`)."""

    def against_source(self, view: Any) -> Any:
        """The view against the same view computed by PostgreSQL, at a consistent cut."""

    def against_log(self, view: Any) -> Any:
        """The view against its rows from the log, once the store applied it all."""

    def at_watermark(self, view: Any) -> Any:
        """The view against its rows from the log due at its query's watermark."""

    def as_filled(self, view: Any) -> Any:
        """The view against its windows from the log, counting what came too late."""


class DerivedView(Protocol):
    """One derived view: its name, its settings, the captured tables it reads (`sides`),
    and how `cdc verify` compares it."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> ViewSettings: ...

    @property
    def sides(self) -> tuple[str, ...]: ...

    @property
    def verified_as(self) -> str:
        """What `cdc verify` says it compares."""
        ...

    def verify(self, by: Verifier) -> Any:
        """Its comparison: one of `by`'s."""
        ...

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Its rows computed again from the change logs (`logs`: per table), each with
        when it is due, every value in `form`."""
        ...

    def held(self, frame: Any, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        """Its rows in the store (`frame`, ViewReader.view_frame), keyed and valued as
        `expected`."""
        ...


class StreamingDerivedView(DerivedView, Protocol):
    """A derived view kept by a streaming query (alone or shared with other views)."""

    @property
    def checkpoint_label(self) -> str:
        """The name of its query's checkpoint folder (and scheduler pool)."""
        ...

    @property
    def late_readers(self) -> int:
        """How many of its query's readers drop each late event."""
        ...


class DerivedQuery(Protocol):
    """A streaming query that keeps one or more streaming views (`members`)."""

    @property
    def label(self) -> str:
        """Its checkpoint folder's name (and scheduler pool)."""
        ...

    @property
    def members(self) -> Sequence[StreamingDerivedView]: ...

    @property
    def steps(self) -> Sequence[slice]:
        """Per member, which of the query's stateful steps (as its progress reports list
        them) are its own; known once the query is made."""
        ...

    def name(self, settings: Settings) -> str:
        """The streaming query's name."""
        ...

    def definition(self) -> str:
        """What its checkpoint was written for: another starts it afresh."""
        ...

    def query(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Any:
        """The streaming query, ready for a trigger and start()."""
        ...


@dataclass(frozen=True)
class DerivedViews:
    """The door to the derived views of the store that keeps them (its declaration's
    `views`): `of` every view of the pipeline; `checked` the same, once each names
    captured tables and columns (ConfigError, in one line, else); `queries` the streaming
    queries that keep the streaming ones among the views given."""

    of: Callable[[Settings], Sequence[DerivedView]]
    checked: Callable[[Settings, dict[str, Table]], Sequence[DerivedView]]
    queries: Callable[[Sequence[DerivedView]], Sequence[DerivedQuery]]
