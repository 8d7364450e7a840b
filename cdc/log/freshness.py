"""Freshness: how long after its commit a change became visible in a store (contract
point 15), kept in the store's progress record after every micro-batch.

A batch's writer counts its changes by their age at the batch's start (`started_ms`
minus the commit time; snapshot and backfill reads are not changes), in fine buckets
`RATIO` wide (`age_bucket`). When the batch has been written, a bucket's age plus the
batch's duration is the commit-to-visible latency of its changes (within 1 %; a
percentile is a fine bucket's upper bound, within 3 %). The record keeps a Prometheus
histogram of them since the store began (cumulative counts over `BUCKETS_S`, their sum
and count), and the fine buckets of the last `window_s` in slots of `SLOT_MS`, which
give the p50 and p99 `cdc status` shows and judges against the store's SLO.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUCKETS_S",
    "Freshness",
    "Judgement",
    "add_freshness",
    "age_bucket",
    "judge",
]

RATIO = 1.02  # fine buckets: a latency is known within 2 %
_LOG_RATIO = math.log(RATIO)
SLOT_MS = 10_000  # the recent window is kept in slots of this many ms
# the Prometheus histogram's upper bounds, in seconds (+Inf after them)
BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def age_bucket(age_ms: float) -> int:
    """The fine bucket of an age (or latency) in ms: bucket q holds (RATIO**q, RATIO**(q+1)]
    (q 0 also holds everything up to 1 ms)."""
    if age_ms <= 1:
        return 0
    return max(math.ceil(math.log(age_ms) / _LOG_RATIO) - 1, 0)


def bucket_ms(bucket: int) -> float:
    """The upper bound of a fine bucket, in ms."""
    return float(RATIO ** (bucket + 1))


@dataclass
class Freshness:
    """A store's commit-to-visible latencies, as its progress record keeps them."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0
    count: int = 0
    recent: list[list[Any]] = field(default_factory=list)  # [slot start ms, {bucket: n}]

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Freshness:
        if not data:
            return cls()
        counts = [int(n) for n in data.get("counts", [])]
        if len(counts) != len(BUCKETS_S) + 1:  # written with other bounds: start again
            return cls()
        recent = [
            [int(slot), {int(b): int(n) for b, n in buckets.items()}]
            for slot, buckets in data.get("recent", [])
        ]
        return cls(counts, float(data.get("sum_s", 0.0)), int(data.get("count", 0)), recent)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "sum_s": self.sum_s,
            "count": self.count,
            "recent": [
                [slot, {str(b): n for b, n in buckets.items()}] for slot, buckets in self.recent
            ],
        }

    def add(
        self, ages: Mapping[int, int], duration_ms: float, now_ms: float, window_s: float
    ) -> None:
        """Add a batch's events, counted by their age at its start (`ages`: fine bucket ->
        events), written `duration_ms` later, at `now_ms`; forget the slots older than
        `window_s`."""
        slot = int(now_ms // SLOT_MS * SLOT_MS)
        if not self.recent or self.recent[-1][0] != slot:
            self.recent.append([slot, {}])
        fine: dict[int, int] = self.recent[-1][1]
        for bucket, n in ages.items():
            if n <= 0:
                continue
            # the bucket's geometric middle: its events' age within 1 %
            latency_ms = bucket_ms(bucket) / math.sqrt(RATIO) + max(duration_ms, 0.0)
            seconds = latency_ms / 1000
            self.counts[_prometheus_bucket(seconds)] += n
            self.sum_s += seconds * n
            self.count += n
            at = age_bucket(latency_ms)
            fine[at] = fine.get(at, 0) + n
        horizon = now_ms - window_s * 1000 - SLOT_MS
        self.recent = [entry for entry in self.recent if entry[0] >= horizon]

    def window(self, now_ms: float, window_s: float) -> dict[int, int]:
        """The fine buckets of the events made visible in the last `window_s`."""
        merged: dict[int, int] = {}
        for slot, buckets in self.recent:
            if slot + SLOT_MS > now_ms - window_s * 1000:
                for bucket, n in buckets.items():
                    merged[bucket] = merged.get(bucket, 0) + n
        return merged

    def cumulative(self) -> list[tuple[str, float]]:
        """The Prometheus buckets: (upper bound, events at or below it), +Inf last."""
        out, total = [], 0
        for bound, n in zip([*map(str, BUCKETS_S), "+Inf"], self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


def _prometheus_bucket(seconds: float) -> int:
    for i, bound in enumerate(BUCKETS_S):
        if seconds <= bound:
            return i
    return len(BUCKETS_S)


def quantile(buckets: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of fine buckets, in seconds (a bucket's upper bound); None
    when there is none."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= rank:
            return bucket_ms(bucket) / 1000
    return bucket_ms(max(buckets)) / 1000


@dataclass(frozen=True)
class Judgement:
    """A store's freshness over the last window, against its SLO."""

    p50_s: float | None
    p99_s: float | None
    events: int  # made visible in the window
    slo_s: float | None  # None: no SLO for this store
    breached: bool
    why: str | None  # what breaches it

    def to_json(self) -> dict[str, Any]:
        return {
            "p50_s": self.p50_s,
            "p99_s": self.p99_s,
            "events": self.events,
            "slo_s": self.slo_s,
            "breached": self.breached,
            "why": self.why,
        }


def judge(
    freshness: Freshness,
    lag_s: float | None,
    slo_s: float | None,
    now_ms: float,
    window_s: float,
    capture: tuple[float | None, str] | None = None,
) -> Judgement:
    """The p50 and p99 of the last `window_s`, and whether they, or the store's lag now
    (the changes it has not applied yet: a store that is down applies none, a capture
    that stalls delivers none), exceed `slo_s`. `capture`: the capture's lag and what
    it is made of (cdc/capture/lag.py), named first when it alone exceeds the
    SLO: every store is that far behind PostgreSQL."""
    recent = freshness.window(now_ms, window_s)
    p50, p99 = quantile(recent, 0.5), quantile(recent, 0.99)
    why = None
    captured_lag, captured_why = capture or (None, "")
    if slo_s is not None:
        if captured_lag is not None and captured_lag > slo_s:
            why = f"{captured_why}: lag {captured_lag:.1f}s is above the SLO of {slo_s:g}s"
        elif p99 is not None and p99 > slo_s:
            why = f"p99 {p99:.1f}s over the last {window_s:.0f}s is above the SLO of {slo_s:g}s"
        elif lag_s is not None and lag_s > slo_s:
            why = f"lag {lag_s:.1f}s is above the SLO of {slo_s:g}s"
    return Judgement(
        p50_s=None if p50 is None else round(p50, 3),
        p99_s=None if p99 is None else round(p99, 3),
        events=sum(recent.values()),
        slo_s=slo_s,
        breached=why is not None,
        why=why,
    )


def ages(commits: Iterable[int | None], started_ms: int) -> dict[int, int]:
    """Events' commit times counted by their fine age bucket at `started_ms`."""
    out: dict[int, int] = {}
    for commit_ms in commits:
        if commit_ms is not None:
            bucket = age_bucket(started_ms - commit_ms)
            out[bucket] = out.get(bucket, 0) + 1
    return out


def add_freshness(
    record: Mapping[str, Any] | None,
    ages: Mapping[int, int],
    duration_ms: float,
    now_ms: float,
    window_s: float,
) -> dict[str, Any]:
    """A progress record's freshness (`record`, as written) with a batch's events added
    (Freshness.add), as it is written again."""
    freshness = Freshness.from_json(record)
    freshness.add(ages, duration_ms, now_ms, window_s)
    return freshness.to_json()
