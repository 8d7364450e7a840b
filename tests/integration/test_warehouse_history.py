"""The warehouse's history, written batch by batch through real Delta tables: changes of a
table that reach the warehouse after its TRUNCATE (another topic read further ahead) are
versions that end at the TRUNCATE, never dropped and never current; the history is read
back with a Delta reader of the test's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from cdc.catalog import Column, Table
from materializers.stores.warehouse.store import WarehouseStore
from materializers.stores.warehouse.tables import current_path, history_path
from tests.conftest import RunningStack
from tests.helpers import EVENTS

pytestmark = pytest.mark.integration

PLACEHOLDER = "__debezium_unavailable_value"  # Debezium's, for an unchanged TOASTed text

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


def event(
    key: int, offset: int, op: str, body: str | None, at: tuple[int, int], ms: int, **kw: Any
) -> dict:  # type: ignore[type-arg]
    return {
        "table": "public.t",
        "topic": "p.public.t",
        "partition": 0,
        "offset": offset,
        "key": json.dumps({"id": key}),
        "op": op,
        "after": None if op == "d" else json.dumps({"id": key, "body": body}),
        "commit_ms": ms,
        "commit_lsn": at[0],
        "lsn": at[1],
        "error": None,
        "value": "{}",
        "cut_ms": kw.get("cut_ms"),
    }


def _versions(spark: Any, root: str) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F

    history = spark.read.format("delta").load(history_path(root, "public.t"))
    return [
        (r["id"], r["_cdc_op"], r["body"], r["from"], r["to"])
        for r in history.select(
            "id",
            "_cdc_op",
            "body",
            F.unix_millis("valid_from").alias("from"),
            F.unix_millis("valid_to").alias("to"),
        )
        .orderBy("id", "_cdc_commit_lsn", "_cdc_lsn")
        .collect()
    ]


def test_changes_read_after_their_tables_truncate_are_history(
    stack: RunningStack, tmp_path: Path
) -> None:
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(1, 0, "r", "v0", (100, 0), 1000), event(2, 1, "r", "v0", (100, 0), 1000)])
    # the TRUNCATE at (300, 310), committed at 3000, is read first
    store.truncate(TABLE, (300, 310), 3000)
    # then an update of key 1 committed before it (at 2000), and an insert after it
    write(
        [
            event(1, 2, "u", "v1", (200, 210), 2000, cut_ms=3000),
            event(1, 3, "c", "new", (300, 320), 3000),
        ]
    )

    current = spark.read.format("delta").load(current_path(root, "public.t"))
    live = {r["id"]: r["body"] for r in current.where("NOT _cdc_deleted").collect()}
    assert live == {1: "new"}  # the late update never became current
    assert _versions(spark, root) == [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, 3000),  # kept, ending at the TRUNCATE
        (1, "c", "new", 3000, None),
        (2, "r", "v0", 1000, 3000),
    ]


def test_a_batch_of_redelivered_and_new_changes_leaves_one_open_version(
    stack: RunningStack, tmp_path: Path
) -> None:
    """After a Connect crash Debezium sends changes again; a batch holding the newest
    stored change again and a new one after it must end the stored one (the chaos run
    found keys with two open versions)."""
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(1, 0, "r", "v0", (100, 0), 1000), event(1, 1, "u", "v1", (200, 210), 2000)])
    # Connect restarted: v1 again (a new offset), then v2; and v3 of key 2 before its
    # older change v2 is delivered again
    write(
        [
            event(1, 2, "u", "v1", (200, 210), 2000),
            event(1, 3, "u", "v2", (300, 310), 3000),
            event(2, 4, "c", "v3", (400, 410), 4000),
        ]
    )
    # a change older than a stored one reaches the warehouse late
    write([event(2, 5, "c", "v2", (350, 360), 3500)])

    assert _versions(spark, root) == [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, 3000),
        (1, "u", "v2", 3000, None),
        (2, "c", "v2", 3500, 4000),
        (2, "c", "v3", 4000, None),
    ]
    # the same batches again (a replay after a crash) change nothing
    write([event(1, 2, "u", "v1", (200, 210), 2000), event(2, 5, "c", "v2", (350, 360), 3500)])
    assert len(_versions(spark, root)) == 5


def test_a_backfill_read_stamped_after_the_next_change_ends_where_it_begins(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A backfill's read sits at the commit Debezium had last seen (commit LSN, 0), yet
    carries the time Debezium read it: under load, after the commit time of a change
    placed after it. No version may end before it begins (a backfill under pgbench left
    three such versions), whether the change comes in the read's batch or a later one."""
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(1, 0, "r", "v0", (100, 0), 1000), event(2, 1, "r", "v0", (100, 0), 1000)])
    # key 1: the read (stamped 9000) and the change after it (committed 5000), one batch
    # key 2: the read, then the change after it (committed 6000) in the next batch
    write(
        [
            event(1, 2, "r", "b1", (200, 0), 9000),
            event(1, 3, "u", "v1", (200, 210), 5000),
            event(2, 4, "r", "b2", (200, 0), 9000),
        ]
    )
    write([event(2, 5, "u", "v2", (300, 310), 6000)])
    assert _versions(spark, root) == [
        (1, "r", "v0", 1000, 5000),
        (1, "r", "b1", 5000, 5000),  # begins no later than the change after it
        (1, "u", "v1", 5000, None),
        (2, "r", "v0", 1000, 6000),
        (2, "r", "b2", 6000, 6000),  # a stored version's start moves back too
        (2, "u", "v2", 6000, None),
    ]
    assert [n for n in _newest_marked(spark, root)] == [(1, 1, True), (2, 1, True)]


