"""Freshness (commit to visible) as the progress record keeps it: fine buckets that hold
a latency within 2 %, the Prometheus histogram, percentiles over a window that forgets,
and the SLO judged on the p99 and on the lag."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc.log.freshness import (
    BUCKETS_S,
    RATIO,
    Freshness,
    age_bucket,
    ages,
    bucket_ms,
    judge,
    quantile,
)


@given(st.floats(min_value=1.0001, max_value=1e10))
def test_a_fine_bucket_holds_its_age_within_two_percent(age_ms: float) -> None:
    upper = bucket_ms(age_bucket(age_ms))
    assert age_ms <= upper * (1 + 1e-9)
    assert upper <= age_ms * RATIO * (1 + 1e-9)


def test_latencies_are_the_age_at_the_start_plus_the_batch() -> None:
    fresh = Freshness()
    # 98 changes 200 ms old when the batch started, one 3 s old, one 20 s old;
    # the batch took 300 ms
    counted = ages([1000 - 200] * 98 + [1000 - 3000, 1000 - 20_000, None], 1000)
    assert sum(counted.values()) == 100  # a tombstone (no commit time) is not counted
    fresh.add(counted, 300, now_ms=50_000, window_s=300)
    assert fresh.count == 100
    recent = fresh.window(50_000, 300)
    assert abs(quantile(recent, 0.5) - 0.5) <= 0.5 * 0.03  # type: ignore[operator]
    assert abs(quantile(recent, 0.99) - 3.3) <= 3.3 * 0.03  # type: ignore[operator]
    buckets = dict(fresh.cumulative())
    assert buckets["0.5"] == 98 and buckets["2.0"] == 98 and buckets["5.0"] == 99
    assert buckets["30.0"] == buckets["+Inf"] == 100
    assert len(fresh.cumulative()) == len(BUCKETS_S) + 1
    assert fresh.sum_s * 1.02 >= 98 * 0.5 + 3.3 + 20.3


def test_the_window_forgets_and_the_record_survives_json() -> None:
    fresh = Freshness()
    fresh.add({age_bucket(60_000): 5}, 0, now_ms=100_000, window_s=30)
    fresh.add({age_bucket(100): 5}, 0, now_ms=200_000, window_s=30)
    again = Freshness.from_json(fresh.to_json())
    assert again == fresh
    assert sum(again.window(200_000, 30).values()) == 5  # the old batch left the window
    assert again.count == 10  # the histogram keeps everything
    assert len(again.recent) == 1
    assert Freshness.from_json({"counts": [1, 2]}) == Freshness()  # other bounds: anew


def test_the_slo_is_breached_by_the_p99_or_by_the_lag() -> None:
    fresh = Freshness()
    fresh.add({age_bucket(500): 97, age_bucket(9000): 3}, 0, now_ms=10_000, window_s=60)
    assert not judge(fresh, 0.0, 10.0, 10_000, 60).breached
    over = judge(fresh, 0.0, 5.0, 10_000, 60)
    assert over.breached and over.why is not None and "p99" in over.why
    lagging = judge(fresh, 12.0, 10.0, 10_000, 60)
    assert lagging.breached and "lag 12.0s" in (lagging.why or "")
    # a store down applies nothing: no percentile, the lag alone says it
    quiet = judge(Freshness(), 30.0, 10.0, 10_000, 60)
    assert (quiet.p99_s, quiet.breached) == (None, True)
    assert judge(Freshness(), 30.0, None, 10_000, 60).breached is False  # no SLO
