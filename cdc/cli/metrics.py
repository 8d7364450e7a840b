"""Prometheus metrics: the figures of `cdc status`, computed when scraped.

`cdc metrics --port 9464` serves them at http://HOST:PORT/metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cdc.capture.slot import RESNAPSHOT, WAL_ADVICE
from cdc.check.status import PipelineStatus
from cdc.stack.components.base import ComponentStatus

__all__ = ["StatusCollector", "families", "serve"]


def families(components: Sequence[ComponentStatus], pipeline: PipelineStatus) -> list[Any]:
    """The metric families for one look at the stack and the pipeline."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    up = GaugeMetricFamily("cdc_component_up", "1 when the component answers", labels=["component"])
    for c in components:
        up.add_metric([c.name], 1.0 if c.up else 0.0)
    name = [pipeline.name]
    slot_active = GaugeMetricFamily(
        "cdc_slot_active", "1 when the replication slot has a reader", labels=["pipeline"]
    )
    retained = GaugeMetricFamily(
        "cdc_slot_wal_retained_bytes",
        "WAL the slot keeps PostgreSQL from recycling",
        labels=["pipeline"],
    )
    warn_bytes = GaugeMetricFamily(
        "cdc_slot_wal_retained_warn_bytes",
        "pipeline.wal_retained_warn_bytes: retained WAL past it is warned about (0: never)",
        labels=["pipeline"],
    )
    safe = GaugeMetricFamily(
        "cdc_slot_safe_wal_size_bytes",
        "WAL that can still be written before PostgreSQL invalidates the slot "
        "(max_slot_wal_keep_size; absent when unlimited or lost)",
        labels=["pipeline"],
    )
    warning = GaugeMetricFamily(
        "cdc_slot_wal_warning",
        "1 when the slot retains WAL past pipeline.wal_retained_warn_bytes or past "
        f"max_slot_wal_keep_size: {WAL_ADVICE}",
        labels=["pipeline"],
    )
    lost = GaugeMetricFamily(
        "cdc_slot_lost",
        f"1 when PostgreSQL invalidated the slot (wal_status lost): {RESNAPSHOT}",
        labels=["pipeline"],
    )
    problem = GaugeMetricFamily(
        "cdc_slot_problem",
        "1 while the slot has a problem; the labels say which and what to do (cdc status)",
        labels=["pipeline", "health", "problem"],
    )
    slot = pipeline.slot
    if slot:
        slot_active.add_metric(name, 1.0 if slot["active"] else 0.0)
        retained.add_metric(name, float(slot["wal_retained_bytes"] or 0))
        if slot.get("warn_bytes") is not None:
            warn_bytes.add_metric(name, float(slot["warn_bytes"]))
        if slot.get("safe_wal_size") is not None:
            safe.add_metric(name, float(slot["safe_wal_size"]))
        if slot.get("health") is not None:
            warning.add_metric(name, 1.0 if slot["health"] == "warning" else 0.0)
            lost.add_metric(name, 1.0 if slot["health"] == "failed" else 0.0)
        if slot.get("problem"):
            problem.add_metric([pipeline.name, slot["health"], slot["problem"]], 1.0)
    running = GaugeMetricFamily(
        "cdc_connector_running", "1 when the connector and its tasks run", labels=["pipeline"]
    )
    if pipeline.connector:
        tasks = pipeline.connector.get("tasks") or []
        ok = pipeline.connector.get("state") == "RUNNING" and all(t == "RUNNING" for t in tasks)
        running.add_metric(name, 1.0 if ok else 0.0)
    capture_lag = GaugeMetricFamily(
        "cdc_capture_lag_seconds",
        "how far the capture is behind PostgreSQL (commit to Kafka, from the heartbeats); "
        "grows from one heartbeat interval after the last one when the capture stalls",
        labels=["pipeline"],
    )
    heartbeat = GaugeMetricFamily(
        "cdc_capture_heartbeat_timestamp_seconds",
        "commit time of the newest heartbeat row in Kafka",
        labels=["pipeline"],
    )
    stalled = GaugeMetricFamily(
        "cdc_capture_stalled",
        "1 while the next heartbeat is late by more than half an interval: the capture "
        "delivers nothing",
        labels=["pipeline"],
    )
    if pipeline.capture and pipeline.capture.get("lag_s") is not None:
        capture_lag.add_metric(name, float(pipeline.capture["lag_s"]))
        heartbeat.add_metric(name, pipeline.capture["heartbeat_ms"] / 1000)
        stalled.add_metric(name, 1.0 if pipeline.capture["stalled"] else 0.0)
    ends = GaugeMetricFamily(
        "cdc_topic_end_offset",
        "records in the change topic (end offsets summed)",
        labels=["topic"],
    )
    for topic, end in pipeline.topics.items():
        ends.add_metric([topic], float(end))
    backlog = GaugeMetricFamily(
        "cdc_store_backlog_events",
        "events the store has still to apply",
        labels=["pipeline", "store"],
    )
    lag = GaugeMetricFamily(
        "cdc_store_lag_seconds",
        "how far the store is behind the source: the age of its oldest change not "
        "applied, in Kafka or not yet (the capture's lag at least)",
        labels=["pipeline", "store"],
    )
    waiting = GaugeMetricFamily(
        "cdc_store_waiting",
        "1 while the store does not answer and its batch waits, uncommitted",
        labels=["pipeline", "store"],
    )
    batches = CounterMetricFamily(
        "cdc_store_batches",
        "micro-batches the store wrote, by the route each took (its own names: the "
        "warehouse's arrow, spark-decoded or spark; a row store's driver, workers or bulk)",
        labels=["pipeline", "store", "route"],
    )
    freshness = HistogramMetricFamily(
        "cdc_store_freshness_seconds",
        "commit to visible: how long after its commit each change became visible in the store",
        labels=["pipeline", "store"],
    )
    p50 = GaugeMetricFamily(
        "cdc_store_freshness_p50_seconds",
        "median commit-to-visible latency over apply.freshness_window_s",
        labels=["pipeline", "store"],
    )
    p99 = GaugeMetricFamily(
        "cdc_store_freshness_p99_seconds",
        "99th percentile commit-to-visible latency over apply.freshness_window_s",
        labels=["pipeline", "store"],
    )
    slo = GaugeMetricFamily(
        "cdc_store_freshness_slo_seconds",
        "apply.freshness_slo_s: the store's p99 (and lag) must stay under it",
        labels=["pipeline", "store"],
    )
    breached = GaugeMetricFamily(
        "cdc_store_freshness_slo_breached",
        "1 while the store's p99 over the window, or its lag, is above its SLO",
        labels=["pipeline", "store"],
    )
    for store, figures in pipeline.stores.items():
        labels = [pipeline.name, store]
        fresh = figures.get("freshness") or {}
        if fresh.get("histogram"):
            histogram = fresh["histogram"]
            freshness.add_metric(
                labels, [tuple(b) for b in histogram["buckets"]], histogram["sum_s"]
            )
        if fresh.get("p50_s") is not None:
            p50.add_metric(labels, float(fresh["p50_s"]))
            p99.add_metric(labels, float(fresh["p99_s"]))
        if fresh.get("slo_s") is not None:
            slo.add_metric(labels, float(fresh["slo_s"]))
            breached.add_metric(labels, 1.0 if fresh.get("breached") else 0.0)
        backlog.add_metric([pipeline.name, store], float(figures["backlog_events"]))
        if figures.get("lag_s") is not None:
            lag.add_metric([pipeline.name, store], float(figures["lag_s"]))
        waiting.add_metric([pipeline.name, store], 1.0 if figures.get("waiting") else 0.0)
        for route, count in (figures.get("routes") or {}).items():
            batches.add_metric([pipeline.name, store, route], float(count))
    dead = CounterMetricFamily(
        "cdc_dead_letters", "events in the dead-letter topic", labels=["pipeline"]
    )
    dead.add_metric(name, float(pipeline.dead_letters))
    late = CounterMetricFamily(
        "cdc_window_late_events",
        "events too late for a window aggregate's watermark",
        labels=["pipeline", "window"],
    )
    for window, count in pipeline.late_events.items():
        late.add_metric([pipeline.name, window], float(count))
    return [
        up,
        slot_active,
        retained,
        warn_bytes,
        safe,
        warning,
        lost,
        problem,
        running,
        capture_lag,
        heartbeat,
        stalled,
        ends,
        backlog,
        lag,
        waiting,
        batches,
        freshness,
        p50,
        p99,
        slo,
        breached,
        dead,
        late,
    ]


class StatusCollector:
    """A prometheus_client collector that looks at the stack on every scrape."""

    def __init__(self, look: Callable[[], tuple[Sequence[ComponentStatus], PipelineStatus]]):
        self.look = look

    def collect(self) -> Iterator[Any]:
        components, pipeline = self.look()
        yield from families(components, pipeline)


def serve(
    look: Callable[[], tuple[Sequence[ComponentStatus], PipelineStatus]],
    port: int,
    host: str = "127.0.0.1",
) -> Any:
    """Serve the metrics in a background thread; returns the server."""
    from prometheus_client import start_http_server
    from prometheus_client.core import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(StatusCollector(look))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
