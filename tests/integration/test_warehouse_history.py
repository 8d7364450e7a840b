"""The warehouse's tables, written batch by batch through real Delta tables: the history
is appended to (each change once, whatever is delivered again), its versions' ends
derived as it is read; the current state holds live rows only, one Delta commit a batch.
Changes of a table that reach the warehouse after its TRUNCATE (another topic read
further ahead) are versions that end at the TRUNCATE, never dropped and never current.
Both tables are read back with a Delta reader of the test's own, and the versions' ends
computed by the test (tests/stores.py, with_ends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc.core.catalog import Column, Table
from cdc.stores.warehouse.store import WarehouseStore
from cdc.stores.warehouse.tables import current_path, history_path
from tests.conftest import RunningStack
from tests.helpers import EVENTS
from tests.stores import engines, with_ends

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
    """(id, op, body, valid_from, valid_to) of each version, times in ms."""
    from pyspark.sql import functions as F

    history = spark.read.format("delta").load(history_path(root, "public.t"))
    rows = [
        r.asDict()
        for r in history.select(
            "id",
            "_cdc_op",
            "body",
            "_cdc_commit_lsn",
            "_cdc_lsn",
            F.unix_millis("_cdc_commit_ts").alias("_cdc_commit_ts"),
        ).collect()
    ]
    return [
        (v["id"], v["_cdc_op"], v["body"], v["valid_from"], v["valid_to"])
        for v in with_ends(rows, ["id"])
    ]


def _current(spark: Any, root: str) -> list[tuple[Any, ...]]:
    """(id, body, commit LSN, LSN) of each row of the current state."""
    frame = spark.read.format("delta").load(current_path(root, "public.t"))
    return sorted(
        (r["id"], r["body"], r["_cdc_commit_lsn"], r["_cdc_lsn"]) for r in frame.collect()
    )


def test_changes_read_after_their_tables_truncate_are_history(
    stack: RunningStack, tmp_path: Path
) -> None:
    from cdc.core.spark import spark_session

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
    live = {r["id"]: r["body"] for r in current.collect()}
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
    from cdc.core.spark import spark_session

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
    # a change older than the key's stored one, at a new offset: a key's log is in
    # commit order, so only a change sent again can be older; it is taken nowhere
    write([event(2, 5, "c", "v2", (350, 360), 3500)])

    versions = [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, 3000),
        (1, "u", "v2", 3000, None),
        (2, "c", "v3", 4000, None),
    ]
    assert _versions(spark, root) == versions
    assert _current(spark, root) == [(1, "v2", 300, 310), (2, "v3", 400, 410)]
    # the same batches again (a replay after a crash) change nothing
    write([event(1, 2, "u", "v1", (200, 210), 2000), event(2, 5, "c", "v2", (350, 360), 3500)])
    assert _versions(spark, root) == versions
    assert _current(spark, root) == [(1, "v2", 300, 310), (2, "v3", 400, 410)]


def test_a_backfill_read_stamped_after_the_next_change_ends_where_it_begins(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A backfill's read sits at the commit Debezium had last seen (commit LSN, 0), yet
    carries the time Debezium read it: under load, after the commit time of a change
    placed after it. No version may end before it begins (a backfill under pgbench left
    three such versions), whether the change comes in the read's batch or a later one."""
    from cdc.core.spark import spark_session

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


