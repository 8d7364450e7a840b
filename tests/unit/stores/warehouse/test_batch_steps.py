"""The warehouse's steps after a batch (its join views) run as soon as the tables they
read are written, beside the other tables' writes, and never on a failed write."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from cdc.stores.warehouse.steps import Keep, Kept
from cdc.stores.warehouse.store import WarehouseStore

WAIT_S = 30.0  # far above any run: a step that waited for every write would time out


class _Context:
    def setLocalProperty(self, key: str, value: str) -> None:
        pass


class _Spark:
    sparkContext = _Context()


class _Step:
    """A view that reads `reads`, noting what it was given and which writes had ended."""

    def __init__(self, reads: list[str], store: _Store, then: threading.Event | None = None):
        self.reads, self.store, self.then = reads, store, then
        self.seen: tuple[set[str], set[str], set[str]] | None = None

    def keeps(self) -> dict[str, set[Keep]]:
        return {t: {"keys"} for t in self.reads}

    def refresh(self, spark: Any, root: str, tables: Any, kept: Any, truncated: Any, native: Any):
        self.seen = (set(kept), set(self.store.written), set(truncated))
        if self.then is not None:
            self.then.set()


class _Store(WarehouseStore):
    """The store's scheduling, its table writes replaced: `slow` waits for `go`."""

    def __init__(self, slow: str, go: threading.Event, failing: str | None = None) -> None:
        super().__init__(_Spark(), "/nowhere", writer="spark")
        self.slow, self.go, self.failing = slow, go, failing
        self.written: list[str] = []

    def _write_table(self, table: Any, events: Any, keep: Any, toasted: Any, native: Any) -> Any:
        if table == self.slow and not self.go.wait(WAIT_S):
            raise TimeoutError(f"{table}: nothing let its write end")
        if table == self.failing:
            raise RuntimeError(f"{table}: its write failed")
        self.written.append(table)
        return 0.0, 0.0, Kept(keys=f"{table} keys")


TABLES = {"a": "a", "b": "b", "c": "c"}


def test_a_step_runs_once_its_own_tables_are_written_while_another_is_still_written() -> None:
    go = threading.Event()
    store = _Store(slow="c", go=go)
    early = _Step(["a", "b"], store, then=go)  # lets c's write end: it must not wait for c
    late = _Step(["b", "c"], store)
    store.after_batch = [early, late]
    store._truncated = {"b"}
    store.write_frame(TABLES, None, set(TABLES))  # type: ignore[arg-type]
    assert early.seen is not None and late.seen is not None
    kept, written, truncated = early.seen
    assert kept == {"a", "b"} and {"a", "b"} <= written and "c" not in written
    assert truncated == {"b"}
    kept, written, _ = late.seen
    assert kept == {"b", "c"} and {"b", "c"} <= written
    assert store._truncated == set()  # the batch ended: its TRUNCATEs are refreshed


def test_a_failed_write_fails_the_batch_and_the_steps_that_read_its_table() -> None:
    go = threading.Event()
    go.set()
    store = _Store(slow="", go=go, failing="c")
    apart = _Step(["a"], store)
    reading = _Step(["b", "c"], store)
    store.after_batch = [apart, reading]
    store._truncated = {"b"}
    with pytest.raises(RuntimeError, match="its write failed"):
        store.write_frame(TABLES, None, set(TABLES))  # type: ignore[arg-type]
    assert reading.seen is None  # never ran over a table its write left behind
    assert store._truncated == {"b"}  # the batch run again refreshes them
