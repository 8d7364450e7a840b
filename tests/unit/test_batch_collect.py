"""Which warehouse batches are collected to the driver to be decoded in Arrow
(BatchWriter.collect_records): those whose every captured table Arrow decodes, while
the last collect was not over Spark's limit on what the driver takes."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.catalog import Column, Table
from materializers.apply.batch import BatchWriter
from materializers.stores.warehouse.store import WarehouseStore

RECORDS = pa.table({"key": [b"{}"], "value": [b"{}"]})


def table(base: str) -> Table:
    columns = (
        Column("id", "bigint", "int8", "N", False, None, True),
        Column("v", base, base, "X", False, None, False),
    )
    return Table("public", "t", columns, ("id",), "d", 1, 1)


class Batch:
    """A micro-batch whose collect gives `records`, or raises `error`."""

    def __init__(self, error: str | None = None) -> None:
        self.error, self.collected = error, 0

    def select(self, *columns: str) -> Batch:
        return self

    def toArrow(self) -> Any:
        self.collected += 1
        if self.error:
            raise RuntimeError(self.error)
        return RECORDS


def writer(tmp_path: Path, engine: str = "delta-rs") -> Any:
    store = WarehouseStore(None, str(tmp_path), writer=engine)
    return types.SimpleNamespace(store=store, collect_refused=False)


def test_a_batch_is_collected_when_arrow_decodes_every_table(tmp_path: Path) -> None:
    batch = Batch()
    assert BatchWriter.collect_records(writer(tmp_path), batch, {"t": table("text")}) is RECORDS
    # a table Arrow does not decode, or the Spark writer: Spark decodes, nothing collected
    for tables, engine in (
        ({"t": table("text"), "u": table("bytea")}, "delta-rs"),
        ({"t": table("text")}, "spark"),
    ):
        assert BatchWriter.collect_records(writer(tmp_path, engine), batch, tables) is None
    assert batch.collected == 1


def test_a_batch_over_the_drivers_limit_leaves_the_next_ones_to_spark(tmp_path: Path) -> None:
    state = writer(tmp_path)
    too_large = Batch(
        "Total size of serialized results of 3 tasks (1025.0 MiB) is bigger "
        "than spark.driver.maxResultSize (1024.0 MiB)"
    )
    assert BatchWriter.collect_records(state, too_large, {"t": table("text")}) is None
    assert state.collect_refused
    after = Batch()
    assert BatchWriter.collect_records(state, after, {"t": table("text")}) is None
    assert after.collected == 0
    with pytest.raises(RuntimeError, match="broker"):  # any other failure is the batch's
        BatchWriter.collect_records(writer(tmp_path), Batch("broker gone"), {"t": table("text")})