def test_a_truncate_read_late_ends_the_version_before_it_and_keeps_its_values(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A TRUNCATE read after the re-insert that follows it (its topic read behind the
    table's) still ends the version before it; an update before a TRUNCATE, whose TOASTed
    value is unchanged, keeps that value in its version when the TRUNCATE is applied
    first (it read as NULL from the row the TRUNCATE marked deleted)."""
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(1, 0, "c", "a", (100, 1), 1000)])
    write([event(1, 1, "c", "b", (300, 1), 3000), event(2, 2, "c", "big", (250, 1), 2500)])
    store.truncate(TABLE, (200, 1), 2000)  # the TRUNCATE, read a batch later
    # key 2: its update (the TOASTed body unchanged) and a TRUNCATE after it, applied first
    store.truncate(TABLE, (500, 1), 5000)
    write([event(2, 3, "u", PLACEHOLDER, (400, 1), 4000, cut_ms=5000)])
    assert _versions(spark, root) == [
        (1, "c", "a", 1000, 2000),  # ends at the TRUNCATE, not at the re-insert
        (1, "c", "b", 3000, 5000),
        (2, "c", "big", 2500, 4000),
        (2, "u", "big", 4000, 5000),  # its unchanged value, not NULL
    ]


def _newest_marked(spark: Any, root: str) -> list[tuple[Any, ...]]:
    """Per key: how many versions are marked newest, and whether the last is."""
    history = spark.read.format("delta").load(history_path(root, "public.t"))
    history.createOrReplaceTempView("test_newest")
    return [
        tuple(r)
        for r in spark.sql(
            "SELECT id, count_if(_cdc_newest), "
            "max_by(_cdc_newest, struct(_cdc_commit_lsn, _cdc_lsn)) "
            "FROM test_newest GROUP BY id ORDER BY id"
        ).collect()
    ]


def _last_commit(path: str) -> list[dict]:  # type: ignore[type-arg]
    log = sorted(Path(path, "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_steady_batch_rewrites_only_each_keys_newest_version(
    stack: RunningStack, tmp_path: Path
) -> None:
    """The history is partitioned by each key's newest version: a batch of changes newer
    than what is stored rewrites files of that partition only, never older versions',
    so its cost does not grow with the history; one version per key is marked newest,
    also after a batch holding an older change (which reads every version)."""
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}
    path = history_path(root, "public.t")

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(k, k, "r", "v0", (100, 0), 1000) for k in (1, 2, 3)])
    for n in range(1, 4):  # older versions pile up
        write([event(k, 10 * n + k, "u", f"v{n}", (100 * n + 100, k), 1000 + n) for k in (1, 2)])
    write([event(1, 50, "u", "v4", (500, 1), 1005)])

    removed = [a["remove"] for a in _last_commit(path) if "remove" in a]
    added = [a["add"] for a in _last_commit(path) if "add" in a]
    assert removed, "the key's newest version was not rewritten"
    assert all(list(r["partitionValues"].values()) == ["true"] for r in removed), removed
    assert {v for a in added for v in a["partitionValues"].values()} == {"true", "false"}
    assert _newest_marked(spark, root) == [(1, 1, True), (2, 1, True), (3, 1, True)]

    write([event(2, 60, "u", "v1.5", (250, 2), 1001)])  # older than key 2's newest
    assert _newest_marked(spark, root) == [(1, 1, True), (2, 1, True), (3, 1, True)]
    assert [v for v in _versions(spark, root) if v[0] == 2] == [
        (2, "r", "v0", 1000, 1001),
        (2, "u", "v1", 1001, 1001),
        (2, "u", "v1.5", 1001, 1002),
        (2, "u", "v2", 1002, 1003),
        (2, "u", "v3", 1003, None),
    ]


def test_a_history_written_before_the_partition_is_rewritten_once(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A history from before the newest-version partition (no such column) is rewritten
    partitioned, each key's newest version marked, and goes on from there."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import ensure_delta

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    tables = {"public.t": TABLE}
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    store.write_frame(
        tables,
        spark.createDataFrame(
            [event(1, 0, "r", "v0", (100, 0), 1000), event(1, 1, "u", "v1", (200, 1), 2000)],
            EVENTS,
        ),
        {"public.t"},
    )
    path = history_path(root, "public.t")
    old = spark.read.format("delta").load(path).drop("_cdc_newest").collect()
    schema = spark.read.format("delta").load(path).drop("_cdc_newest").schema
    shutil.rmtree(path)  # the same versions in the old layout: no partition, no column
    ensure_delta(spark, path, list(schema.fields))
    spark.createDataFrame(old, schema).write.format("delta").mode("append").save(path)
    assert DeltaTable.forPath(spark, path).detail().first()["partitionColumns"] == []

    store = WarehouseStore(spark, root)  # `cdc apply` started again
    store.prepare([TABLE])
    assert DeltaTable.forPath(spark, path).detail().first()["partitionColumns"] == ["_cdc_newest"]
    assert _newest_marked(spark, root) == [(1, 1, True)]
    store.write_frame(
        tables,
        spark.createDataFrame([event(1, 2, "u", "v2", (300, 1), 3000)], EVENTS),
        {"public.t"},
    )
    assert _versions(spark, root) == [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, 3000),
        (1, "u", "v2", 3000, None),
    ]
    assert _newest_marked(spark, root) == [(1, 1, True)]


def _operations(path: str) -> list[str]:
    """Each Delta commit's operation, oldest first."""
    found = []
    for log in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                found.append(action["commitInfo"]["operation"])
    return found


def test_a_first_load_is_appended_and_equals_what_a_merge_writes(
    stack: RunningStack, tmp_path: Path
) -> None:
    """Into tables that hold no row (a first load, a reset) a batch is appended, not
    merged: its current state and history are what the MERGEs write (several changes of
    a key, a delete and its tombstone, an unchanged TOASTed value), and the same batch
    again (a replay after a crash, now merged) changes nothing."""
    from cdc.decode import DEBEZIUM_PLACEHOLDER
    from cdc.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}
    tombstone = {**event(2, 4, "d", None, (0, 0), 0), "commit_lsn": None, "lsn": None}
    tombstone.update(op=None, commit_ms=None)
    batch = [
        event(1, 0, "r", "v0", (100, 0), 1000),
        event(2, 1, "r", "v0", (100, 0), 1000),
        event(3, 2, "r", "v0", (100, 0), 1000),
        event(1, 3, "u", "v1", (200, 1), 2000),
        event(2, 4, "d", None, (200, 2), 2000),
        tombstone,
        event(3, 6, "u", DEBEZIUM_PLACEHOLDER, (300, 1), 3000),  # body unchanged, TOASTed
    ]
    expected = [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, None),
        (2, "r", "v0", 1000, 2000),
        (2, "d", None, 2000, None),
        (3, "r", "v0", 1000, 3000),
        (3, "u", "v0", 3000, None),
    ]

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    def current() -> list[tuple[Any, ...]]:
        frame = spark.read.format("delta").load(current_path(root, "public.t"))
        return sorted(
            (r["id"], r["body"], r["_cdc_deleted"], r["_cdc_commit_lsn"], r["_cdc_lsn"])
            for r in frame.collect()
        )

    write(batch)
    for path in (current_path(root, "public.t"), history_path(root, "public.t")):
        assert _operations(path)[-1] == "WRITE", _operations(path)
    state = [(1, "v1", False, 200, 1), (2, None, True, 200, 2), (3, "v0", False, 300, 1)]
    assert current() == state
    assert _versions(spark, root) == expected
    assert _newest_marked(spark, root) == [(1, 1, True), (2, 1, True), (3, 1, True)]

    write(batch)  # replayed: merged this time, and nothing changes
    assert _operations(current_path(root, "public.t"))[-1] == "MERGE"
    assert current() == state
    assert _versions(spark, root) == expected

    store.reset(TABLE)  # emptied (a rebuild): the next batch is appended again
    write(batch)
    assert _operations(history_path(root, "public.t"))[-1] == "WRITE"
    assert current() == state
    assert _versions(spark, root) == expected
    assert _newest_marked(spark, root) == [(1, 1, True), (2, 1, True), (3, 1, True)]