def test_a_truncate_read_late_ends_the_version_before_it_and_keeps_its_values(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A TRUNCATE read after the re-insert that follows it (its topic read behind the
    table's) still ends the version before it; an update before a TRUNCATE, whose TOASTed
    value is unchanged, keeps that value in its version when the TRUNCATE is applied
    first (it read as NULL from the row the TRUNCATE marked deleted)."""
    from cdc.core.spark import spark_session

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


def _last_commit(path: str) -> list[dict]:  # type: ignore[type-arg]
    log = sorted(Path(path, "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in log.read_text().splitlines()]


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
    from cdc.core.spark import spark_session
    from cdc.types.decode import DEBEZIUM_PLACEHOLDER

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

    write(batch)
    for path in (current_path(root, "public.t"), history_path(root, "public.t")):
        assert _operations(path)[-1] == "WRITE", _operations(path)
    state = [(1, "v1", 200, 1), (3, "v0", 300, 1)]  # the deleted key is gone
    assert _current(spark, root) == state
    assert _versions(spark, root) == expected

    commits = len(_operations(history_path(root, "public.t")))
    merged = len(_operations(current_path(root, "public.t")))
    write(batch)  # replayed: merged this time (delta-rs commits no MERGE that changes nothing)
    assert set(_operations(current_path(root, "public.t"))[merged:]) <= {"MERGE"}
    assert _current(spark, root) == state
    assert _versions(spark, root) == expected
    assert len(_operations(history_path(root, "public.t"))) <= commits + 1  # nothing added

    store.reset(TABLE)  # emptied (a rebuild): the next batch is appended again
    write(batch)
    assert _operations(history_path(root, "public.t"))[-1] == "WRITE"
    assert _current(spark, root) == state
    assert _versions(spark, root) == expected


def _adds_and_removes(path: str) -> tuple[int, int]:
    """How many files every commit of the Delta table at `path` added and removed."""
    added = removed = 0
    for log in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            added += "add" in action
            removed += "remove" in action
    return added, removed


@pytest.mark.parametrize("writer", ["delta-rs", "spark"])
def test_a_batch_is_one_append_to_the_history_and_one_commit_to_the_current_state(
    stack: RunningStack, tmp_path: Path, writer: str
) -> None:
    """Steady batches append their versions to the history (no file of it is ever
    rewritten) and take one commit of the current state: a MERGE for updates and
    deletes, a plain append for a batch of inserts of new keys; a delete removes the
    key's row. The product's reading of the history (`history_frame`, the SQL other
    engines get) gives the ends the test computes itself. Both writers
    (`[stores.warehouse] writer`) write the same tables."""
    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root, writer=writer)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}
    current, history = current_path(root, "public.t"), history_path(root, "public.t")

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([event(k, k, "r", "v0", (100, 0), 1000) for k in (1, 2, 3)])
    before = (len(_operations(current)), len(_operations(history)))
    write([event(1, 10, "u", "v1", (200, 1), 2000), event(2, 11, "d", None, (200, 2), 2000)])
    write([event(4, 12, "c", "n4", (300, 1), 3000), event(5, 13, "c", "n5", (300, 2), 3000)])
    store.truncate(TABLE, (400, 1), 4000)
    write([event(3, 14, "c", "again", (500, 1), 5000)])  # its row went with the TRUNCATE
    # an insert of a key the table holds (a partition detached, whose rows PostgreSQL
    # never deleted in the log, then the key inserted again): merged, never doubled
    write([event(3, 15, "c", "ghost", (600, 1), 6000)])
    operations = _operations(current)[before[0] :]
    assert operations == ["MERGE", "WRITE", "DELETE", "WRITE", "MERGE"], operations
    assert _operations(history)[before[1] :] == ["WRITE"] * 5
    wrote = engines(current)[before[0] :]
    assert wrote == [writer, writer, "spark", writer, writer], wrote  # TRUNCATE: Spark
    assert engines(history)[before[1] :] == [writer, writer, "spark", writer, writer]
    assert _adds_and_removes(history)[1] == 0  # appended to, never rewritten
    assert _current(spark, root) == [(3, "ghost", 600, 1)]
    expected = [
        (1, "r", "v0", 1000, 2000),
        (1, "u", "v1", 2000, 4000),
        (2, "r", "v0", 1000, 2000),
        (2, "d", None, 2000, 4000),
        (3, "r", "v0", 1000, 4000),
        (3, "c", "again", 5000, 6000),
        (3, "c", "ghost", 6000, None),
        (4, "c", "n4", 3000, 4000),
        (5, "c", "n5", 3000, 4000),
    ]
    assert _versions(spark, root) == expected
    read = store.history_frame(TABLE)
    assert read is not None
    derived = [
        (r["id"], r["_cdc_op"], r["body"], r["f"], r["t"])
        for r in read.selectExpr(
            "id", "_cdc_op", "body", "unix_millis(valid_from) AS f", "unix_millis(valid_to) AS t"
        )
        .orderBy("id", "_cdc_commit_lsn", "_cdc_lsn")
        .collect()
    ]
    assert derived == expected


def test_a_write_older_than_a_deleted_keys_delete_is_refused_after_a_restart(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A deleted key has no row in the current state: its delete in the history keeps
    its position, and a change sent again from before it (a new offset, `cdc apply`
    started again) brings the row back nowhere."""
    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    tables = {"public.t": TABLE}
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    batch = [event(1, 0, "c", "a", (100, 1), 1000), event(1, 1, "u", "b", (200, 1), 2000)]
    batch += [event(1, 2, "d", None, (300, 1), 3000), event(2, 3, "c", "x", (300, 2), 3000)]
    store.write_frame(tables, spark.createDataFrame(batch, EVENTS), {"public.t"})
    expected = _versions(spark, root)

    store = WarehouseStore(spark, root)  # started again: reads what the history holds
    store.prepare([TABLE])
    again = [event(1, 4, "u", "b", (200, 1), 2000), event(2, 5, "u", "y", (400, 1), 4000)]
    store.write_frame(tables, spark.createDataFrame(again, EVENTS), {"public.t"})
    assert _current(spark, root) == [(2, "y", 400, 1)]
    assert expected == [
        (1, "c", "a", 1000, 2000),
        (1, "u", "b", 2000, 3000),
        (1, "d", None, 3000, None),
        (2, "c", "x", 3000, None),
    ]
    assert _versions(spark, root) == [
        *expected[:3],
        (2, "c", "x", 3000, 4000),
        (2, "u", "y", 4000, None),
    ]


def test_a_crash_between_the_history_and_the_current_state_is_made_good(
    stack: RunningStack, tmp_path: Path
) -> None:
    """The history is written before the current state: a batch that reached the
    history but not the current state (its commit undone, as a crash between the two
    leaves it) is written again after a restart; the current state takes it, and the
    history, which holds it, gains nothing."""
    from delta.tables import DeltaTable

    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    tables = {"public.t": TABLE}
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    first = [event(k, k, "r", "v0", (100, 0), 1000) for k in (1, 2, 3)]
    store.write_frame(tables, spark.createDataFrame(first, EVENTS), {"public.t"})
    version = DeltaTable.forPath(spark, current_path(root, "public.t")).history(1).first()
    second = [event(1, 3, "u", "v1", (200, 1), 2000), event(2, 4, "d", None, (200, 2), 2000)]
    second += [event(4, 5, "c", "n4", (200, 3), 2000)]
    store.write_frame(tables, spark.createDataFrame(second, EVENTS), {"public.t"})
    expected, state = _versions(spark, root), _current(spark, root)
    assert state == [(1, "v1", 200, 1), (3, "v0", 100, 0), (4, "n4", 200, 3)]
    assert version is not None
    DeltaTable.forPath(spark, current_path(root, "public.t")).restoreToVersion(version["version"])
    assert _current(spark, root) != state

    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    store.write_frame(tables, spark.createDataFrame(second, EVENTS), {"public.t"})
    assert _current(spark, root) == state
    assert _versions(spark, root) == expected

    # a backfill's rows share one position: its batch run again is told by its offsets
    third = [event(5, 6, "r", "b5", (300, 0), 3000), event(6, 7, "r", "b6", (300, 0), 3000)]
    version = DeltaTable.forPath(spark, current_path(root, "public.t")).history(1).first()
    store.write_frame(tables, spark.createDataFrame(third, EVENTS), {"public.t"})
    expected, state = _versions(spark, root), _current(spark, root)
    assert len(expected) == 8 and len(state) == 5
    assert version is not None
    DeltaTable.forPath(spark, current_path(root, "public.t")).restoreToVersion(version["version"])
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    store.write_frame(tables, spark.createDataFrame(third, EVENTS), {"public.t"})
    assert _current(spark, root) == state
    assert _versions(spark, root) == expected


def test_a_table_of_the_earlier_layout_is_refused_in_one_line(
    stack: RunningStack, tmp_path: Path
) -> None:
    """A current state that still keeps deleted rows as markers (`_cdc_deleted`) is of
    the layout before: the store names the command that rebuilds it, and that command's
    reset writes it anew, after which the store takes batches."""
    from pyspark.sql import types as T

    from cdc.core.errors import StoreError
    from cdc.core.spark import spark_session
    from cdc.stores.warehouse.tables import ensure_delta

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    fields = [
        T.StructField("id", T.IntegerType()),
        T.StructField("body", T.StringType()),
        T.StructField("_cdc_deleted", T.BooleanType()),
    ]
    ensure_delta(spark, current_path(root, "public.t"), fields)
    with pytest.raises(StoreError) as refused:
        WarehouseStore(spark, root).prepare([TABLE])
    said = str(refused.value)
    assert "cdc rebuild --store warehouse" in said and "\n" not in said, said

    store = WarehouseStore(spark, root)  # what `cdc rebuild --store warehouse` does
    store.reset(TABLE)
    store.prepare([TABLE])
    tables = {"public.t": TABLE}
    store.write_frame(
        tables, spark.createDataFrame([event(1, 0, "c", "a", (100, 1), 1000)], EVENTS), {"public.t"}
    )
    assert _current(spark, root) == [(1, "a", 100, 1)]
    assert _versions(spark, root) == [(1, "c", "a", 1000, None)]


@pytest.mark.parametrize("writer", ["delta-rs", "spark"])
def test_a_view_batch_appended_again_is_written_once(
    stack: RunningStack, tmp_path: Path, writer: str
) -> None:
    """A sliding window's or a session's batch (append mode) run again after a crash adds
    nothing; a query started afresh (another checkpoint, batch ids from 0) writes again.
    Either writer keeps Delta's transaction ids, so a batch Spark wrote is not written
    again by delta-rs (the writer changed between two runs of the job), nor the reverse."""
    from pyarrow.fs import LocalFileSystem
    from pyspark.sql import types as T

    from cdc.core.spark import spark_session
    from cdc.log.checkpoints import Checkpoint
    from cdc.stores.warehouse.native import NativeWriter
    from cdc.stores.warehouse.views.streams import appended_to
    from tests.stores import delta_rs_read

    spark = spark_session(stack.settings, "test-view-append")
    path = str(tmp_path / "view")
    fields = [T.StructField("window_end", T.LongType()), T.StructField("rows", T.LongType())]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-1"}))
    query = Checkpoint(str(checkpoint), LocalFileSystem(), str(checkpoint))
    write = appended_to(spark, path, fields, query, NativeWriter(writer == "delta-rs"))
    other = appended_to(spark, path, fields, query, NativeWriter(writer != "delta-rs"))
    first = spark.createDataFrame([(1, 10), (2, 20)], "rows long, window_end long")
    write(first, 0)
    write(first, 0)  # the batch run again after a crash before Spark recorded it
    other(first, 0)  # and by the other writer
    write(spark.createDataFrame([(3, 30)], "rows long, window_end long"), 1)
    assert engines(path)[-1] == writer
    held = delta_rs_read(Path(path)).to_pylist()
    assert sorted((r["window_end"], r["rows"]) for r in held) == [(10, 1), (20, 2), (30, 3)]
    # started afresh: its table emptied (streams.start_afresh), batch ids again from 0
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).delete()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-2"}))
    write(first, 0)
    held = delta_rs_read(Path(path)).to_pylist()
    assert sorted((r["window_end"], r["rows"]) for r in held) == [(10, 1), (20, 2)]


DATED = Table(
    "public",
    "dated",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("due", "date", "date", "D", False, None, False),
    ),
    ("id",),
    "d",
    1,
    1,
)


