"""Window queries at their edges: an event late for some of its hopping windows still
counts in the others, and a column widened while the queries run is read whole."""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaProducer

from cdc.apply.job import run_apply
from cdc.check.status import pipeline_status
from cdc.check.view_checks import view_checks
from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings
from cdc.core.settings.views import HoppingWindow, SessionWindow, TumblingWindow, WindowSettings
from cdc.core.topics import ChangeRecord, change_topic, read_topic, wait_for_records
from cdc.log.checkpoints import checkpoint
from cdc.stores.warehouse.tables import view_path, warehouse_root
from cdc.stores.warehouse.views.windows import FillingWindowView
from tests.conftest import Capture
from tests.logcheck import table_info, wait_until_equal

pytestmark = pytest.mark.integration


def view_rows(settings: Settings, name: str) -> list[dict[str, Any]]:
    """The view's Delta table, read by Spark's own Delta reader."""
    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    path = view_path(warehouse_root(settings), name)
    try:
        return [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    except Exception:  # not written yet
        return []


def with_views(settings: Settings, *windows: WindowSettings) -> Settings:
    apply = settings.apply.model_copy(update={"windows": list(windows)})
    return settings.model_copy(update={"apply": apply})


def test_a_hopping_window_counts_a_late_event_in_the_windows_still_open(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, total numeric(6, 2) NOT NULL)",
        prefix="hop",
    )
    hopping = HoppingWindow(
        name=f"hop_{t.name}",
        table=t.table,
        kind="hopping",
        sum="total",
        window="10 seconds",
        slide="2 seconds",
        watermark="2 seconds",
    )
    settings = with_views(t.settings, hopping)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        for i in range(1, 4):
            conn.execute(f"INSERT INTO {t.name} VALUES (%s, 1)", (i,))
            time.sleep(1.0)
        time.sleep(3.0)
        conn.execute(f"INSERT INTO {t.name} VALUES (4, 1)")  # the tick: moves the watermark
    wait_until_equal(settings, table_info(settings, t.table))
    run_apply(settings, ["warehouse"], once=True)
    before = {r["window_start"]: r["rows"] for r in view_rows(settings, hopping.name)}
    assert sum(before.values()) == 4 * 5  # each creation in five windows
    # its state in one partition (apply.views_state_partitions): a task and a state store
    # per stateful step and trigger, not four
    state = Path(checkpoint(settings, FillingWindowView(hopping).checkpoint_label).path) / "state"
    kept = {p.name for step in state.iterdir() for p in step.iterdir() if p.name.isdigit()}
    assert kept == {"0"}, kept

    # a creation committed 3 s before the watermark, delivered now: too late for the
    # windows that ended before the watermark, in time for the others
    at = inject_late(settings, t.table, 4, 3)
    watermark = at + 3000
    run_apply(settings, ["warehouse"], once=True)

    after = {r["window_start"]: r["rows"] for r in view_rows(settings, hopping.name)}
    counted_in = {s for s in after if after[s] != before.get(s, 0)}
    starts = FillingWindowView(hopping).starts(at)
    assert len(starts) == 5

    def start_of(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)

    # Spark's rule: a window is closed for late data once its end is at the watermark
    still_open = {start_of(s) for s in starts if s + 10_000 > watermark}
    assert 0 < len(still_open) < 5
    assert counted_in == still_open, (counted_in, still_open)
    assert all(after[s] == before.get(s, 0) + 1 for s in counted_in)
    late = pipeline_status(settings).late_events
    assert late == {hopping.name: 5 - len(still_open)}  # one per (event, window) pair
    checks = view_checks(settings, {t.table: table_info(settings, t.table)})
    assert [c.ok for c in checks] == [True], [c.observed for c in checks]


def inject_late(settings: Settings, table: str, newest: int, seconds: float) -> int:
    """Deliver now a creation committed `seconds` before the watermark (the commit time
    of creation `newest` minus 2 s), as a connector restored from old offsets would;
    return its commit time."""
    topic = change_topic(settings.pipeline, table)
    records = [r for r in read_topic(settings.kafka, topic) if r.value]
    tick = next(r for r in records if r.value["after"]["id"] == newest)
    at = tick.value["source"]["ts_ms"] - 2000 - int(seconds * 1000)
    value = dict(tick.value)
    value["after"] = dict(value["after"], id=500)
    value["source"] = dict(value["source"], lsn=value["source"]["lsn"] + 1, ts_ms=at)
    producer = KafkaProducer(**kafka_client_kwargs(settings.kafka), acks="all")
    producer.send(
        topic,
        key=json.dumps({"id": 500}).encode(),
        value=json.dumps(value).encode(),
        partition=tick.partition,
    ).get(timeout=30)
    producer.close()
    return at


def test_a_late_event_is_counted_however_many_batches_a_run_takes(captured: Capture) -> None:
    """Spark keeps the last few progress reports in memory (100 by default; 2 here, to
    stand for a long `--once` run): the late count must not come from them alone."""
    from cdc.core.spark import spark_session

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, total numeric(6, 2) NOT NULL)",
        prefix="late",
    )
    tumbling = TumblingWindow(
        name=f"tumble_{t.name}",
        table=t.table,
        sum="total",
        window="10 seconds",
        watermark="2 seconds",
    )
    settings = with_views(t.settings, tumbling)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {t.name} VALUES (1, 1)")
        time.sleep(3.0)
        conn.execute(f"INSERT INTO {t.name} VALUES (2, 1)")  # moves the watermark past 1
    wait_until_equal(settings, table_info(settings, t.table))
    run_apply(settings, ["warehouse"], once=True)
    inject_late(settings, t.table, 2, 30)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        for i in range(10, 28):  # after the late one: many batches of a record or so each
            conn.execute(f"INSERT INTO {t.name} VALUES (%s, 1)", (i,))
    topic = change_topic(settings.pipeline, t.table)
    assert len(wait_for_records(settings.kafka, topic, 2 + 1 + 18)) == 21
    spark = spark_session(settings, "test")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "2")
    try:
        apply = settings.apply.model_copy(update={"max_offsets_per_trigger": 1})
        run_apply(settings.model_copy(update={"apply": apply}), ["warehouse"], once=True)
    finally:
        spark.conf.unset("spark.sql.streaming.numRecentProgressUpdates")
    assert pipeline_status(settings).late_events == {tumbling.name: 1}
    checks = view_checks(settings, {t.table: table_info(settings, t.table)})
    assert [c.ok for c in checks] == [True], [c.observed for c in checks]


