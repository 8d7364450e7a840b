"""Change events of a micro-batch decoded in Arrow on the driver, for the warehouse: what
envelope.py parses and spark_types.py converts in Spark, computed from the batch's Kafka
records collected once (one Spark job reads them), with no JSON parse in the JVM.

pyarrow's JSON reader is strict where Spark's `from_json` is permissive: a value that is
not of the type the column's Debezium JSON has fails the read instead of becoming NULL.
So a batch takes this path only when its every event decodes here exactly as Spark
decodes it; otherwise `decode_records` answers None and the batch is decoded by Spark
(cdc/stores/warehouse/write/routes.py), as before:

- a record that is not a Debezium change event (a dead letter), or not read whole;
- a table with a column whose type is not one `decodable` (arrow_types.py) lists
  (arrays, bytea, time, bit strings, float4, hstore: Spark's);
- a value the warehouse cannot hold (spark_types.py: a dead letter), or one equal to the
  table's TOAST placeholder (the Spark path fills it);
- a row of cdc.truncations (the batch applies a TRUNCATE).

The result has, per table, the columns and Arrow types of the warehouse's `_decode_batch`
(store.py) and, for the whole batch, what `partitions` (cdc/stores/warehouse/write/routes.py)
reports of it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from cdc.core.catalog import TRUNCATIONS_TABLE, Column, Table
from cdc.log.envelope import SOURCE_ARROW, arrow_positions
from cdc.log.freshness import RATIO
from cdc.types.arrow_types import TIMESTAMP_TZ, convert, decodable, json_type
from cdc.types.decode import placeholder_forms

__all__ = ["ArrowBatch", "decode_records", "decodes"]


@dataclass(frozen=True)
class ArrowBatch:
    """A batch decoded in Arrow: per table its events (`tables`), and per (table, topic,
    partition) and per age bucket what routes.py's `partitions` reports."""

    tables: dict[str, pa.Table]
    parts: list[dict[str, Any]]
    ages: dict[int, int]


def _typed(table: Table, parsed: pa.StructArray, columns: tuple[Column, ...]) -> list[Any] | None:
    """The columns of a parsed image (`parsed`: a struct of their JSON values, a NULL
    image's NULL), converted; None when one does not convert, or holds the table's TOAST
    placeholder."""
    out = []
    for column, raw in zip(columns, parsed.flatten(), strict=True):
        if _may_be_placeholder(raw, table.placeholder):
            return None  # the Spark path fills a placeholder
        if column.is_array:
            out.append(raw)
            continue
        converted = convert(column, raw)
        if converted is None:
            return None
        if pc.sum(pc.is_valid(converted)).as_py() != pc.sum(pc.is_valid(raw)).as_py():
            return None
        out.append(converted)
    return out


def _may_be_placeholder(raw: pa.Array, text: str) -> bool:
    """Whether a value may be the TOAST placeholder `text` in one of the forms spark_types.py's
    is_placeholder knows: the text itself, or an array of one element (the text, its
    base64 or uuid form) or of its codes (as integers)."""
    if pa.types.is_string(raw.type):
        return bool(pc.any(pc.equal(raw, text)).as_py())
    if pa.types.is_list(raw.type):
        forms = placeholder_forms(text)
        lengths = pc.list_value_length(raw)
        if pa.types.is_string(raw.type.value_type):
            one = pc.list_element(raw.filter(pc.equal(lengths, 1)), 0)
            return bool(pc.any(pc.is_in(one, pa.array([text, forms.b64, forms.uuid]))).as_py())
        # an array of the placeholder's codes: as long as they are, then compared
        suspects = raw.filter(pc.equal(lengths, len(forms.codes)))
        return any(value == forms.codes for value in suspects.to_pylist())
    return False


