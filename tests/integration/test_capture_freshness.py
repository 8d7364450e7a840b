"""A store's lag and SLO are measured from PostgreSQL's commit, not from the log: a
capture that stalls (Connect stopped) or fails (a task failed) breaches every store's SLO
within its SLO and a heartbeat interval, though every store has applied all the log
holds; an idle pipeline never does (its heartbeats keep coming)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.status import PipelineStatus, pipeline_status
from cdc.core.settings import Settings
from cdc.stack.process import read_pid
from tests.conftest import Capture
from tests.helpers import apply_process, run_cdc, steady_updates
from tests.logcheck import poll

pytestmark = pytest.mark.integration

HEARTBEAT_MS = 1000
STALLED = "capture has delivered nothing since"


def held_to(settings: Settings, slo_s: float, window_s: float = 10.0, **kafka: Any) -> Settings:
    """The pipeline's settings with every store held to `slo_s` over `window_s`."""
    apply = settings.apply.model_copy(
        update={
            "freshness_slo_s": {s: slo_s for s in ("cache", "search", "warehouse")},
            "freshness_window_s": window_s,
        }
    )
    update: dict[str, Any] = {"apply": apply}
    if kafka:
        update["kafka"] = settings.kafka.model_copy(update=kafka)
    return settings.model_copy(update=update)


def breached_by_capture(status: PipelineStatus, stores: list[str]) -> bool:
    why = status.breached
    return all(store in why and why[store].startswith(STALLED) for store in stores)


def met(status: PipelineStatus, stores: list[str]) -> bool:
    """Every store has made changes visible within its SLO, and none is breached."""
    figures = [(status.stores.get(s) or {}).get("freshness") or {} for s in stores]
    return all(f.get("p99_s") is not None and f.get("breached") is False for f in figures)


def test_an_idle_pipeline_never_breaches_while_its_heartbeats_advance(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 10) g",
        prefix="idle",
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    settings = held_to(t.settings, 3.0)
    run_apply(settings, ["cache"], once=True)
    poll(
        lambda: (pipeline_status(settings).capture or {}).get("lag_s") is not None,
        60,
        "the first heartbeat to reach the log",
    )
    heartbeats, deadline = set(), time.monotonic() + 8 * HEARTBEAT_MS / 1000
    while time.monotonic() < deadline:  # eight heartbeat intervals without a change
        status = pipeline_status(settings)
        capture = status.capture or {}
        assert capture["lag_s"] < 3.0 and not capture["stalled"], capture
        assert status.stores["cache"]["backlog_events"] == 0
        assert not status.breached, status.breached
        heartbeats.add(capture["heartbeat_ms"])
        time.sleep(0.5)
    assert len(heartbeats) >= 4  # the heartbeats kept advancing: the capture runs


