"""The warehouse's batch shaped in Arrow (arrow_batch.py): what it keeps, in which order,
and what it leaves out, worked out by hand for small batches."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc.core.catalog import Column, Table
from cdc.stores.warehouse.history import HISTORY_META
from cdc.stores.warehouse.write import _arrow_batch as arrow_batch
from cdc.stores.warehouse.write._marks import Marks

TABLE = Table(
    "public",
    "t",
    (
        Column("id", "int8", "int8", "N", False, None, False),
        Column("name", "text", "text", "S", True, None, False),
    ),
    ("id",),
    "d",
    0,
    0,
)

TS = datetime(2026, 1, 1, tzinfo=UTC)


def events(*rows: tuple[Any, ...]) -> pa.Table:
    """Decoded events: (id, op, partition, offset, commit_lsn, lsn, name, cut_ms); a
    tombstone has no position."""
    names = ["id", "op", "partition", "offset", "commit_lsn", "lsn", "name", "cut_ms"]
    cols = {n: [r[i] for r in rows] for i, n in enumerate(names)}
    return pa.table(
        {
            "_cdc_key": pa.array([f'{{"id":{i}}}' for i in cols["id"]]),
            "_cdc_op": pa.array(cols["op"], pa.string()),
            "_cdc_offset": pa.array(cols["offset"], pa.int64()),
            "_cdc_partition": pa.array(cols["partition"], pa.int32()),
            "_cdc_commit_lsn": pa.array(cols["commit_lsn"], pa.int64()),
            "_cdc_lsn": pa.array(cols["lsn"], pa.int64()),
            "_cdc_commit_ms": pa.array([None if c is None else 1 for c in cols["commit_lsn"]]),
            "_cdc_cut_ms": pa.array(cols["cut_ms"], pa.int64()),
            "_cdc_commit_ts": pa.array(
                [None if c is None else TS for c in cols["commit_lsn"]], pa.timestamp("us", "UTC")
            ),
            "_cdc_k_id": pa.array(cols["id"], pa.int64()),
            "id": pa.array(
                [None if o == "d" else i for i, o in zip(cols["id"], cols["op"], strict=True)]
            ),
            "name": pa.array(cols["name"], pa.string()),
        }
    )


def test_a_change_delivered_twice_is_one_version_in_position_order() -> None:
    batch = events(
        (1, "u", 0, 11, 200, 5, "b", None),
        (1, "c", 0, 10, 100, 5, "a", None),
        (1, "u", 0, 12, 200, 5, "b", None),  # Debezium's redelivery: a new offset
    )
    found = arrow_batch.changes(batch)
    assert found.column("_cdc_offset").to_pylist() == [10, 11]
    history = arrow_batch.versions(TABLE, found)
    assert history.column_names == ["id", "name", *HISTORY_META]
    assert history.column("name").to_pylist() == ["a", "b"]


def test_a_delete_is_a_version_without_values_keyed_from_the_event_key() -> None:
    history = arrow_batch.versions(
        TABLE, arrow_batch.changes(events((7, "d", 0, 3, 50, 1, "x", None)))
    )
    assert history.column("id").to_pylist() == [7]
    assert history.column("name").to_pylist() == [None]


def test_the_newest_change_of_each_key_outranks_older_ones_and_tombstones() -> None:
    batch = events(
        (1, "c", 0, 1, 100, 1, "a", None),
        (1, "u", 0, 2, 100, 2, "b", None),  # same commit, later lsn
        (2, "d", 1, 5, 90, 1, None, None),
        (2, None, 1, 6, None, None, None, None),  # the delete's tombstone
        (3, None, 2, 9, None, None, None, None),  # a tombstone alone
    )
    found = arrow_batch.changes(batch)
    tombstones = batch.filter(pc.is_null(batch.column("_cdc_commit_lsn")))
    latest = arrow_batch.newest(found, tombstones)
    by_key = dict(
        zip(
            latest.column("_cdc_k_id").to_pylist(),
            latest.column("_cdc_op").to_pylist(),
            strict=True,
        )
    )
    assert by_key == {1: "u", 2: "d", 3: None}
    rows = arrow_batch.inserted(TABLE, latest)
    assert rows.column("id").to_pylist() == [1]
    assert rows.column("name").to_pylist() == ["b"]
    source = arrow_batch.merge_source(TABLE, latest)
    assert source.column_names[:2] == ["_cdc_k_id", "name"]


def test_a_change_from_before_a_truncate_is_history_only() -> None:
    batch = events((1, "c", 0, 1, 100, 1, "a", 1234), (2, "c", 0, 2, 300, 1, "b", None))
    found = arrow_batch.changes(batch)
    assert arrow_batch.versions(TABLE, found).num_rows == 2
    latest = arrow_batch.newest(found, batch.slice(0, 0))
    assert latest.column("_cdc_k_id").to_pylist() == [2]


def test_the_summary_tells_marks_what_the_spark_path_would() -> None:
    batch = events(
        (1, "r", 0, 4, 100, 0, "a", None),
        (2, "c", 0, 5, 120, 3, "b", None),
        (3, "u", 0, 6, 110, 2, "c", 99),
        (4, None, 1, 7, None, None, None, None),
    )
    parts = {p["partition"]: p for p in arrow_batch.summarize(batch)}
    assert parts[0] == {
        "partition": 0,
        "first_offset": 4,
        "last_offset": 6,
        "first_changed": (110, 2),
        "first_read": (100, 0),
        "newest": (120, 3),
        "others": 1,
        "cut": 1,
    }
    assert parts[1]["others"] == 1 and parts[1]["last_offset"] is None
    marks = Marks({0: ((110, 2), 3)})
    assert not marks.new(list(parts.values()))  # a change at the held position
    marks = Marks({0: ((100, 0), 3)})
    assert marks.new(list(parts.values()))
    marks.add(list(parts.values()))
    assert marks.partitions == {0: ((120, 3), 6)}


def test_what_the_views_keep_each_key_and_creation_once() -> None:
    batch = events(
        (1, "c", 0, 1, 100, 1, "a", None),
        (1, "c", 0, 2, 100, 1, "a", None),
        (1, "u", 0, 3, 110, 1, "b", None),
    )
    kept = arrow_batch.kept(TABLE, batch, {"keys", "created", "versions"})
    assert kept.keys.to_pylist() == [{"id": 1}]
    assert kept.created.column("_cdc_commit_lsn").to_pylist() == [100]
    assert kept.versions.column_names == ["_cdc_ref", "_cdc_commit_lsn", "_cdc_lsn"]


def test_a_column_named_like_a_helper_column_is_a_column() -> None:
    """The batch's own helper column (its order) is named `_cdc_*`, which no column can
    be: a table's column `__at` (or any other name) keeps its values."""
    table = Table(
        "public",
        "t",
        (*TABLE.columns, Column("__at", "int8", "int8", "N", True, None, False)),
        ("id",),
        "d",
        0,
        0,
    )
    batch = events((1, "c", 0, 10, 100, 5, "a", None), (2, "c", 0, 11, 100, 6, "b", None))
    batch = batch.append_column("__at", pa.array([70, 80], pa.int64()))
    history = arrow_batch.versions(table, arrow_batch.changes(batch))
    assert history.column("__at").to_pylist() == [70, 80]


