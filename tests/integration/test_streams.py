"""Derived data with a watermark on commit time: sliding and session windows and a
stream-stream join (an order's creation and its shipping within a time), against a
reference the test computes from PostgreSQL's commit times; the same after a replay
from the log's start; a late event is counted, not applied."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from kafka import KafkaProducer

from cdc.apply.job import run_apply
from cdc.check.status import pipeline_status
from cdc.check.view_checks import view_checks
from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings
from cdc.core.settings.views import SessionWindow, SlidingWindow, StreamStreamJoin
from cdc.core.topics import change_topic, read_topic
from cdc.stores.warehouse.tables import view_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import query_checkpoint
from tests.logcheck import table_info, wait_until_equal

pytestmark = [pytest.mark.integration, pytest.mark.long]

GAP, SLIDING, WITHIN, WATERMARK = 2.0, 2.0, 3.0, 1.0  # seconds


def view_rows(settings: Settings, name: str) -> list[dict[str, Any]]:
    """The view's Delta table, read by Spark's own Delta reader."""
    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    frame = spark.read.format("delta").load(view_path(warehouse_root(settings), name))
    return [r.asDict() for r in frame.collect()]


def commit_times(dsn: str, orders: str) -> dict[int, tuple[datetime, int, Decimal, str]]:
    """Per order: the commit time (to the millisecond, as the log has it) of the
    transaction that last wrote it, its customer, total and status."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT id, pg_xact_commit_timestamp(xmin), customer_id, total, status FROM {orders}"
        ).fetchall()
    return {
        i: (
            ts.astimezone(UTC).replace(tzinfo=None, microsecond=ts.microsecond // 1000 * 1000),
            c,
            t,
            s,
        )
        for i, ts, c, t, s in rows
    }


def test_sliding_and_session_windows_and_stream_join_equal_a_reference(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, customer_id int NOT NULL, "
        "total numeric(12, 2) NOT NULL, status text NOT NULL DEFAULT 'new')",
        "INSERT INTO {name} SELECT g, g, 1 FROM generate_series(1000, 1004) g",
        prefix="streams",
    )
    orders = t.name
    seconds = lambda s: f"{int(s)} seconds"  # noqa: E731
    sliding = SlidingWindow(
        name=f"sliding_{orders}",
        table=t.table,
        kind="sliding",
        sum="total",
        window=seconds(SLIDING),
        watermark=seconds(WATERMARK),
    )
    sessions = SessionWindow(
        name=f"sessions_{orders}",
        table=t.table,
        kind="session",
        sum="total",
        gap=seconds(GAP),
        group_by="customer_id",
        watermark=seconds(WATERMARK),
    )
    shipping = StreamStreamJoin(
        name=f"shipping_{orders}",
        kind="stream_stream",
        table=t.table,
        references=t.table,
        on="id",
        when={"status": ["shipped", "cancelled"]},
        columns=["status"],
        within=seconds(WITHIN),
        watermark=seconds(WATERMARK),
    )
    apply = t.settings.apply.model_copy(
        update={"joins": [shipping], "windows": [sliding, sessions]}
    )
    settings = t.settings.model_copy(update={"apply": apply})

    # a timeline of orders (customer, total) and status changes, in real time
    created: dict[int, tuple[datetime, int, Decimal]] = {}
    with psycopg.connect(t.dsn, autocommit=True) as conn:

        def order(*rows: tuple[int, int, str]) -> None:
            with conn.transaction():
                for i, customer, total in rows:
                    conn.execute(f"INSERT INTO {orders} VALUES (%s, %s, %s)", (i, customer, total))
            at = commit_times(t.dsn, orders)  # before any update of these rows
            created.update({i: at[i][:3] for i, _, _ in rows})

        def status(i: int, value: str) -> None:
            conn.execute(f"UPDATE {orders} SET status = %s WHERE id = %s", (value, i))

        order((1, 1, "10.00"), (2, 2, "20.00"), (3, 3, "30.00"))  # one transaction
        time.sleep(0.5)
        order((4, 1, "4.50"))  # customer 1's session goes on
        status(1, "shipped")  # within WITHIN of its creation
        time.sleep(1.0)
        order((5, 2, "5.25"))
        status(3, "paid")  # not an end: `when` does not hold
        time.sleep(2.5)
        order((6, 1, "6.00"))  # more than GAP after customer 1's last order: a new session
        status(2, "shipped")  # too long after its creation: order 2 has no end
        status(5, "cancelled")
        time.sleep(0.3)
        order((7, 3, "7.00"), (8, 3, "8.00"))
        time.sleep(GAP + WITHIN + WATERMARK)
        order((9, 9, "9.00"))  # the tick: its time moves the watermark past all above
    now = commit_times(t.dsn, orders)  # an updated order's: its update's
    starts = created
    wm = now[9][0] - timedelta(seconds=WATERMARK)

    wait_until_equal(settings, table_info(settings, t.table))
    run_apply(settings, ["warehouse"], once=True)

    # the references, from the creation and update times PostgreSQL recorded
    def expected_sliding() -> list[tuple[Any, ...]]:
        ends = sorted({ts for ts, _, _ in starts.values()})
        width = timedelta(seconds=SLIDING)
        out = []
        for end in ends:
            if end + width >= wm:  # not written yet: Spark writes it a width later
                continue
            inside = [total for ts, _, total in starts.values() if end - width <= ts <= end]
            out.append((end - width, end, len(inside), sum(inside)))
        return out

    def expected_sessions() -> list[tuple[Any, ...]]:
        out = []
        for customer in sorted({c for _, c, _ in starts.values()}):
            times = sorted((ts, total) for ts, c, total in starts.values() if c == customer)
            group = [times[0]]
            for ts, total in [*times[1:], (None, None)]:
                if ts is not None and ts - group[-1][0] < timedelta(seconds=GAP):
                    group.append((ts, total))
                    continue
                end = group[-1][0] + timedelta(seconds=GAP)
                if end <= wm:
                    out.append((customer, group[0][0], end, len(group), sum(x for _, x in group)))
                if ts is not None:
                    group = [(ts, total)]
        return sorted(out)

    def expected_shipping() -> list[tuple[Any, ...]]:
        out = []
        for i, (ts, _, _) in sorted(starts.items()):
            end_ts, _, _, end_status = now[i]
            shipped = end_status in ("shipped", "cancelled")
            if shipped and end_ts - ts <= timedelta(seconds=WITHIN):
                out.append((i, ts, end_ts, end_status))
            elif ts + timedelta(seconds=WITHIN) < wm:
                out.append((i, ts, None, None))
        return out

    def held() -> tuple[list[Any], list[Any], list[Any]]:
        return (
            sorted(
                (r["window_start"], r["window_end"], r["rows"], r["total"])
                for r in view_rows(settings, sliding.name)
            ),
            sorted(
                (r["customer_id"], r["window_start"], r["window_end"], r["rows"], r["total"])
                for r in view_rows(settings, sessions.name)
            ),
            sorted(
                (r["id"], r["start_ts"], r["end_ts"], r["end_status"])
                for r in view_rows(settings, shipping.name)
            ),
        )

    expected = (expected_sliding(), expected_sessions(), expected_shipping())
    # the timeline has each case: a session of two orders and one of one; an order
    # shipped in time, one cancelled in time, one shipped too late, some never
    assert {n for _, _, _, n, _ in expected[1]} == {1, 2}
    assert [s for _, _, _, s in expected[2] if s] == ["shipped", "cancelled"]
    assert len([s for _, _, _, s in expected[2] if s is None]) >= 3
    first = held()
    assert first == expected
    elapsed = {r["id"]: r["elapsed_s"] for r in view_rows(settings, shipping.name)}
    assert elapsed[1] == (now[1][0] - starts[1][0]).total_seconds()
    assert elapsed[2] is None
    late = pipeline_status(settings).late_events
    assert late == {sliding.name: 0, sessions.name: 0, shipping.name: 0}

    tables = {t.table: table_info(settings, t.table)}
    checks = {c.table: c for c in view_checks(settings, tables)}
    assert all(c.ok for c in checks.values()), [c.observed for c in checks.values()]
    assert len(checks) == 3

    # the three share one query (one output mode, one table, one watermark): its
    # checkpoint is the only one
    shared = {query_checkpoint(settings, v.name) for v in (sliding, sessions, shipping)}
    assert len(shared) == 1 and next(iter(shared)).name.startswith("views-")
    assert not [
        p for p in shared.pop().parent.iterdir() if p.name.startswith("window-") and p.is_dir()
    ]

    # a replay from the log's start (the checkpoints lost) computes the same tables
    shutil.rmtree(query_checkpoint(settings, sliding.name))
    run_apply(settings, ["warehouse"], once=True)
    assert held() == first

    # a tampered table is found by verify
    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    root = warehouse_root(settings)
    spark.sql(
        f"UPDATE delta.`{view_path(root, sessions.name)}` SET rows = rows + 1 WHERE customer_id = 1"
    )
    spark.sql(f"DELETE FROM delta.`{view_path(root, shipping.name)}` WHERE id = 2")
    checks = {c.table: c for c in view_checks(settings, tables)}
    assert not checks[f"view {sessions.name}"].ok
    assert not checks[f"view {shipping.name}"].ok
    assert checks[f"view {sliding.name}"].ok
    spark.sql(f"UPDATE delta.`{view_path(root, sliding.name)}` SET total = total + 1")
    assert not {c.table: c for c in view_checks(settings, tables)}[f"view {sliding.name}"].ok
    shutil.rmtree(query_checkpoint(settings, sliding.name))
    run_apply(settings, ["warehouse"], once=True)
    assert held() == first

    # an event committed before the watermark, delivered now (as a connector restored
    # from an old offset would): counted late by each view, applied by none
    topic = change_topic(settings.pipeline, t.table)
    (record,) = [
        r for r in read_topic(settings.kafka, topic) if r.value and r.value["after"]["id"] == 7
    ]
    value = dict(record.value)
    value["after"] = dict(value["after"], id=500, customer_id=1)
    value["source"] = dict(
        value["source"],
        lsn=value["source"]["lsn"] + 1,
        ts_ms=int((wm - timedelta(seconds=5)).replace(tzinfo=UTC).timestamp() * 1000),
    )
    producer = KafkaProducer(**kafka_client_kwargs(settings.kafka), acks="all")
    producer.send(
        topic,
        key=json.dumps({"id": 500}).encode(),
        value=json.dumps(value).encode(),
        partition=record.partition,
    ).get(timeout=30)
    producer.close()
    run_apply(settings, ["warehouse"], once=True)
    assert held() == first
    late = pipeline_status(settings).late_events
    assert late == {sliding.name: 1, sessions.name: 1, shipping.name: 1}
