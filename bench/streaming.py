"""Streaming: pgbench at fixed rates with the whole pipeline running; end-to-end latency
per store, whether lag stays bounded, the peak memory of each component and the cores
each kept busy.

    .venv/bin/python bench/streaming.py [--rates 500,1000] [--seconds 60] [--scale 4]
                                        [--stores cache,search,warehouse]

Needs the local stack (`cdc up`). Loads pgbench (TPC-B-like; pgbench_history gets a
primary key, since the pipeline refuses tables without one) into the stack's database,
takes the initial snapshot of its four tables, runs `cdc apply` for every store
in this process and waits until the stores hold the snapshot. Then for each rate:
pgbench -R RATE -T SECONDS, after which it waits until every store has caught up.

Latency of an event = the moment the store's micro-batch that holds it finished
(the store's progress record, polled every 50 ms; a missed record only makes a
later, larger figure) minus the event's commit time in PostgreSQL. Capture latency =
the Kafka record's timestamp minus the commit time. Lag is bounded when the p95 of
the last third of the run is not above twice that of the first third (plus 1 s).
Appends the figures to bench/results/streaming.jsonl.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from kafka import KafkaConsumer, TopicPartition
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ResourceSampler, bench_settings, cleanup, record
from bench.snapshot_throughput import pgbench_init, psql_args, psql_env
from cdc.apply.job import run_apply
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.status import pipeline_status
from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings, load_settings
from cdc.core.topics import change_topic, end_offsets
from cdc.log.progress import read_progress
from cdc.stack.components.postgres import postgres_bin_dir

TABLES = [f"public.pgbench_{t}" for t in ("accounts", "branches", "tellers", "history")]
STORES = ("cache", "search", "warehouse")


def load(settings: Settings, scale: int) -> None:
    pgbench_init(settings, scale)
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE pgbench_history ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY "
            "PRIMARY KEY"
        )


def wait_caught_up(settings: Settings, timeout: float, stores: tuple[str, ...] = STORES) -> float:
    """Seconds until every store's backlog is zero."""
    started = time.monotonic()
    while True:
        status = pipeline_status(settings).stores
        if status and all(status.get(s, {}).get("backlog_events") == 0 for s in stores):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the stores did not catch up within {timeout:.0f} s: {status}")
        time.sleep(0.5)


class BatchLog:
    """Each store's micro-batches as they finish: (finished at ms, applied offsets)."""

    def __init__(self, settings: Settings, stores: tuple[str, ...]) -> None:
        self.settings = settings
        self.batches: dict[str, list[tuple[int, dict[str, int]]]] = {s: [] for s in stores}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BatchLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seen: dict[str, Any] = {}
        while not self._stop.wait(0.05):
            for store in self.batches:
                progress = read_progress(self.settings, store)
                if progress and progress.batch != seen.get(store):
                    seen[store] = progress.batch
                    self.batches[store].append((progress.applied_ms, progress.applied))


def read_events(
    settings: Settings, start: dict[str, dict[int, int]], end: dict[str, dict[int, int]]
) -> list[tuple[str, int, int, int, int]]:
    """(topic, partition, offset, commit_ms, kafka timestamp ms) of each change event
    between start and end (tombstones left out: no commit time)."""
    import json

    consumer = KafkaConsumer(
        **kafka_client_kwargs(settings.kafka),
        enable_auto_commit=False,
        max_poll_records=20000,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    events = []
    try:
        wanted = {
            TopicPartition(t, p): (start[t].get(p, 0), end_offset)
            for t, parts in end.items()
            for p, end_offset in parts.items()
            if end_offset > start[t].get(p, 0)
        }
        consumer.assign(list(wanted))
        for tp, (first, _) in wanted.items():
            consumer.seek(tp, first)
        deadline = time.monotonic() + 600
        while any(consumer.position(tp) < last for tp, (_, last) in wanted.items()):
            if time.monotonic() > deadline:
                raise SystemExit("could not read the run's events within 10 minutes")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                for r in batch:
                    if r.offset >= wanted[tp][1] or r.value is None:
                        continue
                    source = json.loads(r.value).get("source", {})
                    events.append((tp.topic, tp.partition, r.offset, source["ts_ms"], r.timestamp))
    finally:
        consumer.close()
    return events


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] / 1000, 3)

    return {"p50_s": at(0.50), "p95_s": at(0.95), "p99_s": at(0.99), "max_s": at(1.0)}