def test_a_table_delta_rs_cannot_write_is_written_by_spark_once(
    stack: RunningStack, tmp_path: Path
) -> None:
    """PostgreSQL's `infinity` date is beyond what delta-rs's file statistics hold (its
    writer fails, committing nothing): Spark writes that batch, and the table's later
    ones, each version once."""
    from cdc.core.spark import spark_session
    from cdc.types.decode import DATE_INFINITY

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([DATED])
    current, history = current_path(root, "public.dated"), history_path(root, "public.dated")

    def dated(key: int, offset: int, op: str, due: int, at: tuple[int, int]) -> dict:  # type: ignore[type-arg]
        return {
            **event(key, offset, op, None, at, at[0] * 10),
            "table": "public.dated",
            "after": json.dumps({"id": key, "due": due}),
        }

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        frame = spark.createDataFrame(rows, EVENTS)
        store.write_frame({"public.dated": DATED}, frame, {"public.dated"})

    write([dated(1, 0, "r", 20000, (100, 0)), dated(2, 1, "r", 20001, (100, 0))])
    assert engines(current)[-1] == engines(history)[-1] == "delta-rs"
    write([dated(1, 2, "u", DATE_INFINITY[0], (200, 1)), dated(2, 3, "u", 20002, (200, 2))])
    write([dated(2, 4, "u", 20003, (300, 1))])
    assert engines(current)[-2:] == engines(history)[-2:] == ["spark", "spark"]
    assert set(store.native.refused) == {current, history}

    frame = spark.read.format("delta").load(current)
    held = sorted(
        (r["id"], r["d"]) for r in frame.selectExpr("id", "unix_date(due) AS d").collect()
    )
    assert held == [(1, 2**31 - 1), (2, 20003)]
    versions = spark.read.format("delta").load(history).selectExpr("id", "unix_date(due) AS d")
    assert sorted(tuple(r) for r in versions.collect()) == [
        (1, 20000),
        (1, 2**31 - 1),
        (2, 20001),
        (2, 20002),
        (2, 20003),
    ]


