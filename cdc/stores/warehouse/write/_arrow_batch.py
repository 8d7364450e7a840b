"""A table's batch of the warehouse in Arrow, shaped on the driver: what the Spark path
(store.py, _marks.py, history.py) computes with a Spark job each, computed here over the
batch's decoded events once they are collected.

The events come from one Spark job for the whole batch (store.py, `_decode_batch`), each
table's as an Arrow table of `_cdc_<meta>` columns (_marks.py's and store.py's names),
`_cdc_commit_ts`, the key decoded from the event's key (`_cdc_k_<column>`) and the
table's columns decoded from the row image. No event of such a batch carries a TOAST
placeholder (a batch that may is shaped by Spark). From them:

- `summarize`: per Kafka partition, what marks.Marks judges a batch by (marks.summarize);
- `versions`: the history's rows, one per change (key, position), in position order
  (history.version_rows);
- `newest`: each key's newest change, the current state's MERGE source, and `inserted`:
  the rows a table that holds none of the batch's keys takes in a plain append
  (store.py, `_write_current`);
- `kept`: what the steps after the batch (the join views) read of it (`_write_table`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.core.catalog import Table
from cdc.stores.warehouse.history import HISTORY_META
from cdc.stores.warehouse.steps import Keep, Kept

__all__ = [
    "canonical",
    "changes",
    "inserted",
    "kept",
    "keys",
    "merge_source",
    "newest",
    "summarize",
    "versions",
]

# the current state's own columns, from the events' (store.py, _current_values)
_CURRENT_META = ("_cdc_commit_lsn", "_cdc_lsn", "_cdc_offset", "_cdc_partition", "_cdc_commit_ts")


def summarize(events: pa.Table) -> list[dict[str, Any]]:
    """Per Kafka partition: the first and last offset of its changes, the lowest position
    of a change other than a read and of a read, the newest position, how many events are
    neither inserts nor reads (other ops, and tombstones), how many came before a
    TRUNCATE (`cut`): marks.summarize's figures."""
    commit, op = events.column("_cdc_commit_lsn"), events.column("_cdc_op")
    counts = pa.table(
        {
            "partition": events.column("_cdc_partition"),
            "others": pc.cast(
                pc.or_kleene(pc.is_null(commit), pc.invert(pc.is_in(op, pa.array(["c", "r"])))),
                pa.int64(),
            ),
            "cut": pc.cast(pc.is_valid(events.column("_cdc_cut_ms")), pa.int64()),
        }
    )
    parts: dict[int, dict[str, Any]] = {}
    for row in (
        counts.group_by("partition").aggregate([("others", "sum"), ("cut", "sum")]).to_pylist()
    ):
        parts[row["partition"]] = {
            "partition": row["partition"],
            "first_offset": None,
            "last_offset": None,
            "first_changed": None,
            "first_read": None,
            "newest": None,
            "others": row["others_sum"],
            "cut": row["cut_sum"],
        }
    found = events.filter(pc.is_valid(commit))
    offsets = found.group_by("_cdc_partition").aggregate(
        [("_cdc_offset", "min"), ("_cdc_offset", "max")]
    )
    for row in offsets.to_pylist():
        part = parts[row["_cdc_partition"]]
        part["first_offset"], part["last_offset"] = row["_cdc_offset_min"], row["_cdc_offset_max"]
    positions = pa.table(
        {
            "partition": found.column("_cdc_partition"),
            "read": pc.equal(found.column("_cdc_op"), "r"),
            "commit": found.column("_cdc_commit_lsn"),
            "lsn": pc.fill_null(found.column("_cdc_lsn"), 0),
        }
    )
    for which, order, rows in (
        ("first_changed", "ascending", positions.filter(pc.invert(positions.column("read")))),
        ("first_read", "ascending", positions.filter(positions.column("read"))),
        ("newest", "descending", positions),
    ):
        keys = [("partition", "ascending"), ("commit", order), ("lsn", order)]
        rows = rows.take(pc.sort_indices(rows, sort_keys=keys))
        for row in rows.filter(_firsts_of_runs(rows, ("partition",))).to_pylist():
            parts[row["partition"]][which] = (row["commit"], row["lsn"])
    return list(parts.values())