def test_every_nan_is_one_key() -> None:
    nan = float("nan")
    assert arrow_batch.canonical((nan, 1)) == arrow_batch.canonical((float("nan"), 1))


def reference_summary(rows: list[tuple[Any, ...]]) -> dict[int, dict[str, Any]]:
    """marks.summarize's figures, row by row (the oracle of the vectorized one)."""
    parts: dict[int, dict[str, Any]] = {}
    for _, op, partition, offset, commit, lsn, _, cut in rows:
        part = parts.setdefault(
            partition,
            {"partition": partition, "first_offset": None, "last_offset": None}
            | {"first_changed": None, "first_read": None, "newest": None, "others": 0, "cut": 0},
        )
        part["cut"] += cut is not None
        part["others"] += commit is None or op not in ("c", "r")
        if commit is None:
            continue
        position = (commit, lsn)
        offsets = [o for o in (part["first_offset"], offset) if o is not None]
        part["first_offset"] = min(offsets)
        part["last_offset"] = max(offset, part["last_offset"] or offset)
        which = "first_read" if op == "r" else "first_changed"
        part[which] = min(position, part[which] or position)
        part["newest"] = max(position, part["newest"] or position)
    return parts


def test_random_batches_match_a_row_by_row_reading() -> None:
    import random

    chance = random.Random(47)
    for _ in range(200):
        rows = []
        for offset in range(chance.randint(1, 40)):
            key = chance.randint(1, 6)
            if chance.random() < 0.15:  # a tombstone
                rows.append((key, "d", chance.randint(0, 2), offset, None, None, None, None))
                continue
            commit = chance.randint(1, 8) * 100
            op = chance.choice("crud")
            cut = chance.choice([None, None, 5])
            rows.append(
                (key, op, chance.randint(0, 2), offset, commit, chance.randint(0, 3), "v", cut)
            )
        batch = events(*rows)
        assert {p["partition"]: p for p in arrow_batch.summarize(batch)} == reference_summary(rows)
        found = arrow_batch.changes(batch)
        unique = {(r[0], r[4], r[5]) for r in rows if r[4] is not None}
        assert found.num_rows == len(unique)
        firsts = {}
        for r in rows:
            if r[4] is not None:
                firsts.setdefault((r[0], r[4], r[5]), r[3])
        assert sorted(found.column("_cdc_offset").to_pylist()) == sorted(firsts.values())
        tombstones = batch.filter(pc.is_null(batch.column("_cdc_commit_lsn")))
        latest = arrow_batch.newest(found, tombstones)
        expected: dict[int, tuple[Any, ...]] = {}
        for r in rows:
            if r[7] is not None:  # before a TRUNCATE: history only
                continue
            if r[4] is not None and firsts[(r[0], r[4], r[5])] != r[3]:
                continue  # a second delivery
            rank = (r[4] is not None, r[4] or 0, r[5] if r[5] is not None else -1, r[3])
            if r[0] not in expected or rank > expected[r[0]]:
                expected[r[0]] = rank
        got = dict(
            zip(
                latest.column("_cdc_k_id").to_pylist(),
                latest.column("_cdc_offset").to_pylist(),
                strict=True,
            )
        )
        assert got == {k: rank[3] for k, rank in expected.items()}


def test_marks_read_from_arrow_batches_are_the_newest_per_partition() -> None:
    """Marks.read_arrow over a history read a few rows at a time: per partition, the
    newest position (commit, then LSN) and the highest offset, a TRUNCATE's row aside,
    whichever batch holds them."""
    import random

    rng = random.Random(7)
    rows = [
        {
            "_cdc_partition": rng.randrange(3),
            "_cdc_commit_lsn": rng.randrange(5) * 100,
            "_cdc_lsn": rng.randrange(50),
            "_cdc_offset": rng.randrange(1000),
            "_cdc_op": rng.choice(["c", "u", "d", "r", "T"]),
        }
        for _ in range(400)
    ]
    history = pa.Table.from_pylist(rows)
    marks = Marks.read_arrow(history.to_batches(max_chunksize=37))
    expected: dict[int, tuple[tuple[int, int], int]] = {}
    for row in rows:
        if row["_cdc_op"] == "T":
            continue
        position = (row["_cdc_commit_lsn"], row["_cdc_lsn"])
        held = expected.get(row["_cdc_partition"], ((-1, -1), -1))
        expected[row["_cdc_partition"]] = (
            max(position, held[0]),
            max(row["_cdc_offset"], held[1]),
        )
    assert marks.partitions == expected
