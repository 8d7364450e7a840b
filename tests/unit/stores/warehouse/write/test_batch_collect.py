"""Which warehouse batches take the `arrow` route, collected to the driver to be decoded
in Arrow (cdc/stores/warehouse/write/routes.py: `route`, WarehouseBatches.collect_records):
those whose every captured table Arrow decodes, that fit the driver's heap as the last
batch's records (or a sample) tell, while the last collect was not over Spark's limit on
what the driver takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc.core.catalog import Column, Table
from cdc.stores.base import BatchContext
from cdc.stores.warehouse.store import WarehouseStore
from cdc.stores.warehouse.write.routes import Route, WarehouseBatches, route

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
    store = WarehouseStore(None, str(tmp_path), writer=engine, max_records=500_000, heap="2g")
    batches = store.batches
    batches.record_bytes = each
    batches.sampled_bytes = lambda records: records.sample()  # type: ignore[method-assign]
    return batches


def collect(
    batches: WarehouseBatches,
    batch: Batch,
    tables: dict[str, Table],
    behind: int,
    records: int | None = None,
) -> Any:
    ctx = BatchContext(
        batch_id=1,
        started_ms=0,
        topics={},
        tables=tables,
        behind=behind,
        last_truncate={},
        truncate_log={},
        emptied_by=lambda name, relid: None,
        dead_letter=lambda row: None,
        records=records,
    )
    return batches.collect_records(batch, ctx)


def test_a_batch_is_collected_when_arrow_decodes_every_table(tmp_path: Path) -> None:
    batch = Batch()
    assert collect(writer(tmp_path), batch, TABLES, 10) is RECORDS
    # a table Arrow does not decode, or the Spark writer: Spark decodes, nothing collected
    for tables, engine in (
        ({"t": table("text"), "u": table("bytea")}, "delta-rs"),
        (TABLES, "spark"),
    ):
        assert collect(writer(tmp_path, engine), batch, tables, 10) is None
    assert batch.collected == 1


def test_a_batch_too_large_for_the_drivers_heap_is_not_collected(tmp_path: Path) -> None:
    """2 GiB of heap: up to 500,000 records of 1,000 bytes (1.5 GB once copied three
    times) are not collected; as many of 600 bytes are, and the next batch is judged by
    what they were."""
    state = writer(tmp_path, each=1000.0)
    batch = Batch()
    assert collect(state, batch, TABLES, 10**7) is None
    assert collect(state, batch, TABLES, 1000) is RECORDS
    assert state.record_bytes == 3.0
    # no batch collected before: the first records' sizes are the sample
    fresh, wide = writer(tmp_path, each=None), Batch(sampled=1000)
    assert collect(fresh, wide, TABLES, 10**7) is None
    assert (wide.samples, wide.collected) == (1, 0)
    narrow = Batch(sampled=600)
    assert collect(fresh, narrow, TABLES, 10**7) is RECORDS


def test_a_batch_of_known_size_is_judged_by_it_not_by_the_most_a_batch_holds(
    tmp_path: Path,
) -> None:
    """A snapshot's group holds more records than a micro-batch's most (500,000): 1 M
    records of 600 bytes do not fit the heap, though 500,000 would."""
    state = writer(tmp_path, each=600.0)
    assert collect(state, Batch(), TABLES, 10**7) is RECORDS
    state.record_bytes = 600.0
    assert collect(state, Batch(), TABLES, 0, records=1_000_000) is None
    assert collect(state, Batch(), TABLES, 0, records=400_000) is RECORDS


def test_a_batch_over_the_drivers_limit_leaves_the_next_ones_to_spark(tmp_path: Path) -> None:
    state = writer(tmp_path)
    too_large = Batch(
        "Total size of serialized results of 3 tasks (1025.0 MiB) is bigger "
        "than spark.driver.maxResultSize (1024.0 MiB)"
    )
    assert collect(state, too_large, TABLES, 10) is None
    assert state.collect_refused
    after = Batch()
    assert collect(state, after, TABLES, 10) is None
    assert after.collected == 0
    with pytest.raises(RuntimeError, match="broker"):  # any other failure is the batch's
        collect(writer(tmp_path), Batch("broker gone"), TABLES, 10)


def test_each_batch_has_one_named_route_and_why() -> None:
    """`route` names the route of a batch, and why, from what is known before it is read."""
    wide = [table("text"), table("bytea")]
    given = {
        "native": True,
        "tables": [table("text")],
        "collect_refused": False,
        "most_records": 1000,
        "record_bytes": 100.0,
        "heap_bytes": 2 * 1024**3,
    }
    assert route(**given)[0] is Route.ARROW  # type: ignore[arg-type]
    for change, taken in (
        ({"native": False}, Route.SPARK),
        ({"tables": wide}, Route.SPARK_DECODED),
        ({"collect_refused": True}, Route.SPARK_DECODED),
        ({"most_records": 10**7}, Route.SPARK_DECODED),
        ({"tables": []}, Route.SPARK_DECODED),
    ):
        chosen, why = route(**{**given, **change})  # type: ignore[arg-type]
        assert (chosen, bool(why)) == (taken, True), change


def test_a_remote_warehouse_is_never_collected() -> None:
    """delta-rs writes a local warehouse only: a batch for one on object storage takes the
    `spark` route and is not collected to the driver first (it was, then refused, then
    made a Spark frame again from the driver's copy: issue 68)."""
    store = WarehouseStore(None, "s3a://lake/cdc", max_records=500_000, heap="2g")
    batches = store.batches
    batches.record_bytes = 3.0
    batch = Batch()
    assert collect(batches, batch, TABLES, 10) is None
    assert batch.collected == 0
    local = WarehouseStore(None, "file:///srv/lake", max_records=500_000, heap="2g").batches
    local.record_bytes = 3.0
    assert collect(local, Batch(), TABLES, 10) is RECORDS
