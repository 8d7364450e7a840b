"""The Prometheus endpoint shows what `cdc status` shows."""

from __future__ import annotations

import urllib.request

from cdc.check.status import PipelineStatus
from cdc.cli.metrics import serve
from cdc.stack.components.base import ComponentStatus
from tests.helpers import free_ports


def look() -> tuple[list[ComponentStatus], PipelineStatus]:
    components = [
        ComponentStatus("kafka", True, "127.0.0.1:9092", True),
        ComponentStatus("redis", False, "127.0.0.1:6379", True),
    ]
    pipeline = PipelineStatus(
        "cdc",
        "done",
        "0/1",
        {"active": True, "wal_retained_bytes": 4096},
        {"state": "RUNNING", "tasks": ["FAILED"]},
        capture={
            "lag_s": 31.5,
            "heartbeat_ms": 1_700_000_000_000,
            "latency_s": 0.2,
            "interval_s": 10.0,
            "stalled": True,
            "why": "capture has delivered nothing since ...",
        },
        topics={"cdc.public.customers": 5004},
        stores={
            "cache": {
                "backlog_events": 3,
                "lag_s": 1.5,
                "waiting": {"reason": "Redis at 127.0.0.1:6379 does not answer", "since_ms": 1},
                "freshness": {
                    "p50_s": 0.8,
                    "p99_s": 1.9,
                    "slo_s": 5.0,
                    "breached": True,
                    "histogram": {
                        "buckets": [["0.5", 3.0], ["1.0", 10.0], ["2.0", 12.0], ["+Inf", 12.0]],
                        "sum_s": 9.5,
                        "count": 12,
                    },
                },
            },
            "warehouse": {"backlog_events": 0, "lag_s": None, "routes": {"arrow": 7, "spark": 1}},
        },
        dead_letters=2,
        late_events={"orders_per_minute": 7},
    )
    return components, pipeline


def test_the_endpoint_serves_the_status_figures() -> None:
    (port,) = free_ports(1)
    server = serve(look, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.shutdown()
    lines = set(text.splitlines())
    assert 'cdc_component_up{component="kafka"} 1.0' in lines
    assert 'cdc_component_up{component="redis"} 0.0' in lines
    assert 'cdc_capture_lag_seconds{pipeline="cdc"} 31.5' in lines
    assert 'cdc_capture_stalled{pipeline="cdc"} 1.0' in lines
    assert 'cdc_capture_heartbeat_timestamp_seconds{pipeline="cdc"} 1.7e+09' in lines
    assert 'cdc_slot_wal_retained_bytes{pipeline="cdc"} 4096.0' in lines
    assert 'cdc_connector_running{pipeline="cdc"} 0.0' in lines  # a task failed
    assert 'cdc_topic_end_offset{topic="cdc.public.customers"} 5004.0' in lines
    assert 'cdc_store_backlog_events{pipeline="cdc",store="cache"} 3.0' in lines
    assert 'cdc_store_waiting{pipeline="cdc",store="cache"} 1.0' in lines
    assert 'cdc_store_waiting{pipeline="cdc",store="warehouse"} 0.0' in lines
    # the batches by the route each took (cdc/stores/warehouse/write/routes.py)
    assert 'cdc_store_batches_total{pipeline="cdc",route="arrow",store="warehouse"} 7.0' in lines
    assert 'cdc_store_batches_total{pipeline="cdc",route="spark",store="warehouse"} 1.0' in lines
    assert 'cdc_store_lag_seconds{pipeline="cdc",store="cache"} 1.5' in lines
    assert not any(
        line.startswith('cdc_store_lag_seconds{pipeline="cdc",store="warehouse"') for line in lines
    )
    assert 'cdc_dead_letters_total{pipeline="cdc"} 2.0' in lines
    histogram = 'cdc_store_freshness_seconds_bucket{le="1.0",pipeline="cdc",store="cache"} 10.0'
    assert histogram in lines
    assert 'cdc_store_freshness_seconds_count{pipeline="cdc",store="cache"} 12.0' in lines
    assert 'cdc_store_freshness_seconds_sum{pipeline="cdc",store="cache"} 9.5' in lines
    assert 'cdc_store_freshness_p99_seconds{pipeline="cdc",store="cache"} 1.9' in lines
    assert 'cdc_store_freshness_slo_seconds{pipeline="cdc",store="cache"} 5.0' in lines
    assert 'cdc_store_freshness_slo_breached{pipeline="cdc",store="cache"} 1.0' in lines
    assert 'cdc_window_late_events_total{pipeline="cdc",window="orders_per_minute"} 7.0' in lines
