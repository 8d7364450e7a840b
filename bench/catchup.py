"""Catch-up: a backlog of changes, captured and then applied, stage by stage.

    .venv/bin/python bench/catchup.py [--rows 500000] [--changes 1000000]

Needs the local stack (`cdc up`). Creates a table of --rows rows, takes the initial
snapshot of it (a pipeline of its own) and applies it to every store. Then, with the
connector paused and apply stopped, makes --changes single-row updates (in
transactions of 10,000), and measures
  * capture alone: the connector resumed, until every change is in Kafka;
  * apply per store: `cdc apply --store S --once` over the backlog, until caught up
    (Spark's start excluded; each store alone, so each has both cores; the search
    index searched once a second meanwhile, as by an application reading it).
With --cluster the apply runs in the cluster profile, on a Spark standalone master with
two one-core workers started here from pyspark's `spark-class` (tests/spark_cluster.py):
the executors read, decode and write every batch, the warehouse's included.
Prints changes/s per stage, the cores each component kept busy and the CPU time the
machine spent per change, and appends them to bench/results/catchup.jsonl.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import threading
import time
from pathlib import Path

import psycopg
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CpuMark, ResourceSampler, bench_settings, cleanup, record
from cdc.apply.job import run_apply
from cdc.capture.connect_client import connect_client
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.clients import opensearch_client
from cdc.core.settings import load_settings
from cdc.core.spark import execution_profile, spark_session
from cdc.core.topics import change_topic, end_offsets
from cdc.stores.search.store import index_name
from cdc.stores.warehouse.settings import warehouse_settings

STORES = ("cache", "search", "warehouse")


def wait_for_log(settings, topic: str, total: int, timeout: float = 1800) -> float:  # type: ignore[no-untyped-def]
    """Seconds until the topic holds `total` records."""
    started = time.monotonic()
    while sum(end_offsets(settings.kafka, [topic])[topic].values()) < total:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"the log did not receive every change within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - started


class Searcher(threading.Thread):
    """A search of the store's index once a second, as an application reading it while it
    catches up would make (an index nobody searches is not refreshed by OpenSearch)."""

    def __init__(self, settings, index: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.client = opensearch_client(settings.opensearch)
        self.index = index
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.client.search(index=self.index, body={"size": 0}, ignore=[404])


def cpu_figures(stage: str, done: CpuMark, mark: CpuMark, changes: int) -> dict[str, object]:
    """The cores each component kept busy during a stage, and the machine's CPU time
    per change (µs): whether the stage was bound by the CPU, and whose."""
    cores = done.cores_since(mark)
    busy = cores["machine (all processes)"] * (done.at - mark.at)
    return {f"{stage}_cores": cores, f"{stage}_cpu_us_per_change": round(busy / changes * 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--change", help="what this run measures (recorded with it)")
    parser.add_argument(
        "--cluster", action="store_true", help="apply on a standalone master with two workers"
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, stack)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    # the apply job's per-batch figures (what each store wrote, the warehouse's MERGEs)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("cdc").setLevel(logging.INFO)
    stores = args.stores.split(",")
    settings = load_settings()
    bench = bench_settings(settings, [])
    table = f"public.{bench.pipeline.name}"
    bench = bench.model_copy(
        update={"pipeline": bench.pipeline.model_copy(update={"tables": [table]})}
    )
    if args.cluster:
        from tests.spark_cluster import spark_cluster

        cluster = stack.enter_context(spark_cluster(settings.java_home))
        conf = json.loads(cluster.conf()["CDC_SPARK__CONF"])
        spark = bench.spark.model_copy(update={"master": cluster.url, "conf": conf})
        bench = bench.model_copy(update={"spark": spark})
    topic = change_topic(bench.pipeline, table)
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, version int NOT NULL, "
            "amount numeric(12, 2) NOT NULL, note text, updated_at timestamptz DEFAULT now())"
        )
        conn.execute(
            f"INSERT INTO {table} (id, version, amount, note) SELECT g, 0, g * 0.01, "
            f"md5(g::text) FROM generate_series(1, {args.rows}) g"
        )
    figures: dict[str, object] = {
        **({"change": args.change} if args.change else {}),
        "benchmark": "catchup",
        "profile": execution_profile(bench)[0],
        "rows": args.rows,
        "changes": args.changes,
    }
    try:
        print(f"snapshot of {args.rows} rows, applied to {', '.join(stores)} ...", flush=True)
        run_snapshot(bench, Console(file=io.StringIO()))
        spark_session(bench, f"bench-catchup-{bench.pipeline.name}")
        for store in stores:
            started = time.monotonic()
            run_apply(bench, [store], once=True)
            figures[f"snapshot_{store}_rows_per_s"] = round(
                args.rows / (time.monotonic() - started)
            )
        client = connect_client(settings)
        client.pause(bench.pipeline.connector)
        time.sleep(2)
        print(f"{args.changes} changes with capture paused ...", flush=True)
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            done = 0
            while done < args.changes:
                n = min(10_000, args.changes - done)
                first = done % args.rows + 1
                last = min(first + n - 1, args.rows)
                conn.execute(
                    f"UPDATE {table} SET version = version + 1, amount = amount + 1, "
                    f"updated_at = now() WHERE id BETWEEN {first} AND {last}"
                )
                done += last - first + 1
        figures["source_changes_per_s"] = round(args.changes / (time.monotonic() - started))
        before = sum(end_offsets(settings.kafka, [topic])[topic].values())
        print("capture alone ...", flush=True)
        with ResourceSampler() as resources:
            mark = resources.cpu()
            client.resume(bench.pipeline.connector)
            capture_s = wait_for_log(settings, topic, before + args.changes)
            figures |= {
                "capture_s": round(capture_s, 1),
                "capture_changes_per_s": round(args.changes / capture_s),
            } | cpu_figures("capture", resources.cpu(), mark, args.changes)
            for store in stores:
                print(f"applying {args.changes} changes to {store} ...", flush=True)
                searcher = None
                if store == "search":
                    searcher = Searcher(settings, index_name(bench.pipeline.topic_prefix, table))
                    searcher.start()
                mark = resources.cpu()
                run_apply(bench, [store], once=True)
                done = resources.cpu()
                if searcher is not None:
                    searcher.done.set()
                seconds = done.at - mark.at
                figures[f"{store}_s"] = round(seconds, 1)
                figures[f"{store}_changes_per_s"] = round(args.changes / seconds)
                figures |= cpu_figures(store, done, mark, args.changes)
    finally:
        cleanup(bench)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    slowest = min(int(figures[f"{s}_changes_per_s"]) for s in stores)  # type: ignore[call-overload]
    figures |= {
        "slowest_store_changes_per_s": slowest,
        "apply_keeps_up_with_capture": slowest >= int(figures["capture_changes_per_s"]),  # type: ignore[call-overload]
        "max_offsets_per_trigger": bench.apply.max_offsets_per_trigger,
        "warehouse_max_offsets_per_trigger": warehouse_settings(bench).max_offsets_per_trigger,
        "partitions": bench.pipeline.partitions,
    }
    record(figures, "catchup", settings)


if __name__ == "__main__":
    main()