@pytest.mark.long
def test_a_column_widened_while_the_window_queries_run_is_read_whole(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, customer int NOT NULL, "
        "amount numeric(6, 2) NOT NULL)",
        prefix="widen",
    )
    per_hour = TumblingWindow(
        name=f"hour_{t.name}", table=t.table, sum="amount", window="1 hour", watermark="1 second"
    )
    sessions = SessionWindow(
        name=f"sess_{t.name}",
        table=t.table,
        kind="session",
        sum="amount",
        gap="1 second",
        group_by="customer",
        watermark="1 second",
    )
    settings = with_views(t.settings, per_hour, sessions)
    stop = threading.Event()
    failed: list[BaseException] = []

    def apply() -> None:
        try:
            run_apply(settings, ["warehouse"], stop=stop)
        except BaseException as exc:
            failed.append(exc)

    def wait_for(what: str, holds: Any) -> None:
        deadline = time.monotonic() + 180
        while not holds():
            assert not failed, failed
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(2)

    runner = threading.Thread(target=apply, daemon=True)
    runner.start()
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {t.name} VALUES (1, 1, 10.00)")
            wait_for(
                "the first window",
                lambda: sum(r["rows"] for r in view_rows(settings, per_hour.name)) == 1,
            )
            # widenings that keep every value: no backfill, the queries go on
            conn.execute(
                f"ALTER TABLE {t.name} ALTER COLUMN amount TYPE numeric(12, 2), "
                "ALTER COLUMN customer TYPE bigint"
            )
            conn.execute(f"INSERT INTO {t.name} VALUES (2, 3000000000, 1234567.89)")
            time.sleep(2.5)
            conn.execute(f"INSERT INTO {t.name} VALUES (3, 1, 1.00)")  # closes the session
        wait_for(
            "the widened row in the hourly window",
            lambda: sum(r["rows"] for r in view_rows(settings, per_hour.name)) == 3,
        )
        totals = sum(r["total"] for r in view_rows(settings, per_hour.name))
        assert totals == Decimal("1234578.89")
        wait_for(
            "the widened customer's session",
            lambda: any(r["customer"] == 3000000000 for r in view_rows(settings, sessions.name)),
        )
        (session,) = [r for r in view_rows(settings, sessions.name) if r["customer"] == 3000000000]
        assert (session["rows"], session["total"]) == (1, Decimal("1234567.89"))
        assert not [r for r in view_rows(settings, sessions.name) if r["customer"] is None]
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not failed, failed


def firsts(records: list[ChangeRecord]) -> dict[int, int]:
    """Each partition's first offset read."""
    found: dict[int, int] = {}
    for r in records:
        found.setdefault(r.partition, r.offset)
    return found


def test_a_log_compacted_at_its_head_is_not_recomputed_into_false_drift(
    captured: Capture,
) -> None:
    """Creations, then updates of the same keys: compaction removes a prefix of each
    partition and leaves no gap between the records it keeps."""
    from kafka.admin import ConfigResource, ConfigResourceType

    from cdc.core.clients import kafka_admin

    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, total numeric(6, 2) NOT NULL)",
        prefix="compact",
    )
    window = TumblingWindow(name=f"per_min_{t.name}", table=t.table, sum="total")
    settings = with_views(t.settings, window)
    topic = change_topic(settings.pipeline, t.table)
    admin = kafka_admin(settings.kafka, 30000)
    try:
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    {
                        "cleanup.policy": "compact",
                        "segment.ms": "100",
                        "min.compaction.lag.ms": "0",
                        "min.cleanable.dirty.ratio": "0.01",
                    },
                )
            ]
        )
    finally:
        admin.close()
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {t.name} SELECT g, 1 FROM generate_series(1, 30) g")
    wait_until_equal(settings, table_info(settings, t.table))
    run_apply(settings, ["warehouse"], once=True)  # the window counts the 30 creations
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET total = 2")
        deadline = time.monotonic() + 180
        n = 100
        while not any(first > 0 for first in firsts(read_topic(settings.kafka, topic)).values()):
            # segments roll, the cleaner runs
            assert time.monotonic() < deadline, "the cleaner did not compact the topic"
            time.sleep(1)
            conn.execute(f"INSERT INTO {t.name} VALUES (%s, 1)", (n,))
            n += 1
    records = read_topic(settings.kafka, topic)
    gaps = [
        (a.partition, a.offset, b.offset)
        for a, b in itertools.pairwise(records)
        if a.partition == b.partition and b.offset != a.offset + 1
    ]
    assert not gaps, gaps  # removed at the head alone
    run_apply(settings, ["warehouse"], once=True)
    (check,) = view_checks(settings, {t.table: table_info(settings, t.table)})
    assert check.ok and "compaction removed records" in check.observed, check.observed
