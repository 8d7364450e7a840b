"""What every derived view is, whatever its kind: a name, the tables it reads, a check
of its settings against the catalog, and how `cdc verify` compares it (`verify`: the
view picks the comparison, the checker runs it).

Each is a DerivedView (cdc/stores/base.py), as the apply job and the checks see it.
Two families: a view refreshed by the warehouse after each of its batches, from the
tables it has just written (`AfterBatchView`, a BatchStep of steps.py: table joins,
stream-table joins), and a view kept by a Structured Streaming query of its own over
the change topics, with a watermark (`StreamingView`: window aggregates, stream-stream
joins)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from cdc.core.catalog import RESERVED_PREFIX, Table
from cdc.core.errors import ConfigError
from cdc.core.settings.views import (
    JoinSettings,
    StreamStreamJoin,
    ViewSettings,
    WindowSettings,
    duration_ms,
)
from cdc.core.topics import ChangeRecord
from cdc.log.checkpoints import Checkpoint
from cdc.stores.base import Expected, ValueForm, Verifier
from cdc.stores.warehouse.steps import BatchStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NOW", "AfterBatchView", "Branch", "ReferencingJoin", "StreamingView", "View"]

NOW = -(2**62)  # a row due at once: written as soon as what makes it is read


class View:
    """One derived view, of the class its settings' kind selects (registry.py)."""

    settings: ViewSettings

    def __init__(self, settings: ViewSettings) -> None:
        self.settings = settings

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def sides(self) -> tuple[str, ...]:
        """The captured tables it reads."""
        return self.settings.sides

    def check_settings(self, tables: dict[str, Table], pipeline: str) -> None:
        """Raise ConfigError, in one line, when the view reads what is not captured."""
        for side in self.sides:
            if side not in tables:
                raise ConfigError(
                    f"view {self.name} reads {side}, which pipeline {pipeline} does not "
                    f"capture; captured: {', '.join(sorted(tables)) or 'none'}"
                )

    def has(self, table: Table, column: str) -> None:
        """Raise ConfigError when `table` has no `column`."""
        have = [c.name for c in table.columns]
        if column not in have:
            raise ConfigError(
                f"view {self.name}: {table.qualified} has no column {column}; it has "
                f"{', '.join(have)}"
            )

    def single_key(self, table: Table, what: str = "a join view") -> None:
        """Raise ConfigError when `table`'s key has several columns."""
        if len(table.key) != 1:
            raise ConfigError(
                f"view {self.name}: {table.qualified} has a composite key "
                f"({', '.join(table.key)}); {what} needs a single-column key"
            )

    def not_taken(
        self, table: Table, taken: set[str], carried: list[str], added: tuple[str, ...] = ()
    ) -> None:
        """Raise ConfigError when a column of `table` the view keeps (`taken`) is named like
        one it adds to every row (`added`), or a column it carries like either, or like
        the pipeline's own (RESERVED_PREFIX: the view's helper columns are named so)."""
        if clash := sorted(taken & set(added)):
            raise ConfigError(
                f"view {self.name}: {table.qualified}'s column {clash[0]} is named like one "
                "the view adds to every row; rename the column"
            )
        prefix, columns = (
            getattr(self.settings, "column_prefix", ""),
            getattr(self.settings, "columns", []),
        )
        if own := sorted(n for n in (prefix + c for c in columns) if n.startswith(RESERVED_PREFIX)):
            raise ConfigError(
                f"view {self.name}: its column {own[0]} starts with {RESERVED_PREFIX}, which "
                "the pipeline keeps for its own columns; give the join another prefix"
            )
        if clash := sorted((taken | set(added)) & {prefix + c for c in columns}):
            raise ConfigError(
                f"view {self.name}: {', '.join(clash)} is already a column of the view "
                f"(of {table.qualified}, or the event's); give the join another prefix"
            )

    @property
    def verified_as(self) -> str:
        """What `cdc verify` says it compares."""
        raise NotImplementedError

    def verify(self, by: Verifier) -> Any:
        """Its comparison: one of `by`'s."""
        raise NotImplementedError

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Its rows computed again from the change logs (`logs`: per table), each with
        when it is due, every value in `form` (a view compared with its source has
        none)."""
        raise NotImplementedError

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        """Its rows in the warehouse (`frame`), keyed and valued as `expected`."""
        raise NotImplementedError


class AfterBatchView(View, BatchStep):
    """A view the warehouse refreshes after each batch from the tables it wrote: its
    `keeps` and `refresh` are a BatchStep's (steps.py)."""


class ReferencingJoin(AfterBatchView):
    """A join of each row of `table` with the `references` row its `on` column holds the
    primary key of (a table join, a stream-table join)."""

    settings: JoinSettings
    # the columns the view adds to each row of `table`, before the carried ones
    added: ClassVar[tuple[str, ...]] = ()

    def check_settings(self, tables: dict[str, Table], pipeline: str) -> None:
        super().check_settings(tables, pipeline)
        join = self.settings
        left, right = tables[join.table], tables[join.references]
        for c in join.columns:
            self.has(right, c)
        self.has(left, join.on)
        self.single_key(right)
        self.not_taken(left, {c.name for c in left.columns}, join.carried, self.added)


@dataclass(frozen=True)
class Branch:
    """A streaming view's part of a query: the rows its query writes (`frame`, a
    streaming frame), and how a micro-batch of them is written (`write(batch, batch
    id)`), in the view's output mode."""

    frame: Any
    write: Callable[[Any, int], None]


class StreamingView(View):
    """A view kept by a streaming query, alone or with the views it shares one with
    (streams.py, queries.py)."""

    settings: StreamStreamJoin | WindowSettings
    # the query's name after `cdc-<pipeline>-`: <label>-<view name>
    label: ClassVar[str] = "window"
    # how many of the query's readers drop each late event
    late_readers: ClassVar[int] = 1
    # how its query writes its rows (Structured Streaming's output mode)
    mode: ClassVar[str] = "append"

    def __init__(self, settings: ViewSettings) -> None:
        super().__init__(settings)
        # the checkpoint of the query it shares with other views (queries.view_queries)
        self.shared_label: str | None = None

    @property
    def checkpoint_label(self) -> str:
        """The name of its query's checkpoint folder (and scheduler pool)."""
        return self.shared_label or f"window-{self.name}"

    def shares(self) -> tuple[Any, ...]:
        """Views of equal `shares` run in one streaming query: they write in one output
        mode, read the same tables, and drop late events by the same watermark (one
        query has one)."""
        return (self.mode, tuple(sorted(set(self.sides))), duration_ms(self.settings.watermark))

    def definition(self) -> str:
        """What its checkpoint was written for: another definition starts it afresh."""
        raise NotImplementedError

    def branch(
        self, spark: Any, settings: Any, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Branch:
        """Its part of a streaming query (`checkpoint` the query's: a query without a
        committed batch starts its table afresh)."""
        raise NotImplementedError

    def query_name(self, settings: Any) -> str:
        """The name of its streaming query alone."""
        return f"cdc-{settings.pipeline.name}-{self.label}-{self.name}"

    def query(
        self, spark: Any, settings: Any, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Any:
        """Its streaming query alone, ready for a trigger and start()."""
        branch = self.branch(spark, settings, tables, checkpoint)
        return (
            branch.frame.writeStream.queryName(self.query_name(settings))
            .outputMode(self.mode)
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(branch.write)
        )
