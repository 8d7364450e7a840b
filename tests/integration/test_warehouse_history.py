"""The warehouse's history, written batch by batch through real Delta tables: changes of a
table that reach the warehouse after its TRUNCATE (another topic read further ahead) are
versions that end at the TRUNCATE, never dropped and never current; the history is read
back with a Delta reader of the test's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc.catalog import Column, Table
from materializers.stores.warehouse.store import WarehouseStore
from materializers.stores.warehouse.tables import current_path, history_path
from tests.conftest import RunningStack

pytestmark = pytest.mark.integration

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
EVENTS = (
    "table string, topic string, partition int, offset long, key string, op string, "
    "after string, commit_ms long, commit_lsn long, lsn long, error string, value string, "
    "cut_ms long"
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
