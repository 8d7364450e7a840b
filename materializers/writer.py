"""The Python stores' side of a micro-batch, run by Spark's Python workers.

The Kafka source gives each micro-batch one Spark partition per topic partition (no
`minPartitions` is ever set), and a key lives in one topic partition, so every event
of a key is in one Spark partition. Each partition, sorted by (topic, key, offset),
is written by its own worker with its own connection to the store, as Arrow batches:
the stores are written on every core, and no row passes through the driver. What
comes back is small: per topic partition the last offset seen, the counts, and the
events to send to the dead-letter topic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from cdc.catalog import Table
from cdc.decode import UNAVAILABLE
from materializers.stores.base import Event, Store

__all__ = ["RESULT_DDL", "last_events", "partition_writer"]

# what each partition's worker returns: kind 'applied' (one row per topic partition:
# its last offset, the newest commit time and the counts) or 'dead' (an event the
# store refused or that is not a change event, with the error)
RESULT_DDL = (
    "kind string, topic string, partition int, offset long, key string, value string, "
    "error string, commit_ms long, n long, written long, stale long"
)
_DEAD = ("topic", "partition", "offset", "key", "value", "error")


def _result_schema() -> Any:
    import pyarrow as pa

    strings = ("kind", "topic", "key", "value", "error")
    return pa.schema(
        [
            (
                name,
                pa.string()
                if name in strings
                else pa.int32()
                if name == "partition"
                else pa.int64(),
            )
            for name, _ in (field.split() for field in RESULT_DDL.split(", "))
        ]
    )


def last_events(rows: Iterable[dict[str, Any]]) -> Iterator[Event]:
    """Each key's last event of the batch, from rows sorted by (topic, key, offset).

    An unchanged TOASTed value arrives as a placeholder; when an earlier event of the
    same key in this batch carried the value, the last event gets it, since only the
    last event is written.
    """
    current: Event | None = None
    for row in rows:
        after = orjson.loads(row["after"]) if row["after"] and row["op"] != "d" else None
        same_key = current is not None and (current.table, current.key) == (
            row["table"],
            row["key"],
        )
        if same_key and after is not None and current.after is not None:  # type: ignore[union-attr]
            for name, value in after.items():
                earlier = current.after.get(name, UNAVAILABLE)  # type: ignore[union-attr]
                if value == UNAVAILABLE and earlier != UNAVAILABLE:
                    after[name] = earlier
        elif not same_key and current is not None:
            yield current
        current = Event(
            table=row["table"],
            key=row["key"],
            partition=row["partition"],
            offset=row["offset"],
            op=row["op"],
            after=after,
            commit_ms=row["commit_ms"],
            lsn=row["lsn"],
        )
    if current is not None:
        yield current


def partition_writer(
    open_store: Callable[[], Store],
    tables: dict[str, Table],
    topic_of: Callable[[str], str],
    chunk: int = 5000,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function mapInArrow runs on each partition. Rows with `skip` set are counted
    as applied but not written (cdc.truncations rows, events cut off by a TRUNCATE)."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        applied: dict[tuple[str, int], int] = {}
        dead: list[dict[str, Any]] = []
        seen = {"n": 0, "commit_ms": None}

        def rows() -> Iterator[dict[str, Any]]:
            for batch in batches:
                for row in batch.to_pylist():
                    where = (row["topic"], row["partition"])
                    applied[where] = max(row["offset"], applied.get(where, -1))
                    if row["error"] is not None:
                        dead.append({"kind": "dead"} | {k: row[k] for k in _DEAD})
                    elif not row["skip"]:
                        seen["n"] += 1
                        if row["commit_ms"] is not None:
                            seen["commit_ms"] = max(row["commit_ms"], seen["commit_ms"] or 0)
                        yield row

        store = open_store()
        written = stale = 0
        pending: list[Event] = []

        def flush() -> None:
            nonlocal written, stale, pending
            result = store.write(tables, pending)
            written, stale, pending = written + result.written, stale + result.stale, []
            for event, error in result.rejected or []:
                dead.append(
                    {
                        "kind": "dead",
                        "topic": topic_of(event.table),
                        "partition": event.partition,
                        "offset": event.offset,
                        "key": event.key,
                        "value": json.dumps(event.after, default=str),
                        "error": error,
                    }
                )

        try:
            for event in last_events(rows()):
                pending.append(event)
                if len(pending) >= chunk:
                    flush()
            if pending:
                flush()
        finally:
            store.close()
        out = [
            {"kind": "applied", "topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in applied.items()
        ]
        if out:  # the partition's totals ride on its first row
            out[0] |= {"n": seen["n"], "commit_ms": seen["commit_ms"]}
            out[0] |= {"written": written, "stale": stale}
        yield pa.RecordBatch.from_pylist(out + dead, schema=_result_schema())

    return run
