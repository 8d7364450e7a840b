"""The capture's lag behind PostgreSQL, read from the heartbeat rows in the log, and the
stores' SLOs judged on it (pure logic: cdc/capture/lag.py, judge)."""

from __future__ import annotations

from cdc.capture.lag import capture_lag
from cdc.core.topics import HeartbeatMark
from cdc.log.freshness import Freshness, judge

NOW = 1_700_000_000_000


def test_an_idle_source_whose_heartbeats_keep_coming_has_the_heartbeat_s_latency() -> None:
    for silent_s in (0.0, 5.0, 10.0, 10.4):  # the next heartbeat is due at 10 s
        mark = HeartbeatMark(
            commit_ms=int(NOW - silent_s * 1000), captured_ms=int(NOW - silent_s * 1000 + 300)
        )
        lag = capture_lag(mark, 10.0, NOW)
        assert lag.lag_s is not None and lag.lag_s <= 0.4, silent_s
        assert not lag.stalled and lag.latency_s == 0.3
        assert "behind PostgreSQL" in lag.why


def test_a_stalled_capture_s_lag_grows_from_one_interval_after_the_last_heartbeat() -> None:
    mark = HeartbeatMark(commit_ms=NOW - 40_000, captured_ms=NOW - 39_900)
    lag = capture_lag(mark, 10.0, NOW, "connector RUNNING (tasks FAILED)")
    assert lag.lag_s == 30.0 and lag.stalled and lag.heartbeat_ms == NOW - 40_000
    assert "delivered nothing since" in lag.why and "(40s;" in lag.why
    assert "connector RUNNING (tasks FAILED)" in lag.why
    later = capture_lag(mark, 10.0, NOW + 5_000)
    assert later.lag_s == 35.0  # a second a second


def test_a_heartbeat_that_came_late_is_the_capture_s_lag() -> None:
    # Debezium behind a large transaction: its heartbeat reached Kafka 25 s after commit
    mark = HeartbeatMark(commit_ms=NOW - 26_000, captured_ms=NOW - 1_000)
    lag = capture_lag(mark, 10.0, NOW)
    assert lag.lag_s == 25.0 and lag.latency_s == 25.0


def test_without_a_heartbeat_in_the_log_the_lag_is_unknown_and_said_so() -> None:
    lag = capture_lag(None, 10.0, NOW, topic="shop.cdc.heartbeat")
    assert lag.lag_s is None and not lag.stalled
    assert "shop.cdc.heartbeat" in lag.why and "`cdc setup`" in lag.why


def test_a_store_caught_up_with_the_log_breaches_its_slo_when_the_capture_stalls() -> None:
    stalled = capture_lag(HeartbeatMark(NOW - 30_000, NOW - 29_900), 1.0, NOW)
    judged = judge(Freshness(), 0.0, 5.0, NOW, 60, (stalled.lag_s, stalled.why))
    assert judged.breached and judged.why is not None
    assert judged.why.startswith("capture has delivered nothing since")
    assert "lag 29.0s is above the SLO of 5s" in judged.why
    healthy = capture_lag(HeartbeatMark(NOW - 500, NOW - 400), 1.0, NOW)
    assert not judge(Freshness(), 0.0, 5.0, NOW, 60, (healthy.lag_s, healthy.why)).breached
    assert not judge(Freshness(), 0.0, None, NOW, 60, (stalled.lag_s, stalled.why)).breached
