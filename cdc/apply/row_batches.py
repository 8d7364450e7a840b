"""The Python stores' side of a micro-batch, run by Spark's Python workers.

The Kafka source gives each micro-batch one Spark partition per topic partition (no
`minPartitions` is ever set), in offset order, and a key lives in one topic
partition, so every event of a key reaches one worker, oldest first. Each worker
parses the raw Kafka values itself (orjson: Spark neither parses nor sorts them),
keeps each key's last event per chunk of keys and writes the chunk through its own
connection to the store, as Arrow batches arrive: the stores are written on every
core, and no row passes through the driver. What comes back is small: per topic
partition the last offset seen, the counts, the TRUNCATEs seen (rows of
cdc.truncations), and the events to send to the dead-letter topic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson

from cdc.core.catalog import Table
from cdc.log.envelope import NOT_A_CHANGE_EVENT, parse_value
from cdc.log.freshness import age_bucket
from cdc.log.position import Event, supersedes
from cdc.stores.base import RowStore
from cdc.types.decode import UNAVAILABLE, mark_unavailable

__all__ = ["RESULT_DDL", "partition_writer", "result_schema"]

# what each worker takes: the Kafka record with its table's name (key and value as text)
_INPUT_COLUMNS = ("table", "topic", "partition", "offset", "key", "value")

# what each partition's worker returns: kind 'applied' (one row per topic partition:
# its last offset, the newest commit time and the counts), 'dead' (an event the store
# refused or that is not a change event, with the error) or 'truncate' (a TRUNCATE of
# `table` at `lsn`, committed at commit_ms) or 'age' (n events whose age at the batch's
# start falls in fine bucket `bucket`: cdc/log/freshness.py)
RESULT_DDL = (
    "kind string, topic string, partition int, offset long, key string, value string, "
    "error string, commit_ms long, n long, written long, stale long, table string, lsn long, "
    "commit_lsn long, bucket long, relid long"
)


def result_schema() -> Any:
    import pyarrow as pa

    strings = ("kind", "topic", "key", "value", "error", "table")
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


def _key_error(table: Table | None, key: bytes | str | None) -> str | None:
    """Why a record's key cannot key a row of `table` (None: it can): Debezium's key is
    a JSON object (of the key columns, UTF-8 text), and the stores keep and read rows
    back by it. (A key of other columns, from before the key changed, is still one.)"""
    if table is None:
        return None
    try:
        parsed = orjson.loads(key) if key is not None else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return f"{NOT_A_CHANGE_EVENT}: its key is not a JSON object"
    return None


def _relid(value: Any) -> int | None:
    """A truncation's relation OID as its event carries it (a number, or text), if any."""
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _text(value: bytes | str | None) -> str | None:
    """A record's key or value as text (bytes that are not UTF-8 shown replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _column(batch: Any, name: str) -> list[Any]:
    """A column of the worker's Arrow batch as Python values; the key and value as bytes:
    Spark casts a Kafka record's bytes to a string unchecked, and bytes that are not UTF-8
    would fail the whole partition as text."""
    import pyarrow as pa

    column = batch.column(name)
    if pa.types.is_string(column.type) and name in ("key", "value"):
        column = column.view(pa.binary())
    return list(column.to_pylist())


def _supersedes(event: Event, seen: Event | None) -> bool:
    """Whether `event` replaces `seen` as its key's newest in a chunk (the write rule's
    `supersedes`)."""
    return seen is None or supersedes(event.position, event.offset, seen.position, seen.offset)


def _latest(earlier: Event | None, event: Event) -> Event:
    """`event`, the key's newer event, with the unchanged TOASTed values it lacks taken
    from `earlier` (the key's previous event in the same chunk), which is never written:
    only a key's last event is."""
    if earlier is None or earlier.after is None or event.after is None:
        return event
    after = event.after
    for name, value in after.items():
        if value == UNAVAILABLE:
            known = earlier.after.get(name, UNAVAILABLE)
            if known != UNAVAILABLE:
                after[name] = known
    return event


def partition_writer(
    open_store: Callable[[], RowStore],
    tables: dict[str, Table],
    topic_of: Callable[[str], str],
    truncations_table: str,
    cutoffs: dict[str, tuple[int, int]],
    chunk: int = 5000,
    close: bool = True,
    started_ms: int = 0,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function mapInArrow runs on each partition, or the driver on a whole small
    batch collected in partition order (`close` False: the store it opens is the
    driver's own, kept open from batch to batch). `started_ms`: when the batch started,
    which its events' ages are counted from (cdc/log/freshness.py).

    Rows of `truncations_table` are reported, not written. An event of a table from
    before its last TRUNCATE (`cutoffs`: table -> the TRUNCATE's position) is counted as
    applied but not written. Writing a chunk as soon as it holds `chunk` keys is safe:
    each write is guarded by its position, so whatever order the chunks reach the store
    in, the key's newest change wins.
    """

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        applied: dict[tuple[str, int], int] = {}
        out: list[dict[str, Any]] = []  # dead letters and TRUNCATEs
        seen: dict[str, Any] = {
            "n": 0,
            "commit_ms": None,
            "commit_lsn": None,
            "written": 0,
            "stale": 0,
        }
        pending: dict[tuple[str, str], Event] = {}
        ages: dict[int, int] = {}
        store = open_store()

        def flush() -> None:
            if not pending:
                return
            result = store.write(tables, list(pending.values()))
            pending.clear()
            seen["written"] += result.written
            seen["stale"] += result.stale
            for event, error in result.rejected:
                out.append(
                    {
                        "kind": "dead",
                        "topic": topic_of(event.table),
                        "partition": event.partition,
                        "offset": event.offset,
                        "key": event.key,
                        "value": orjson.dumps(event.after, default=str).decode(),
                        "error": error,
                    }
                )

        try:
            for batch in batches:
                columns = [_column(batch, name) for name in _INPUT_COLUMNS]
                for table, topic, partition, offset, raw_key, value in zip(*columns, strict=True):
                    where = (topic, partition)
                    if offset > applied.get(where, -1):
                        applied[where] = offset
                    key: Any = _text(raw_key)  # text: checked below for a captured table
                    try:
                        op, after, commit_ms, position = parse_value(value)
                        error = _key_error(tables.get(table), raw_key)
                        if error is not None:
                            raise ValueError(error)
                        name = (after or {}).get("table_name")
                        if table == truncations_table and not isinstance(name, str | None):
                            raise ValueError(f"{NOT_A_CHANGE_EVENT}: table_name is not text")
                    except ValueError as exc:
                        out.append(
                            {
                                "kind": "dead",
                                "topic": topic,
                                "partition": partition,
                                "offset": offset,
                                "key": key,
                                "value": _text(value),
                                "error": str(exc),
                            }
                        )
                        continue
                    if table == truncations_table:
                        if op in ("c", "r") and name:
                            out.append(
                                {
                                    "kind": "truncate",
                                    "table": name,
                                    "relid": _relid((after or {}).get("relid")),
                                    "commit_lsn": position[0],
                                    "lsn": position[1],
                                    "commit_ms": commit_ms,
                                }
                            )
                        continue
                    cut = cutoffs.get(table)
                    # tombstones (no position) follow their delete event, which the cut-off
                    # judges
                    if cut is not None and position is not None and position <= cut:
                        continue
                    if table in tables:  # every type's placeholder, as the stores know it
                        after = mark_unavailable(tables[table], op, after)
                    seen["n"] += 1
                    if commit_ms is not None and commit_ms > (seen["commit_ms"] or 0):
                        seen["commit_ms"] = commit_ms
                    if commit_ms is not None and op != "r":  # a change, not a snapshot read
                        age = age_bucket(started_ms - commit_ms)
                        ages[age] = ages.get(age, 0) + 1
                    commit_lsn, lsn = position if position is not None else (None, None)
                    # the newest source position taken (its own, not only its
                    # sequence[0]: the commit before its transaction)
                    taken = max(commit_lsn or 0, lsn or 0)
                    if taken > (seen["commit_lsn"] or 0):
                        seen["commit_lsn"] = taken
                    event = Event(
                        table, key, partition, offset, op, after, commit_ms, lsn, commit_lsn
                    )
                    slot = (table, key)
                    earlier = pending.get(slot)
                    if not _supersedes(event, earlier):
                        seen["stale"] += 1  # a duplicate, or older than what the chunk holds
                        continue
                    pending[slot] = _latest(earlier, event)
                    if len(pending) >= chunk:
                        flush()
            flush()
        finally:
            if close:
                store.close()
        rows = [
            {"kind": "applied", "topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in applied.items()
        ]
        if rows:  # the partition's totals ride on its first row
            rows[0] |= {k: seen[k] for k in ("n", "commit_ms", "commit_lsn", "written", "stale")}
        rows += [{"kind": "age", "bucket": b, "n": n} for b, n in ages.items()]
        yield pa.RecordBatch.from_pylist(rows + out, schema=result_schema())

    return run
