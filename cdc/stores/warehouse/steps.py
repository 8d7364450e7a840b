"""The steps the warehouse runs after each batch (its join views, views/) and what a batch
keeps of each table for them: the one contract between the warehouse's writes (store.py,
_arrow_batch.py) and its views, declared once.

A step says what it reads of each table's batch (`keeps`: a set of `Keep`), runs once
the batch's writes of those tables have ended, and gets, per table, a `Kept`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from cdc.core.catalog import Table

__all__ = ["BatchStep", "Keep", "Kept", "as_frame", "frames_to_keep", "steps_of"]

# what a step may read of a table's batch, each a field of Kept
Keep = Literal["keys", "created", "versions"]


@dataclass(frozen=True)
class Kept:
    """What a warehouse batch kept of one table for the steps after it: each a Spark
    frame, or an Arrow table when the batch was shaped on the driver (`as_frame` makes a
    Spark frame of either); None when no step asked for it."""

    # its keys, distinct, one column per key column (a join view's sides)
    keys: Any = None
    # its creation events (an INSERT carries every value): the columns, `_cdc_commit_lsn`,
    # `_cdc_lsn` and `_cdc_commit_ms` (the stream of a stream-table join)
    created: Any = None
    # the positions of its changes per key: `_cdc_ref` (the key), `_cdc_commit_lsn`,
    # `_cdc_lsn`; of a table with a single-column key only (the table a stream-table
    # join references)
    versions: Any = None


@runtime_checkable
class BatchStep(Protocol):
    """Work after each warehouse batch over the tables it wrote (a join view,
    views/base.py AfterBatchView)."""

    def keeps(self) -> dict[str, set[Keep]]:
        """What of each table's batch it reads; it runs after the batch's writes of those
        tables."""
        ...

    def refresh(
        self,
        spark: Any,
        root: str,
        tables: dict[str, Table],
        kept: dict[str, Kept],
        truncated: set[str],
        native: Any = None,
    ) -> None:
        """Run after the batch (`kept`: per table it keeps frames of and the batch wrote,
        what it kept; `truncated`: the tables a TRUNCATE or a reset emptied since the last
        batch; `native`: the store's delta-rs writer, native.py's NativeWriter: not
        named here, as native.py imports _arrow_batch.py, which imports this module)."""
        ...


def steps_of(views: Iterable[object]) -> list[BatchStep]:
    """Those of `views` the warehouse refreshes after each of its batches."""
    return [v for v in views if isinstance(v, BatchStep)]


def frames_to_keep(steps: Sequence[BatchStep]) -> dict[str, set[Keep]]:
    """What of each table's batch the steps after it read."""
    keep: dict[str, set[Keep]] = {}
    for step in steps:
        for table, frames in step.keeps().items():
            keep.setdefault(table, set()).update(frames)
    return keep


def as_frame(spark: Any, rows: Any) -> Any:
    """What a batch kept of a table (a Kept's field) as a Spark frame; None stays None."""
    import pyarrow as pa

    return spark.createDataFrame(rows) if isinstance(rows, pa.Table) else rows
