"""Apply throughput per store: a backlog in the change topics, applied store by store.

    .venv/bin/python bench/apply_throughput.py [--rows 200000] [--updates 100000]

Needs the local stack (`cdc up`). Creates a table of --rows rows, takes the pipeline's
initial snapshot of it (a pipeline of its own), makes --updates single-row updates in
large transactions, waits until the log holds every event, then runs the apply job
once (`--once`, all micro-batches until caught up) for each store alone, and reports
events per second from the first micro-batch to the last (Spark's start excluded).
Appends the figures with the machine's description to bench/results/apply.jsonl.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import uuid
from pathlib import Path

import psycopg
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.snapshot_throughput import record
from cdc.pipeline import drop_pipeline
from cdc.settings import PipelineSettings, load_settings
from cdc.spark import spark_session
from cdc.topics import end_offsets
from materializers.apply import run_apply
from snapshot.initial import run_snapshot

RESULTS = Path(__file__).parent / "results" / "apply.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--stores", default="cache,search,warehouse")
    args = parser.parse_args()
    settings = load_settings()
    name = "bench" + uuid.uuid4().hex[:6]
    table = f"public.{name}"
    bench = settings.model_copy(
        update={"pipeline": PipelineSettings(name=name, topic_prefix=name, tables=[table])}
    )
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
        "benchmark": "apply",
        "rows": args.rows,
        "updates": args.updates,
    }
    try:
        print(f"snapshot of {args.rows} rows ...", flush=True)
        run_snapshot(bench, Console(file=io.StringIO()))
        print(f"{args.updates} updates ...", flush=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for first in range(1, args.updates + 1, 10_000):
                last = min(first + 9_999, args.updates)
                conn.execute(
                    f"UPDATE {table} SET version = version + 1, amount = amount + 1 "
                    f"WHERE id BETWEEN {first} AND {last}"
                )
        events = args.rows + args.updates
        topic = bench.pipeline.topic(table)
        deadline = time.monotonic() + 600
        while sum(end_offsets(settings.kafka.bootstrap_servers, [topic])[topic].values()) < events:
            if time.monotonic() > deadline:
                raise SystemExit("the log did not receive every update within 10 minutes")
            time.sleep(1)
        spark_session(bench, f"bench-apply-{name}")  # started before the clock runs
        for store in args.stores.split(","):
            print(f"applying {events} events to {store} ...", flush=True)
            started = time.monotonic()
            run_apply(bench, [store], once=True)
            seconds = time.monotonic() - started
            figures[f"{store}_s"] = round(seconds, 1)
            figures[f"{store}_events_per_s"] = round(events / seconds)
    finally:
        drop_pipeline(bench)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    figures |= {
        "max_offsets_per_trigger": settings.apply.max_offsets_per_trigger,
        "partitions": settings.pipeline.partitions,
    }
    record(figures, RESULTS)


if __name__ == "__main__":
    main()
