"""The Python stores' partition writer: each key's last event, TOAST carried within a
chunk, skipped rows counted as applied, TRUNCATEs reported, refusals and poison rows
sent back as dead."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from cdc.apply.row_batches import partition_writer
from cdc.core.catalog import Column, Table
from cdc.log.freshness import age_bucket, ages
from cdc.log.position import Event
from cdc.stores.base import RowStore, WriteResult
from cdc.types.decode import UNAVAILABLE

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


def envelope(key: int, offset: int, op: str = "u", body: Any = "x") -> str:
    after = None if op == "d" else {"id": key, "body": body}
    source = {"ts_ms": 1000 + offset, "lsn": 10 + offset, "table": "t"}
    return json.dumps({"before": None, "after": after, "op": op, "source": source})


def row(key: int, offset: int, op: str = "u", body: Any = "x", **extra: Any) -> dict[str, Any]:
    """A Kafka record as the workers get it: the value is Debezium's JSON text."""
    return {
        "table": "public.t",
        "topic": "p.public.t",
        "partition": 0,
        "offset": offset,
        "key": json.dumps({"id": key}),
        "value": envelope(key, offset, op, body),
    } | extra


class Recorder(RowStore):
    """Takes what the writer hands to a store; refuses keys listed in `refuse`."""

    name = "recorder"

    def __init__(self, refuse: Iterable[str] = ()) -> None:
        self.written: list[Event] = []
        self.refuse = set(refuse)
        self.closed = False

    def prepare(self, tables: Iterable[Table]) -> None:
        pass

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult()
        for event in events:
            if event.key in self.refuse:
                result.rejected.append((event, "refused"))  # type: ignore[union-attr]
            else:
                self.written.append(event)
                result.written += 1
        return result

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def write(rows: list[dict[str, Any]], store: RowStore, **options: Any) -> list[dict[str, Any]]:
    batches = [pa.RecordBatch.from_pylist(rows[i : i + 3]) for i in range(0, len(rows), 3)]
    run = partition_writer(
        lambda: store,
        {"public.t": TABLE},
        lambda t: f"p.{t}",
        "cdc.truncations",
        options.pop("cutoffs", {}),
        **options,
    )
    return pa.Table.from_batches(list(run(iter(batches)))).to_pylist()


def test_each_keys_last_event_is_written_with_toasted_values_carried() -> None:
    store = Recorder()
    write(
        [
            row(1, 0, body="full text"),
            row(2, 1, body="a"),
            row(3, 2, body=UNAVAILABLE),
            row(1, 3, body=UNAVAILABLE),
            row(2, 4, op="d"),
            row(2, 5, value=None),  # the delete's tombstone
        ],
        store,
    )
    events = {e.key: e for e in store.written}
    assert len(store.written) == 3
    assert events['{"id": 1}'].offset == 3
    assert events['{"id": 1}'].after == {"id": 1, "body": "full text"}
    # the delete carries the position; its tombstone adds nothing
    assert (events['{"id": 2}'].op, events['{"id": 2}'].offset) == ("d", 4)
    assert events['{"id": 2}'].after is None
    # nothing earlier in the batch: the placeholder stays, the store keeps its value
    assert events['{"id": 3}'].after == {"id": 3, "body": UNAVAILABLE}


def test_a_full_chunk_is_written_before_the_keys_later_events() -> None:
    store = Recorder()
    write([row(1, 0, body="full"), row(2, 1), row(1, 2, body=UNAVAILABLE)], store, chunk=2)
    # key 1's first event went out with the first chunk; its later one keeps the
    # placeholder, which the store resolves to what it holds (the value just written)
    assert [(e.key, e.offset) for e in store.written] == [
        ('{"id": 1}', 0),
        ('{"id": 2}', 1),
        ('{"id": 1}', 2),
    ]
    assert store.written[-1].after == {"id": 1, "body": UNAVAILABLE}


def test_partition_writer_reports_offsets_counts_truncates_and_dead_letters() -> None:
    store = Recorder(refuse=['{"id": 4}'])
    truncate = json.dumps(
        {"op": "c", "after": {"id": 1, "table_name": "public.t"}, "source": {"lsn": 99}}
    )
    result = write(
        [
            row(1, 0),
            row(1, 1),
            row(2, 2, value=envelope(2, -8)),  # before the last TRUNCATE: never written
            row(4, 3),
            row(9, 5, value="garbage"),
            row(9, 6, value='{"no": "envelope"}'),
            row(5, 4, partition=1),
            row(1, 0, table="cdc.truncations", topic="p.cdc.truncations", value=truncate),
        ],
        store,
        cutoffs={"public.t": (5, 5)},
    )
    applied = {(r["topic"], r["partition"]): r["offset"] for r in result if r["kind"] == "applied"}
    assert applied == {("p.public.t", 0): 6, ("p.public.t", 1): 4, ("p.cdc.truncations", 0): 0}
    totals = next(r for r in result if r["kind"] == "applied" and r["n"] is not None)
    assert (totals["n"], totals["written"], totals["stale"]) == (4, 2, 0)
    assert totals["commit_ms"] == 1004
    assert [(e.key, e.offset) for e in store.written] == [('{"id": 1}', 1), ('{"id": 5}', 4)]
    dead = sorted((r["offset"], r["error"]) for r in result if r["kind"] == "dead")
    assert dead == [(3, "refused"), (5, "not a change event"), (6, "not a change event")]
    truncates = [(r["table"], r["commit_lsn"], r["lsn"]) for r in result if r["kind"] == "truncate"]
    assert truncates == [("public.t", 99, 99)]
    assert store.closed


def test_a_change_delivered_again_after_a_newer_one_is_not_written() -> None:
    """Debezium re-delivers changes at new offsets after a crash: the chunk keeps each
    key's newest change by source position, not its last record."""
    store = Recorder()
    first = row(1, 0, body="old")
    newer = row(1, 1, body="new")
    again = dict(first, offset=2)  # the same change (same position) at a later offset
    out = write([first, newer, again], store)
    assert [(e.offset, e.after["body"]) for e in store.written] == [(1, "new")]  # type: ignore[index]
    applied = next(r for r in out if r["kind"] == "applied")
    assert applied["offset"] == 2 and applied["stale"] == 1


def test_a_value_without_a_position_is_a_dead_letter() -> None:
    no_lsn = json.dumps({"op": "u", "after": {"id": 1, "body": "x"}, "source": {"ts_ms": 1}})
    out = write([row(1, 0, value=no_lsn)], Recorder())
    assert [r["error"] for r in out if r["kind"] == "dead"] == ["not a change event"]


def test_changes_are_counted_by_age_and_the_driver_keeps_its_store_open() -> None:
    """Each change (not a snapshot read, not a tombstone) is counted in the fine bucket of
    its age at the batch's start, for the store's freshness; run by the driver
    (`close` False), the writer leaves the store it was given open."""
    store = Recorder()
    snapshot_read = row(3, 2, op="r")
    out = write(
        [row(1, 0), row(2, 1), snapshot_read, row(2, 3, value=None)],
        store,
        started_ms=2000,
        close=False,
    )
    counted: dict[int, int] = {}
    for r in out:
        if r["kind"] == "age":
            counted[r["bucket"]] = counted.get(r["bucket"], 0) + r["n"]
    # the two updates were committed at 1000 and 1001 (envelope): 1000 and 999 ms old
    assert counted == ages([1000, 1001], 2000)
    assert sum(counted.values()) == 2 and age_bucket(1000) in counted
    assert not store.closed
