"""The streaming benchmark's arithmetic: when an event became visible in a store,
percentiles, whether lag stayed bounded, and the cores each component kept busy."""

from __future__ import annotations

from bench.common import CpuMark
from bench.streaming import bounded, percentiles, store_latencies


def test_an_event_is_visible_when_the_first_batch_reaching_its_offset_finished() -> None:
    events = [("t", 0, 5, 1_000, 1_100), ("t", 0, 6, 1_200, 1_300), ("t", 1, 2, 1_500, 1_600)]
    batches = [(2_000, {"t:0": 5}), (2_600, {"t:0": 9, "t:1": 1}), (3_000, {"t:1": 2})]
    assert store_latencies(events, batches) == [(1_000, 1_000), (1_200, 1_400), (1_500, 1_500)]
    # an event no batch reached is not counted as visible
    assert store_latencies([("t", 2, 0, 1_000, 1_000)], batches) == []


def test_percentiles_in_seconds() -> None:
    figures = percentiles([float(ms) for ms in range(1, 1001)])
    assert figures == {"p50_s": 0.501, "p95_s": 0.951, "p99_s": 0.991, "max_s": 1.0}


def test_lag_is_bounded_unless_the_last_third_is_much_slower_than_the_first() -> None:
    steady = [(t, 500 + t % 100) for t in range(300)]
    growing = [(t, 500 + 50 * t) for t in range(300)]
    assert bounded(steady)
    assert not bounded(growing)


def test_cores_busy_are_cpu_seconds_over_wall_seconds_per_component() -> None:
    before = CpuMark(100.0, {"spark": 10.0, "kafka": 2.0}, 50.0)
    after = CpuMark(110.0, {"spark": 25.0, "kafka": 3.0, "pgbench": 1.0}, 69.0)
    assert after.cores_since(before) == {
        "kafka": 0.1,
        "pgbench": 0.1,
        "spark": 1.5,
        "machine (all processes)": 1.9,
    }