def _read_lines(values: pa.Array, schema: pa.Schema) -> pa.Table | None:
    """Each value (a JSON object per record, none null) read with `schema`, or None when
    one is not what it says."""
    if len(values) == 0:
        return pa.Table.from_batches([], schema)
    lines = pc.binary_join_element_wise(values, pa.scalar(b"\n"), b"")
    data = lines.buffers()[2]
    offsets = lines.buffers()[1]
    end = int(np.frombuffer(offsets, dtype=np.int32, count=len(lines) + lines.offset + 1)[-1])
    start = int(np.frombuffer(offsets, dtype=np.int32, count=lines.offset + 1)[-1])
    try:
        read = pj.read_json(
            pa.BufferReader(data.slice(start, end - start)),
            read_options=pj.ReadOptions(block_size=1 << 24),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return read if read.num_rows == len(values) else None


@dataclass(frozen=True)
class _Plan:
    envelope: pa.Schema
    key_columns: tuple[Column, ...]
    keys: pa.Schema


def decodes(table: Table) -> bool:
    """Whether every column of the table decodes here (arrow_types.decodable)."""
    return _plan(table.columns, table.key) is not None


@functools.lru_cache(maxsize=1024)  # every batch of a table is read alike
def _plan(columns: tuple[Column, ...], key: tuple[str, ...]) -> _Plan | None:
    """How a table of `columns` keyed by `key` is read: its events' and its keys' schemas
    (their Debezium JSON as Arrow types), and its key columns; None when one of its
    columns does not decode here (arrow_types.decodable)."""
    if not decodable(columns):
        return None
    by_name = {c.name: c for c in columns}
    key_columns = tuple(by_name[k] for k in key)
    return _Plan(
        envelope=pa.schema(
            [
                ("op", pa.string()),
                ("after", pa.struct([pa.field(c.name, json_type(c)) for c in columns])),
                ("source", SOURCE_ARROW),
            ]
        ),
        key_columns=key_columns,
        keys=pa.schema([(c.name, json_type(c)) for c in key_columns]),
    )


def _cut_ms(commit_lsn: pa.Array, lsn: pa.Array, cuts: list[list[int]] | None) -> pa.Array:
    """The commit time of the first TRUNCATE (of `cuts`, the progress record's) an event
    came before, NULL for none (and for a tombstone)."""
    result = pa.nulls(len(commit_lsn), pa.int64())
    for commit, at, ms in reversed(cuts or []):  # the first listed wins
        before = pc.or_(
            pc.less(commit_lsn, commit),
            pc.and_(pc.equal(commit_lsn, commit), pc.less_equal(lsn, at)),
        )
        result = pc.if_else(pc.fill_null(before, False), pa.scalar(ms, pa.int64()), result)
    return result


def _decode_table(table: Table, records: pa.Table, cuts: list[list[int]] | None) -> pa.Table | None:
    """A table's records as `_decode_batch` decodes them (module doc), or None."""
    value = records.column("value").combine_chunks()
    key = records.column("key").combine_chunks()
    if pc.any(pc.is_null(key)).as_py():
        return None
    present = pc.is_valid(value)
    tombstones = value.null_count > 0
    plan = _plan(table.columns, table.key)
    if plan is None:
        return None
    read = _read_lines(value.filter(present) if tombstones else value, plan.envelope)
    key_columns = plan.key_columns
    keys = _read_lines(key, plan.keys)
    if read is None or keys is None:
        return None
    # the events with a value at their places, a tombstone's fields NULL
    places = pc.subtract(pc.cumulative_sum(pc.cast(present, pa.int64())), 1)
    at = pc.if_else(present, places, pa.scalar(None, pa.int64()))
    if len(read):
        positions = arrow_positions(
            read.column("op").combine_chunks(), read.column("source").combine_chunks()
        )
        if positions is None:
            return None
        commit_lsn, lsn = (pc.take(p, at) if tombstones else p for p in positions)
    else:
        commit_lsn = lsn = pa.nulls(len(value), pa.int64())
    events = read.take(at) if tombstones else read
    op = pc.fill_null(events.column("op").combine_chunks(), "d")
    commit_ms = events.column("source").combine_chunks().flatten()[0]
    after = _typed(table, events.column("after").combine_chunks(), table.columns)
    key_image = pa.StructArray.from_arrays(
        [c.combine_chunks() for c in keys.columns], names=keys.column_names
    )
    image = _typed(table, key_image, key_columns)
    if after is None or image is None:
        return None
    columns = {
        "_cdc_key": pc.cast(key, pa.string()),
        "_cdc_op": op,
        "_cdc_offset": records.column("offset").combine_chunks(),
        "_cdc_partition": records.column("partition").combine_chunks(),
        "_cdc_commit_lsn": commit_lsn,
        "_cdc_lsn": lsn,
        "_cdc_commit_ms": commit_ms,
        "_cdc_cut_ms": _cut_ms(commit_lsn, lsn, cuts),
        "_cdc_commit_ts": pc.cast(pc.multiply(commit_ms, 1000), pa.int64()).cast(TIMESTAMP_TZ),
    }
    for column, values in zip(key_columns, image, strict=True):
        columns[f"_cdc_k_{column.name}"] = values
    arrays = list(columns.values()) + after
    names = list(columns) + [c.name for c in table.columns]
    return pa.Table.from_arrays(arrays, names=names)


def decode_records(
    records: pa.Table,
    topics: dict[str, str],
    tables: dict[str, Table],
    cuts: dict[str, list[list[int]]],
    started_ms: int,
) -> ArrowBatch | None:
    """The batch's Kafka records (key, value, topic, partition, offset) decoded per table
    (`topics`: change topic -> table; `cuts`: per table, its TRUNCATEs known so far;
    `started_ms`: when the batch started, for the events' ages), or None when Spark must
    decode the batch (module doc)."""
    names = pc.cast(records.column("topic"), pa.string())
    decoded: dict[str, pa.Table] = {}
    parts: list[dict[str, Any]] = []
    ages: dict[int, int] = {}
    found = pc.unique(names).to_pylist()
    for topic in found:
        name = topics.get(topic)
        if name is None:
            continue  # not a captured table's: envelope.py drops it too
        if name == TRUNCATIONS_TABLE or name not in tables:
            return None
        mine = records if len(found) == 1 else records.filter(pc.equal(names, topic))
        try:
            table = _decode_table(tables[name], mine, cuts.get(name))
        except pa.ArrowException:  # e.g. values past a binary array's 2 GiB
            return None
        if table is None:
            return None
        decoded[name] = pa.concat_tables([decoded[name], table]) if name in decoded else table
        parts += _summary(name, topic, table, mine)
        _count_ages(table, started_ms, ages)
    return ArrowBatch(decoded, parts, ages)


def _summary(name: str, topic: str, table: pa.Table, records: pa.Table) -> list[dict[str, Any]]:
    """Per partition of the table's records, what `partitions` (routes.py) reports."""
    sizes = pc.binary_length(pc.fill_null(records.column("value"), b""))
    grouped = (
        pa.table(
            {
                "partition": table.column("_cdc_partition"),
                "offset": table.column("_cdc_offset"),
                "commit_ms": table.column("_cdc_commit_ms"),
                # the newest source position taken, as `partitions`: an event's own
                # position too, not only its sequence[0] (the commit before it)
                "commit_lsn": pc.max_element_wise(
                    table.column("_cdc_commit_lsn"), table.column("_cdc_lsn")
                ),
                "size": pc.cast(sizes, pa.int64()),
            }
        )
        .group_by("partition")
        .aggregate(
            [
                ("offset", "max"),
                ("offset", "count"),
                ("commit_ms", "max"),
                ("commit_lsn", "max"),
                ("size", "sum"),
            ]
        )
    )
    return [
        {
            "table": name,
            "topic": topic,
            "partition": row["partition"],
            "offset": row["offset_max"],
            "n": row["offset_count"],
            "commit_ms": row["commit_ms_max"],
            "commit_lsn": row["commit_lsn_max"],
            "errors": 0,
            "size": row["size_sum"] or 0,
            "toasted": 0,
        }
        for row in grouped.to_pylist()
    ]


def _count_ages(table: pa.Table, started_ms: int, ages: dict[int, int]) -> None:
    """The changes' (not the reads') age buckets, as `partitions` counts them."""
    changed = pc.and_(
        pc.is_valid(table.column("_cdc_commit_ms")),
        pc.not_equal(table.column("_cdc_op"), "r"),
    )
    commit = table.column("_cdc_commit_ms").filter(changed).to_numpy()
    if not len(commit):
        return
    age = np.maximum(started_ms - commit, 1).astype(np.float64)
    buckets = np.maximum(np.ceil(np.log(age) / math.log(RATIO)) - 1, 0).astype(np.int64)
    found, counts = np.unique(buckets, return_counts=True)
    for bucket, count in zip(found.tolist(), counts.tolist(), strict=True):
        ages[bucket] = ages.get(bucket, 0) + count