def test_a_large_batch_is_written_by_spark(stack: RunningStack, tmp_path: Path) -> None:
    """A table's batch too large to collect into the driver for delta-rs (its events'
    row images over NATIVE_MAX_CHARS) is written by Spark; the next small one by
    delta-rs again."""
    from cdc.core.spark import spark_session
    from cdc.stores.warehouse.store import NATIVE_MAX_CHARS

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root)
    store.prepare([TABLE])
    current, history = current_path(root, "public.t"), history_path(root, "public.t")

    def write(rows: list[dict], size: int) -> None:  # type: ignore[type-arg]
        frame = spark.createDataFrame(rows, EVENTS)
        store.write_frame({"public.t": TABLE}, frame, {"public.t"}, None, {"public.t": size})

    write([event(1, 0, "r", "a", (100, 0), 1000)], NATIVE_MAX_CHARS + 1)
    assert engines(current)[-1] == engines(history)[-1] == "spark"
    write([event(1, 1, "u", "b", (200, 1), 2000)], 100)
    assert engines(current)[-1] == engines(history)[-1] == "delta-rs"
    assert _current(spark, root) == [(1, "b", 200, 1)]


# a table without a primary key, keyed by (a, b) with pipeline.key_columns: b may be NULL
NULL_KEYED = Table(
    "public",
    "t",
    (
        Column("a", "integer", "int4", "N", False, None, True),
        Column("b", "integer", "int4", "N", False, None, False),
        Column("body", "text", "text", "S", False, None, False),
    ),
    ("a", "b"),
    "f",
    1,
    1,
)