def test_status_tells_the_capture_and_every_store_while_connect_does_not_answer(
    captured: Capture,
) -> None:
    """Kafka Connect paused (SIGSTOP): `cdc status` still shows the pipeline, its figures
    read from PostgreSQL and Kafka: the capture stalled and its lag, each store's backlog
    and lag (the capture's at least), and why (Connect does not answer); it exits 1."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 10) g",
        prefix="paused",
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    settings = t.settings
    run_apply(settings, ["cache"], once=True)
    poll(
        lambda: (pipeline_status(settings).capture or {}).get("lag_s") is not None,
        60,
        "the first heartbeat to reach the log",
    )
    env = {**t.env, "CDC_PIPELINE__HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS)}
    connect = read_pid(settings.data_dir / "run" / "connect.pid")
    assert connect is not None, "Kafka Connect does not run"
    os.kill(connect, signal.SIGSTOP)
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:  # a change Kafka never gets
            conn.execute(f"UPDATE {t.name} SET n = n + 1 WHERE id = 1")
        poll(
            lambda: bool((pipeline_status(settings).capture or {}).get("stalled")),
            60,
            "the capture to stall",
        )
        result = run_cdc("status", "--output", "json", env=env, timeout=300)
        assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
        report = json.loads(result.stdout)
        assert not next(c for c in report["components"] if c["name"] == "connect")["up"]
        pipeline = report["pipeline"]
        assert pipeline is not None, "no pipeline section with Connect not answering"
        capture = pipeline["capture"]
        assert capture["stalled"] and capture["lag_s"] > 0, capture
        assert "Kafka Connect" in capture["why"], capture
        assert pipeline["connector"]["state"] == "UNKNOWN", pipeline["connector"]
        assert "Kafka Connect" in pipeline["connector"]["error"], pipeline["connector"]
        cache = pipeline["stores"]["cache"]
        assert cache["backlog_events"] == 0 and cache["lag_s"] >= capture["lag_s"], cache
        assert pipeline["error"] is None, pipeline["error"]
        # and for people: the capture's line and the store's, with the reason
        text = run_cdc("status", env=env, timeout=300)
        assert text.returncode == 1, text.stdout[-3000:] + text.stderr[-3000:]
        said = " ".join(text.stdout.replace("│", " ").split())  # the cells, as words
        assert "capture stalled: capture has delivered nothing since" in said, said[-3000:]
        assert "Kafka Connect" in said.split("capture stalled:")[1], said[-3000:]
        assert "store cache caught up with the log (backlog 0); lag" in said, said[-3000:]
    finally:
        os.kill(connect, signal.SIGCONT)


# an apply job of its own under load for minutes: in `make test-long` (CI's run has the
# failed task's breach, which the same lag gives)
@pytest.mark.long
def test_connect_stopped_under_load_breaches_every_store_then_recovers(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 50) g",
        prefix="stall",
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    slo_s, stores = 8.0, ["cache", "search"]
    settings = held_to(t.settings, slo_s)
    env = {
        **t.env,
        "CDC_PIPELINE__HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
        "CDC_APPLY__FRESHNESS_SLO_S": json.dumps(dict.fromkeys(stores, slo_s)),
        "CDC_APPLY__FRESHNESS_WINDOW_S": "10",
    }
    connect = read_pid(settings.data_dir / "run" / "connect.pid")
    assert connect is not None, "Kafka Connect does not run"
    stop, stopped_at = threading.Event(), None
    writer = threading.Thread(target=steady_updates, args=(t.dsn, t.name, 50, stop), daemon=True)
    with apply_process(env, stores) as apply:
        try:
            writer.start()
            poll(lambda: met(pipeline_status(settings), stores), 240, "both SLOs met under load")
            os.kill(connect, signal.SIGSTOP)
            stopped_at = time.monotonic()
            poll(
                lambda: breached_by_capture(pipeline_status(settings), stores),
                60,
                "every store's SLO breached by the stalled capture",
            )
            # within the SLO and one heartbeat interval (and the time a status takes)
            assert time.monotonic() - stopped_at < slo_s + HEARTBEAT_MS / 1000 + 10
            status = pipeline_status(settings)
            assert status.capture is not None and status.capture["stalled"]
            for store in stores:  # each holds all the log has: its lag is the capture's
                assert status.stores[store]["lag_s"] >= status.capture["lag_s"] > slo_s
            os.kill(connect, signal.SIGCONT)
            stopped_at = None
            poll(
                lambda: met(pipeline_status(settings), stores),
                240,
                "both SLOs met again once Connect runs",
            )
            assert not (pipeline_status(settings).capture or {}).get("stalled")
            assert apply.poll() is None
        finally:
            if stopped_at is not None:
                os.kill(connect, signal.SIGCONT)
            stop.set()
            writer.join(timeout=30)


# about 3.3 MB of words: over a 1 MiB limit, the connector's task fails on it
BIG = "(SELECT string_agg(md5(g::text), ' ') FROM generate_series(1, 100000) g)"


def test_a_failed_connector_task_breaches_every_store(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} VALUES (1, 'small'), (2, 'small')",
        prefix="failed",
        snapshot=False,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    stores = ["cache", "search", "warehouse"]
    settings = held_to(t.settings, 5.0, max_message_bytes=1024 * 1024)
    run_snapshot(settings, io_console())
    run_apply(settings, stores, once=True)

    def healthy() -> bool:
        status = pipeline_status(settings)
        return (status.capture or {}).get("lag_s") is not None and not status.breached

    poll(healthy, 60, "the capture's first heartbeat, every store within its SLO")
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET body = {BIG} WHERE id = 1")
    poll(
        lambda: breached_by_capture(pipeline_status(settings), stores),
        90,
        "every store's SLO breached by the failed task",
    )
    status = pipeline_status(settings)
    assert status.connector is not None and "FAILED" in status.connector["tasks"]
    assert all("FAILED" in status.breached[s] for s in stores), status.breached
    assert all(status.stores[s]["backlog_events"] == 0 for s in stores)


def io_console() -> Any:
    import io

    from rich.console import Console

    return Console(file=io.StringIO())
