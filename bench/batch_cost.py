"""What one micro-batch of the apply job costs, phase by phase, idle and under a small load.

    .venv/bin/python bench/batch_cost.py [--stores cache,search] [--rate 200] [--seconds 40]
                                         [--generated] [--iceberg]

Needs the local stack (`cdc up`). Takes the snapshot of a 1,000-row table of its own,
runs `cdc apply` for the stores in this process, and times each phase of every
micro-batch the driver runs (the functions of cdc/apply/batch.py it calls, wrapped
with a clock: the source's catalog, the schema-change check, the progress record, the
log's end offsets, and the rest of the batch, which is Spark's job and the store's
writes), with the Spark jobs each batch ran. First idle for --seconds (no change at
all: what a pipeline costs at rest), then with --rate single-row updates per second.
Prints per store and phase the mean wall time per batch, and the cores each component
kept busy; appends the figures to bench/results/batch_cost.jsonl. With --generated the
table has a stored generated column, which change events lack: `with_generated` is then
the cost of computing it in PostgreSQL (cdc/log/generated_columns.py), batch by batch.
With --iceberg the warehouse's tables are also published as Iceberg tables
(apply.iceberg): the figures add each publication's wall and CPU time (a thread of the
warehouse's process, beside its batches) and the Iceberg snapshots committed.
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cdc.apply.batch as batch_module
import cdc.apply.job as apply
from bench.common import ResourceSampler, bench_settings, cleanup, record, trigger_durations
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import views_session
from cdc.stores.warehouse.settings import with_warehouse

TABLE = "public.batch_cost"
ROWS = 1000
# the driver-side functions one micro-batch calls (cdc/apply/batch.py's names)
PHASES = ("with_generated", "read_progress", "write_progress")


class Clock:
    """Wall time per (store, phase), summed, and the batches each store ran."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.batches: dict[str, int] = defaultdict(int)
        self.jobs: dict[str, int] = defaultdict(int)
        self.local = threading.local()
        self.lock = threading.Lock()

    def add(self, phase: str, seconds: float) -> None:
        store = getattr(self.local, "store", None)
        if store is not None:
            with self.lock:
                self.seconds[(store, phase)] += seconds

    def wrap(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - started)

        return timed

    def reset(self) -> None:
        with self.lock:
            self.seconds.clear()
            self.batches.clear()
            self.jobs.clear()

    def figures(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for store, batches in sorted(self.batches.items()):
            phases = {
                phase: round(seconds / batches, 3)
                for (name, phase), seconds in sorted(self.seconds.items())
                if name == store
            }
            out[store] = {
                "batches": batches,
                "spark_jobs_per_batch": round(self.jobs[store] / batches, 2),
                "mean_s_per_batch": phases,
            }
        return out


def instrument(clock: Clock) -> None:
    """Wrap the apply job's driver-side calls with the clock (before it starts)."""
    for phase in PHASES:
        setattr(batch_module, phase, clock.wrap(phase, getattr(batch_module, phase)))
    # the catalog, the WAL position, the rewrites and the generation, read at once
    view = batch_module.SourceView
    view.read_batch = clock.wrap("read_source", view.read_batch)  # type: ignore[method-assign]
    ends = batch_module.EndOffsets.check_not_rewound
    batch_module.EndOffsets.check_not_rewound = clock.wrap("log end offsets", ends)  # type: ignore[method-assign]
    make_writer = batch_module.BatchWriter

    def batch_writer(
        settings: Settings, store: Any, *args: Any, **kwargs: Any
    ) -> Callable[[Any, int], None]:
        write = make_writer(settings, store, *args, **kwargs)

        def timed(batch: Any, batch_id: int) -> None:
            clock.local.store = store.name
            tracker = batch.sparkSession.sparkContext.statusTracker()
            group = f"bench-{store.name}-{batch_id}"
            batch.sparkSession.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            try:
                write(batch, batch_id)
            finally:
                clock.add("whole batch", time.perf_counter() - started)
                with clock.lock:
                    clock.batches[store.name] += 1
                    clock.jobs[store.name] += len(tracker.getJobIdsForGroup(group))

        return timed

    apply.BatchWriter = batch_writer  # type: ignore[assignment,misc]


class Publications:
    """The Iceberg publisher's commits (apply.iceberg): how many, their wall and CPU time."""

    def __init__(self) -> None:
        self.count, self.wall, self.cpu = 0, 0.0, 0.0
        self.lock = threading.Lock()

    def instrument(self) -> None:
        from cdc.stores.warehouse.publish.iceberg import IcebergPublisher

        publish = IcebergPublisher.publish

        def timed(publisher: IcebergPublisher, path: str) -> bool:
            wall, cpu = time.perf_counter(), time.thread_time()
            published = publish(publisher, path)
            if published:
                with self.lock:
                    self.count += 1
                    self.wall += time.perf_counter() - wall
                    self.cpu += time.thread_time() - cpu
            return published

        IcebergPublisher.publish = timed  # type: ignore[method-assign]

    def figures(self, seconds: float) -> dict[str, float]:
        with self.lock:
            count = max(self.count, 1)
            figures = {
                "snapshots": self.count,
                "mean_s_per_snapshot": round(self.wall / count, 3),
                "cpu_s_per_snapshot": round(self.cpu / count, 3),
                "cores": round(self.cpu / seconds, 3),
            }
            self.count, self.wall, self.cpu = 0, 0.0, 0.0
        return figures


def spark_durations(settings: Settings, since: float) -> dict[str, dict[str, float]]:
    """Spark's own breakdown of each of the apply job's queries since `since`."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()  # the apply job's, running in its thread
    prefix = f"cdc-{settings.pipeline.name}-"
    return {
        query.name.removeprefix(prefix): trigger_durations(query, since)
        # the stores' queries, and the views' in their own session (cdc.core.spark.views_session)
        for query in [*spark.streams.active, *views_session(spark, settings).streams.active]
        if (query.name or "").startswith(prefix)
    }


def load(settings: Settings, generated: bool = False) -> None:
    extra = ", twice bigint GENERATED ALWAYS AS (v * 2) STORED" if generated else ""
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v bigint NOT NULL, note text{extra})"
        )
        conn.execute(
            f"INSERT INTO {TABLE} SELECT i, 0, 'row ' || i FROM generate_series(1, {ROWS}) i"
        )


def update(settings: Settings, rate: int, seconds: float) -> int:
    """`rate` single-row updates per second (one transaction each) for `seconds`."""
    done, started = 0, time.monotonic()
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        while (elapsed := time.monotonic() - started) < seconds:
            for _ in range(int(elapsed * rate) - done):
                conn.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE id = %s", (done % ROWS + 1,))
                done += 1
            time.sleep(0.005)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="cache,search")
    parser.add_argument("--rate", type=int, default=200, help="updates per second")
    parser.add_argument("--seconds", type=int, default=40, help="of each phase")
    parser.add_argument(
        "--generated", action="store_true", help="the table has a stored generated column"
    )
    parser.add_argument(
        "--iceberg", action="store_true", help="also publish the warehouse as Iceberg tables"
    )
    args = parser.parse_args()
    stores = [s for s in args.stores.split(",") if s]
    source = load_settings()
    load(source, args.generated)
    bench = bench_settings(source, [TABLE])
    if args.iceberg:
        bench = with_warehouse(bench, iceberg=True)
    clock = Clock()
    instrument(clock)
    publications = Publications()
    publications.instrument()
    stop = threading.Event()
    runs: dict[str, object] = {}
    try:
        run_snapshot(bench, Console(file=io.StringIO()))
        with ResourceSampler() as resources:
            job = threading.Thread(
                target=apply.run_apply, args=(bench, stores), kwargs={"stop": stop}, daemon=True
            )
            job.start()
            while not all(clock.batches.get(s) for s in stores):  # the snapshot applied
                time.sleep(0.5)
            time.sleep(5)
            for phase, rate in (("idle", 0), (f"{args.rate} updates/s", args.rate)):
                clock.reset()
                before, since = resources.cpu(), time.time()
                if rate:
                    started = time.thread_time()
                    update(bench, rate, args.seconds)
                    resources.exclude(time.thread_time() - started)
                else:
                    time.sleep(args.seconds)
                cores = resources.cpu().cores_since(before)
                runs[phase] = {
                    "stores": clock.figures(),
                    "spark_ms_per_trigger": spark_durations(bench, since),
                    "cores": cores,
                }
                if args.iceberg:
                    runs[phase]["iceberg"] = publications.figures(time.time() - since)
                print(f"{phase}: {runs[phase]}", flush=True)
            stop.set()
            job.join(timeout=120)
    finally:
        stop.set()
        cleanup(bench)
    record(
        {
            "benchmark": "batch_cost",
            "stores": stores,
            "seconds": args.seconds,
            "generated": args.generated,
            "iceberg": args.iceberg,
            "trigger_interval_s": bench.apply.trigger_interval_s,
            "runs": runs,
        },
        "batch_cost",
        source,
    )


if __name__ == "__main__":
    main()