def null_keyed(a: int, offset: int, op: str, body: str | None, at: tuple[int, int]) -> dict:  # type: ignore[type-arg]
    row = event(a, offset, op, body, at, at[0] * 10)
    row["key"] = json.dumps({"a": a, "b": None})
    row["after"] = None if op == "d" else json.dumps({"a": a, "b": None, "body": body})
    return row


@pytest.mark.parametrize("writer", ["delta-rs", "spark"])
def test_a_key_holding_null_is_one_live_row_and_its_older_change_is_refused(
    stack: RunningStack, tmp_path: Path, writer: str
) -> None:
    """Finding B of the 2026-12-01 review: Spark's path looked keys up with `=`, which
    never matches NULL. A backfill's reads of keys the current state held were taken
    for inserts and appended (a second live row per key), and a change delivered again
    after the key's delete was not refused (the key came back)."""
    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-history")
    root = str(tmp_path / "warehouse")
    store = WarehouseStore(spark, root, writer=writer)
    store.prepare([NULL_KEYED])
    tables = {"public.t": NULL_KEYED}

    def write(rows: list[dict]) -> None:  # type: ignore[type-arg]
        store.write_frame(tables, spark.createDataFrame(rows, EVENTS), {"public.t"})

    write([null_keyed(a, a, "r", "v0", (100, 0)) for a in (1, 2, 3)])  # the snapshot
    write([null_keyed(a, 10 + a, "r", "v1", (200, 0)) for a in (1, 2, 3)])  # a backfill
    write([null_keyed(3, 20, "d", None, (300, 1))])
    # key 3's backfilled row delivered again, after its delete (a restart of Connect)
    write([null_keyed(3, 21, "r", "v1", (200, 0))])
    current = spark.read.format("delta").load(current_path(root, "public.t"))
    rows = sorted((r["a"], r["b"], r["body"]) for r in current.collect())
    assert rows == [(1, None, "v1"), (2, None, "v1")], rows
