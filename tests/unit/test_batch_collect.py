"""Which warehouse batches are collected to the driver to be decoded in Arrow
(BatchWriter.collect_records): those whose every captured table Arrow decodes, that fit
the driver's heap as the last batch's records (or a sample) tell, while the last collect
was not over Spark's limit on what the driver takes."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.apply.batch import BatchWriter
from cdc.core.catalog import Column, Table
from cdc.stores.warehouse.store import WarehouseStore

RECORDS = pa.table({"key": [b"{}", b"{}"], "value": [b"{}", None]})  # 3 bytes a record


def table(base: str) -> Table:
    columns = (
        Column("id", "bigint", "int8", "N", False, None, True),
        Column("v", base, base, "X", False, None, False),
    )
    return Table("public", "t", columns, ("id",), "d", 1, 1)


TABLES = {"t": table("text")}


class Batch:
    """A micro-batch whose collect gives RECORDS, or raises `error`; its first records
    are `sampled` bytes each."""

    def __init__(self, error: str | None = None, sampled: int = 3) -> None:
        self.error, self.sampled, self.collected, self.samples = error, sampled, 0, 0

    def select(self, *columns: Any) -> Batch:
        return self

    def sample(self) -> float:
        self.samples += 1
        return float(self.sampled)

    def toArrow(self) -> Any:
        self.collected += 1
        if self.error:
            raise RuntimeError(self.error)
        return RECORDS


def writer(tmp_path: Path, engine: str = "delta-rs", each: float | None = 3.0) -> Any:
    settings = types.SimpleNamespace(
        apply=types.SimpleNamespace(warehouse_max_offsets_per_trigger=500_000),
        spark=types.SimpleNamespace(driver_memory="2g"),
    )
    store = WarehouseStore(None, str(tmp_path), writer=engine)
    state = types.SimpleNamespace(
        store=store, settings=settings, collect_refused=False, record_bytes=each
    )
    state.sampled_bytes = lambda records: records.sample()  # Spark's job, stood in for
    return state


def test_a_batch_is_collected_when_arrow_decodes_every_table(tmp_path: Path) -> None:
    batch = Batch()
    assert BatchWriter.collect_records(writer(tmp_path), batch, TABLES, 10) is RECORDS
    # a table Arrow does not decode, or the Spark writer: Spark decodes, nothing collected
    for tables, engine in (
        ({"t": table("text"), "u": table("bytea")}, "delta-rs"),
        (TABLES, "spark"),
    ):
        assert BatchWriter.collect_records(writer(tmp_path, engine), batch, tables, 10) is None
    assert batch.collected == 1


def test_a_batch_too_large_for_the_drivers_heap_is_not_collected(tmp_path: Path) -> None:
    """2 GiB of heap: up to 500,000 records of 1,000 bytes (1.5 GB once copied three
    times) are not collected; as many of 600 bytes are, and the next batch is judged by
    what they were."""
    state = writer(tmp_path, each=1000.0)
    batch = Batch()
    assert BatchWriter.collect_records(state, batch, TABLES, 10**7) is None
    assert BatchWriter.collect_records(state, batch, TABLES, 1000) is RECORDS
    assert state.record_bytes == 3.0
    # no batch collected before: the first records' sizes are the sample
    fresh, wide = writer(tmp_path, each=None), Batch(sampled=1000)
    assert BatchWriter.collect_records(fresh, wide, TABLES, 10**7) is None
    assert (wide.samples, wide.collected) == (1, 0)
    narrow = Batch(sampled=600)
    assert BatchWriter.collect_records(fresh, narrow, TABLES, 10**7) is RECORDS


def test_a_batch_over_the_drivers_limit_leaves_the_next_ones_to_spark(tmp_path: Path) -> None:
    state = writer(tmp_path)
    too_large = Batch(
        "Total size of serialized results of 3 tasks (1025.0 MiB) is bigger "
        "than spark.driver.maxResultSize (1024.0 MiB)"
    )
    assert BatchWriter.collect_records(state, too_large, TABLES, 10) is None
    assert state.collect_refused
    after = Batch()
    assert BatchWriter.collect_records(state, after, TABLES, 10) is None
    assert after.collected == 0
    with pytest.raises(RuntimeError, match="broker"):  # any other failure is the batch's
        BatchWriter.collect_records(writer(tmp_path), Batch("broker gone"), TABLES, 10)