def changes(events: pa.Table) -> pa.Table:
    """The batch's changes (not its tombstones), each (key, position) once (a change
    delivered twice is one version: its first delivery), in position order."""
    found = events.filter(pc.is_valid(events.column("_cdc_commit_lsn")))
    found = found.append_column("_cdc_at", pa.array(np.arange(found.num_rows, dtype=np.int64)))
    found = found.take(
        pc.sort_indices(
            found,
            sort_keys=[
                (c, "ascending") for c in ("_cdc_commit_lsn", "_cdc_lsn", "_cdc_key", "_cdc_at")
            ],
        )
    )
    return found.filter(
        _firsts_of_runs(found, ("_cdc_commit_lsn", "_cdc_lsn", "_cdc_key"))
    ).drop_columns(["_cdc_at"])


def _firsts_of_runs(rows: pa.Table, columns: tuple[str, ...]) -> Any:
    """Where a row of `rows` (sorted on `columns`) differs from the one before it in
    one of `columns`: the first of each run of equal rows."""
    if rows.num_rows == 0:
        return pa.array([], pa.bool_())
    differs = None
    for name in columns:
        column = rows.column(name)
        other = pc.not_equal(column.slice(1), column.slice(0, rows.num_rows - 1))
        differs = other if differs is None else pc.or_(differs, other)
    assert differs is not None
    return pa.concat_arrays([pa.array([True]), *differs.chunks])


def _ascending(values: Any) -> Any:
    """The values (row indices), in ascending order."""
    return values.take(pc.sort_indices(values))


def _nulls_where_deleted(column: pa.ChunkedArray, deleted: pa.ChunkedArray) -> Any:
    return pc.if_else(deleted, pa.nulls(len(column), column.type), column)


def versions(table: Table, found: pa.Table) -> pa.Table:
    """The history's rows of the batch's changes (`found`: from `changes`): the key from
    the event's key, the other columns as the change left them (a delete: none), then
    the history's own columns."""
    deleted = pc.equal(found.column("_cdc_op"), "d")
    arrays, names = [], []
    for column in table.columns:
        c = column.name
        if c in table.key:
            arrays.append(found.column(f"_cdc_k_{c}"))
        else:
            arrays.append(_nulls_where_deleted(found.column(c), deleted))
        names.append(c)
    for meta in HISTORY_META:  # the history's own columns, from the events' of their name
        arrays.append(found.column(meta))
        names.append(meta)
    return pa.Table.from_arrays(arrays, names=names)


def newest(found: pa.Table, tombstones: pa.Table) -> pa.Table:
    """Each key's newest event: of the changes that came after their table's last
    TRUNCATE (what one before it wrote is history only) and the tombstones; a change
    outranks a tombstone, then the newer position, then the later offset."""
    live = found.filter(pc.is_null(found.column("_cdc_cut_ms")))
    both = pa.concat_tables([live, tombstones.select(live.column_names)])
    if both.num_rows == 0:
        return both
    commit = both.column("_cdc_commit_lsn")
    ranks = pa.table(
        {
            "key": both.column("_cdc_key"),
            "change": pc.is_valid(commit),
            "commit": pc.fill_null(commit, 0),
            "lsn": pc.fill_null(both.column("_cdc_lsn"), -1),
            "offset": both.column("_cdc_offset"),
        }
    )
    order = pc.sort_indices(ranks, sort_keys=[(name, "ascending") for name in ranks.column_names])
    keys = ranks.column("key").take(order)
    # the last of each key's run in that order
    last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1))
    last = (
        pa.concat_arrays([*last.chunks, pa.array([True])]) if last.num_chunks else pa.array([True])
    )
    return both.take(_ascending(order.filter(last)))


