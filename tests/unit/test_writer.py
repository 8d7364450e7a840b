"""The Python stores' partition writer: each key's last event, TOAST carried within the
batch, skipped rows counted as applied, refusals and poison rows sent back as dead."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from cdc.catalog import Column, Table
from cdc.decode import UNAVAILABLE
from materializers.stores.base import Event, Store, WriteResult
from materializers.writer import last_events, partition_writer

TABLE = Table(
    "public",
    "t",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("body", "text", "text", "S", False, None, False),
    ),
    ("id",),
    "d",
    1,
    1,
)


def row(key: int, offset: int, op: str = "u", body: Any = "x", **extra: Any) -> dict[str, Any]:
    after = None if op == "d" else json.dumps({"id": key, "body": body})
    return {
        "table": "public.t",
        "topic": "p.public.t",
        "partition": 0,
        "offset": offset,
        "key": json.dumps({"id": key}),
        "op": op,
        "after": after,
        "commit_ms": 1000 + offset,
        "lsn": 10 + offset,
        "value": None,
        "error": None,
        "skip": False,
    } | extra


class Recorder(Store):
    """Takes what the writer hands to a store; refuses keys listed in `refuse`."""

    name = "recorder"

    def __init__(self, refuse: Iterable[str] = ()) -> None:
        self.written: list[Event] = []
        self.refuse = set(refuse)
        self.closed = False

    def prepare(self, tables: Iterable[Table]) -> None:
        pass

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult(rejected=[])
        for event in events:
            if event.key in self.refuse:
                result.rejected.append((event, "refused"))  # type: ignore[union-attr]
            else:
                self.written.append(event)
                result.written += 1
        return result

    def truncate(self, table: Table, before_lsn: int, commit_ms: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_last_events_keeps_each_keys_last_event_and_carries_toasted_values() -> None:
    rows = [
        row(1, 0, body="full text"),
        row(1, 3, body=UNAVAILABLE),
        row(2, 1, body="a"),
        row(2, 4, op="d"),
        row(3, 2, body=UNAVAILABLE),
    ]
    events = {e.key: e for e in last_events(rows)}
    assert set(events) == {'{"id": 1}', '{"id": 2}', '{"id": 3}'}
    assert events['{"id": 1}'].offset == 3
    assert events['{"id": 1}'].after == {"id": 1, "body": "full text"}
    assert events['{"id": 2}'].op == "d" and events['{"id": 2}'].after is None
    # nothing earlier in the batch: the placeholder stays, the store keeps its value
    assert events['{"id": 3}'].after == {"id": 3, "body": UNAVAILABLE}


def test_partition_writer_reports_offsets_counts_and_dead_letters() -> None:
    store = Recorder(refuse=['{"id": 4}'])
    rows = [
        row(1, 0),
        row(1, 1),
        row(2, 2, skip=True),  # before a TRUNCATE: counted as applied, never written
        row(4, 3),
        row(9, 5, op=None, after=None, error="not a change event", value="garbage"),
        row(5, 4, partition=1),
    ]
    batches = [pa.RecordBatch.from_pylist(rows[:3]), pa.RecordBatch.from_pylist(rows[3:])]
    run = partition_writer(lambda: store, {"public.t": TABLE}, lambda t: f"p.{t}")
    result = pa.Table.from_batches(list(run(iter(batches)))).to_pylist()

    applied = {(r["topic"], r["partition"]): r["offset"] for r in result if r["kind"] == "applied"}
    assert applied == {("p.public.t", 0): 5, ("p.public.t", 1): 4}
    totals = next(r for r in result if r["kind"] == "applied" and r["n"] is not None)
    assert (totals["n"], totals["written"], totals["stale"]) == (4, 2, 0)
    assert totals["commit_ms"] == 1004
    assert [(e.key, e.offset) for e in store.written] == [('{"id": 1}', 1), ('{"id": 5}', 4)]
    dead = sorted((r["offset"], r["error"]) for r in result if r["kind"] == "dead")
    assert dead == [(3, "refused"), (5, "not a change event")]
    assert store.closed
