"""What the warehouse pays per micro-batch as a table's history grows.

    .venv/bin/python bench/history_write.py [--keys 100000] [--versions 5] [--batch 1000]

No stack needed (Spark in this process, Delta tables in a temporary folder). Writes a
table of --keys keys whose history holds --versions versions of each (its snapshot and
--versions - 1 updates of every key, as batches of the warehouse's own writer; the
first, into empty tables, is recorded as `first_*`), then
times --batches micro-batches of --batch updates of random keys: the history write and
the current state's MERGE, each as the warehouse logs them. Appends the figures to
bench/results/history_write.jsonl.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from cdc.core.catalog import Column, Table
from cdc.core.settings import load_settings
from cdc.core.spark import spark_session
from cdc.stores.warehouse.store import WarehouseStore

TABLE = Table(
    "public",
    "accounts",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("balance", "integer", "int4", "N", False, None, False),
        Column("filler", "text", "text", "S", False, None, False),
    ),
    ("id",),
    "d",
    1,
    1,
)
EVENTS = (
    "table string, topic string, partition int, offset long, key string, op string, "
    "after string, commit_ms long, commit_lsn long, lsn long, error string, value string, "
    "cut_ms long"
)
_TIMES = re.compile(r"history ([\d.]+) s, current ([\d.]+) s")


class _Times(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _TIMES.search(record.getMessage())
        if found:
            self.seen.append((float(found[1]), float(found[2])))


def change_events(
    keys: list[int], position: list[int], offset: list[int], op: str, filler: str = "x"
) -> list[dict[str, object]]:
    """Change events of TABLE's `keys` as the batch writer sees them (EVENTS), each at
    the next position and offset (`position`, `offset`: counters carried over calls)."""
    rows: list[dict[str, object]] = []
    for key in keys:
        position[0] += 10
        offset[0] += 1
        rows.append(
            {
                "table": TABLE.qualified,
                "topic": "bench.public.accounts",
                "partition": 0,
                "offset": offset[0],
                "key": json.dumps({"id": key}),
                "op": op,
                "after": json.dumps(
                    {"id": key, "balance": random.randrange(10**6), "filler": filler * 80}
                ),
                "commit_ms": 1_700_000_000_000 + position[0],
                "commit_lsn": position[0],
                "lsn": position[0] + 1,
                "error": None,
                "value": "{}",
                "cut_ms": None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000, help="updates per timed batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--label", default="", help="recorded with the figures (e.g. the commit)")
    args = parser.parse_args()

    settings = load_settings()
    spark = spark_session(settings, "bench-history-write")
    folder = Path(tempfile.mkdtemp(prefix="history-write-"))
    store = WarehouseStore(spark, str(folder / "warehouse"))
    store.prepare([TABLE])
    tables = {TABLE.qualified: TABLE}
    times = _Times()
    logging.getLogger("cdc.stores.warehouse.store").addHandler(times)
    logging.getLogger("cdc.stores.warehouse.store").setLevel(logging.INFO)
    position = [1000]
    offset = [0]

    def write(rows: list[dict[str, object]]) -> None:
        frame = spark.createDataFrame(rows, EVENTS)
        store.write_frame(tables, frame, {TABLE.qualified})

    try:
        every = list(range(args.keys))
        write(change_events(every, position, offset, "r"))
        first = times.seen[0]  # the snapshot into empty tables
        for _ in range(args.versions - 1):
            write(change_events(every, position, offset, "u"))
        times.seen.clear()
        walls = []
        for _ in range(args.batches):
            started = time.monotonic()
            write(change_events(random.sample(every, args.batch), position, offset, "u"))
            walls.append(round(time.monotonic() - started, 2))
        history = [h for h, _ in times.seen]
        current = [c for _, c in times.seen]
        record(
            {
                "label": args.label,
                "keys": args.keys,
                "versions": args.versions,
                "history_rows": args.keys * args.versions + args.batch * args.batches,
                "batch": args.batch,
                "batches": args.batches,
                "first_history_s": first[0],
                "first_current_s": first[1],
                "history_s_median": round(statistics.median(history), 2),
                "current_s_median": round(statistics.median(current), 2),
                "history_s": history,
                "current_s": current,
                # the whole batch (history and current state side by side before issue
                # 47, one after the other since)
                "batch_s_median": round(statistics.median(walls), 2),
                "batch_s": walls,
            },
            "history_write",
        )
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