def merge_source(table: Table, latest: pa.Table) -> pa.Table:
    """The current state's MERGE source (`latest`: from `newest`), in the columns the
    MERGE's clauses name (store.py, _current_clauses)."""
    names = [f"_cdc_k_{k}" for k in table.key]
    names += [c.name for c in table.columns if c.name not in table.key]
    names += [f"_cdc_{m}" for m in ("commit_lsn", "lsn", "offset", "partition", "op", "commit_ts")]
    return latest.select(names)


def inserted(table: Table, latest: pa.Table) -> pa.Table:
    """The rows of the live keys of `latest` (from `newest`), in the current state's
    columns: what an append into a table that holds none of the batch's keys writes."""
    live = latest.filter(
        pc.and_(
            pc.is_valid(latest.column("_cdc_commit_lsn")),
            pc.not_equal(latest.column("_cdc_op"), "d"),
        )
    )
    arrays, names = [], []
    for column in table.columns:
        c = column.name
        arrays.append(live.column(f"_cdc_k_{c}" if c in table.key else c))
        names.append(c)
    for meta in _CURRENT_META:
        arrays.append(live.column(meta))
        names.append(meta)
    return pa.Table.from_arrays(arrays, names=names)


def keys(table: Table, events: pa.Table) -> set[tuple[Any, ...]]:
    """The batch's keys, as tuples of their Python values in the table's key order (a
    NaN as one value: Spark's equality)."""
    columns = [events.column(f"_cdc_k_{k}").to_pylist() for k in table.key]
    return {canonical(key) for key in zip(*columns, strict=True)}


def canonical(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Values as one Python value per Spark value: every NaN equal to every other."""
    return tuple(_NAN if isinstance(v, float) and v != v else v for v in values)


_NAN = object()


def _firsts(rows: Any) -> list[int]:
    """The index of each row's first occurrence (rows: tuples of values), in order."""
    seen: set[tuple[Any, ...]] = set()
    keep = []
    for at, row in enumerate(rows):
        row = canonical(row)
        if row not in seen:
            seen.add(row)
            keep.append(at)
    return keep


def kept(table: Table, events: pa.Table, wanted: set[Keep]) -> Kept:
    """What the steps after the batch read of it (`wanted`), in Arrow: as store.py's
    `_write_table` keeps it in Spark (steps.py Kept)."""
    keys = created = versions = None
    if "keys" in wanted:
        columns = [events.column(f"_cdc_k_{k}") for k in table.key]
        every = pa.Table.from_arrays(columns, names=list(table.key))
        keys = every.take(
            pa.array(_firsts(zip(*[c.to_pylist() for c in columns], strict=True)), pa.int64())
        )
    found = events.filter(pc.is_valid(events.column("_cdc_commit_lsn")))
    if "created" in wanted:
        inserts = found.filter(pc.equal(found.column("_cdc_op"), "c"))
        positions = zip(
            *[inserts.column(k).to_pylist() for k in table.key],
            inserts.column("_cdc_commit_lsn").to_pylist(),
            inserts.column("_cdc_lsn").to_pylist(),
            strict=True,
        )
        keep = _firsts(positions)
        names = [c.name for c in table.columns] + ["_cdc_commit_lsn", "_cdc_lsn", "_cdc_commit_ms"]
        created = inserts.take(pa.array(keep, pa.int64())).select(names)
    if "versions" in wanted and len(table.key) == 1:
        versions = pa.Table.from_arrays(
            [
                found.column(f"_cdc_k_{table.key[0]}"),
                found.column("_cdc_commit_lsn"),
                found.column("_cdc_lsn"),
            ],
            names=["_cdc_ref", "_cdc_commit_lsn", "_cdc_lsn"],
        )
    return Kept(keys, created, versions)
