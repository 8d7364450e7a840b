"""Derived data: per view of the demo's, its state and the latency it adds over the plain
warehouse, under the demo's shop workload at a fixed rate.

    .venv/bin/python bench/derived.py [--rate 50] [--seconds 180]

Needs the local stack (`cdc up`). Makes the demo shop, takes its snapshot into a
pipeline of its own, then runs the warehouse twice for --seconds under the workload:
first without derived data, then with the demo's (cdc.cli.demo.with_demo_views).

Latency of an event (as in bench/streaming.py): the moment the micro-batch that holds
it finished minus its commit time. For the warehouse: its progress record, polled.
For a view kept by a streaming query (windows, stream-stream joins): its query's
checkpoint, the first batch whose offsets reach the event, finished when its commit
file was written. A join view
and a stream-table join are written inside the warehouse's batch: what they add is the
warehouse's latency with them minus without. What a window query writes once the
watermark has passed (sliding, session, a join's start without an end) is visible
`watermark` (and gap, within) later by design; the figure here is the query's own.

State, at the end: per streaming query the rows Spark holds in its state stores and
their memory (its last progress report), and the bytes of its checkpoint's state on
disk, given with each view it keeps (views that share a query share these figures:
`query` names it); per view its Delta table's bytes. Appends to bench/results/derived.jsonl.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from bench.common import WarehousePhases, bench_settings, cleanup, record, trigger_durations
from bench.streaming import BatchLog, percentiles, read_events, store_latencies
from cdc.apply.job import run_apply
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.status import pipeline_status
from cdc.cli.demo import TABLES, create_shop, with_demo_views
from cdc.cli.workload import Workload
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import views_session
from cdc.core.topics import change_topic, end_offsets
from cdc.log.checkpoints import checkpoint as query_checkpoint
from cdc.stores.warehouse.tables import view_path, warehouse_root
from cdc.stores.warehouse.views.registry import queries_of, views_of


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def query_batches(checkpoint: Path) -> list[tuple[int, dict[str, int]]]:
    """(finished at ms, offsets read per "topic:partition") of each committed batch (the
    benchmark's checkpoints are local: data_dir's)."""
    found = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    last = max(found, default=None)
    out = []
    for batch in range(last + 1 if last is not None else 0):
        done = checkpoint / "commits" / str(batch)
        offsets = checkpoint / "offsets" / str(batch)
        if not (done.exists() and offsets.exists()):
            continue
        read: dict[str, int] = {}
        for line in offsets.read_text().splitlines()[2:]:
            for topic, parts in json.loads(line).items():
                for p, o in parts.items():  # the next offset to read
                    key = f"{topic}:{p}"
                    read[key] = min(read.get(key, o - 1), o - 1)
        out.append((int(done.stat().st_mtime * 1000), read))
    return out


def _wait_caught_up(settings: Settings, names: list[str], timeout: float) -> None:
    """The warehouse's backlog is zero and each query's last batch read every topic."""
    topics = [change_topic(settings.pipeline, t) for t in TABLES]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ends = end_offsets(settings.kafka, topics)
        warehouse = pipeline_status(settings).stores.get("warehouse", {})
        done = warehouse.get("backlog_events") == 0
        for name in names:
            batches = query_batches(Path(query_checkpoint(settings, name).path))
            read = batches[-1][1] if batches else {}
            done = (
                done
                and bool(read)
                and all(
                    read.get(f"{t}:{p}", -1) >= end - 1
                    for t, parts in ends.items()
                    for p, end in parts.items()
                    if any(k.startswith(f"{t}:") for k in read) and end > 0
                )
            )
        if done:
            return
        time.sleep(1)
    raise SystemExit(f"the warehouse and the views did not catch up within {timeout:.0f} s")


def run(settings: Settings, rate: float, seconds: int, phases: WarehousePhases) -> dict[str, Any]:
    """The warehouse (with the settings' views) under the workload: latencies, state."""
    # the checkpoint of each streaming view's query (views may share one: queries.py)
    queries = {v.name: q for q in queries_of(views_of(settings)) for v in q.members}
    views = sorted({q.label for q in queries.values()})
    stop = threading.Event()
    apply = threading.Thread(
        target=run_apply, args=(settings, ["warehouse"]), kwargs={"stop": stop}, daemon=True
    )
    apply.start()
    try:
        _wait_caught_up(settings, views, 1800)
        topics = [change_topic(settings.pipeline, t) for t in TABLES]
        start = end_offsets(settings.kafka, topics)
        phases.reset()
        since = time.time()
        with BatchLog(settings, ("warehouse",)) as log:
            workload = Workload(settings.postgres.dsn(), rate=rate)
            workload.start()
            time.sleep(seconds)
            workload.stop.set()
            workload.join(timeout=30)
            if workload.error is not None:
                raise SystemExit(f"the workload failed: {workload.error}")
            _wait_caught_up(settings, views, 900)
            time.sleep(0.2)
        events = read_events(settings, start, end_offsets(settings.kafka, topics))
        figures: dict[str, Any] = {
            "events": len(events),
            "warehouse": percentiles(
                [float(ms) for _, ms in store_latencies(events, log.batches["warehouse"])]
            ),
            # what bounds a batch: its steps' seconds (summed over the tables)
            "warehouse_phases": phases.figures(),
        }
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        # the views' queries run in a session of their own (cdc.core.spark.views_session)
        running = views_session(spark, settings).streams.active if spark else []
        active = {q.name: q for q in running}
        root = warehouse_root(settings)
        for view in settings.apply.joins + settings.apply.windows:
            entry: dict[str, Any] = {"delta_bytes": _bytes(Path(view_path(root, view.name)))}
            if view.name in queries:
                # a query's state and costs, shared by the views it keeps
                kept = queries[view.name]
                checkpoint = Path(query_checkpoint(settings, kept.label).path)
                entry["query"] = kept.label
                latencies = store_latencies(events, query_batches(checkpoint))
                entry["latency"] = percentiles([float(ms) for _, ms in latencies])
                entry["state_disk_bytes"] = _bytes(checkpoint / "state")
                query = active.get(kept.name(settings))
                report = query.lastProgress if query is not None else None
                operators = (report or {}).get("stateOperators", [])
                entry["state_rows"] = sum(o.get("numRowsTotal", 0) for o in operators)
                entry["state_memory_bytes"] = sum(o.get("memoryUsedBytes", 0) for o in operators)
                if query is not None:  # what each of its batches cost, step by step
                    entry["ms_per_trigger"] = trigger_durations(query, since)
            else:
                entry["latency"] = "the warehouse's (written in its batch)"
            figures[view.name] = entry
        return figures
    finally:
        stop.set()
        apply.join(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="transactions per second")
    parser.add_argument("--seconds", type=int, default=180)
    parser.add_argument("--change", help="what this run measures (recorded with it)")
    parser.add_argument(
        "--only", choices=("plain", "views"), help="run the warehouse only without or with views"
    )
    args = parser.parse_args()
    source = load_settings()
    create_shop(source, lambda line: print(line, flush=True))
    plain = bench_settings(source, TABLES)
    figures: dict[str, object] = {
        "benchmark": "derived",
        "rate": args.rate,
        "seconds": args.seconds,
        "views_trigger_interval_s": source.apply.views_trigger_interval_s,
        **({"change": args.change} if args.change else {}),
    }
    try:
        print("snapshot of the demo shop ...", flush=True)
        run_snapshot(plain, Console(file=io.StringIO()))
        with WarehousePhases() as phases:
            if args.only != "views":
                print(f"the warehouse alone, {args.seconds} s at {args.rate:g} TPS ...")
                figures["plain"] = run(plain, args.rate, args.seconds, phases)
                print(json.dumps(figures["plain"]), flush=True)
            if args.only != "plain":
                with_views = with_demo_views(plain)
                print(f"with the demo's derived data, {args.seconds} s ...", flush=True)
                figures["with_views"] = run(with_views, args.rate, args.seconds, phases)
                print(json.dumps(figures["with_views"]), flush=True)
    finally:
        cleanup(plain)
    record(figures, "derived", source)


if __name__ == "__main__":
    main()