def store_latencies(
    events: list[tuple[str, int, int, int, int]], batches: list[tuple[int, dict[str, int]]]
) -> list[tuple[int, int]]:
    """(commit_ms, latency ms) per event: the first batch whose applied offset reaches it."""
    out = []
    for topic, partition, offset, commit_ms, _ in events:
        where = f"{topic}:{partition}"
        done = next((at for at, applied in batches if applied.get(where, -1) >= offset), None)
        if done is not None:
            out.append((commit_ms, done - commit_ms))
    return out


def bounded(latencies: list[tuple[int, int]]) -> bool:
    ordered = [ms for _, ms in sorted(latencies)]
    third = len(ordered) // 3
    if third == 0:
        return True
    first = sorted(ordered[:third])[int(0.95 * third)]
    last = sorted(ordered[-third:])[int(0.95 * third)]
    return last <= 2 * first + 1000


def run_rate(
    bench: Settings,
    rate: int,
    seconds: int,
    clients: int,
    resources: ResourceSampler,
    stores: tuple[str, ...],
) -> dict[str, object]:
    topics = [change_topic(bench.pipeline, t) for t in TABLES]
    start = end_offsets(bench.kafka, topics)
    bin_dir = postgres_bin_dir()
    assert bin_dir is not None
    with BatchLog(bench, stores) as log:
        before = resources.cpu()
        result = subprocess.run(
            [
                str(bin_dir / "pgbench"),
                "-n",
                "-c",
                str(clients),
                "-j",
                "2",
                "-R",
                str(rate),
                "-T",
                str(seconds),
                *psql_args(bench),
            ],
            check=True,
            env=psql_env(bench),
            capture_output=True,
            text=True,
        )
        cores = resources.cpu().cores_since(before)
        drain_s = wait_caught_up(bench, 900, stores)
        time.sleep(0.2)
    tps = re.search(r"tps = ([\d.]+)", result.stdout)
    end = end_offsets(bench.kafka, topics)
    events = read_events(bench, start, end)
    figures: dict[str, object] = {
        "target_tps": rate,
        "achieved_tps": round(float(tps.group(1)), 1) if tps else None,
        "events": len(events),
        "caught_up_s_after_load": round(drain_s, 1),
        "capture": percentiles([float(ts - commit) for _, _, _, commit, ts in events]),
        "cores_busy_during_load": cores,
    }
    for store in stores:
        latencies = store_latencies(events, log.batches[store])
        figures[store] = percentiles([float(ms) for _, ms in latencies]) | {
            "lag_bounded": bounded(latencies),
            "batches": len(log.batches[store]),
        }
    print(f"{rate} TPS: {figures}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,1000", help="transactions per second")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--stores",
        default=",".join(STORES),
        help="the stores to apply to (fewer: what the others cost the ones left)",
    )
    parser.add_argument("--change", help="what this run measures (recorded with it)")
    args = parser.parse_args()
    stores = tuple(s for s in STORES if s in args.stores.split(","))
    source = load_settings()
    print(f"loading pgbench at scale {args.scale} ...", flush=True)
    load(source, args.scale)
    bench = bench_settings(source, TABLES)
    stop = threading.Event()
    figures: dict[str, object] = {
        **({"change": args.change} if args.change else {}),
        "benchmark": "streaming",
        "scale": args.scale,
        "seconds": args.seconds,
        "clients": args.clients,
        "stores": list(stores),
    }
    runs = []
    try:
        run_snapshot(bench, Console(file=io.StringIO()))
        with ResourceSampler() as resources:
            apply = threading.Thread(
                target=run_apply,
                args=(bench, list(stores)),
                kwargs={"stop": stop},
                daemon=True,
            )
            apply.start()
            print("applying the snapshot to every store ...", flush=True)
            wait_caught_up(bench, 1800, stores)
            for rate in (int(r) for r in args.rates.split(",")):
                runs.append(run_rate(bench, rate, args.seconds, args.clients, resources, stores))
            stop.set()
            apply.join(timeout=120)
        figures |= {"runs": runs, "peak_memory_mib": resources.peak_mib}
    finally:
        stop.set()
        cleanup(bench)
    figures |= {
        "trigger_interval_s": bench.apply.trigger_interval_s,
        "partitions": bench.pipeline.partitions,
        "spark_master": bench.spark.master,
    }
    record(figures, "streaming", source)


if __name__ == "__main__":
    main()
