"""What a micro-batch into the warehouse costs as its current state grows (issue 68
item 5: a batch into a 10M-row `current` against one into a 1M-row one).

    .venv/bin/python bench/current_size.py [--keys 1000000 10000000] [--batch 1000]
                                           [--batches 4] [--shape uniform|recent]
                                           [--spark-dv]

No stack needed (Spark in this process, Delta tables in a temporary folder). For each
--keys: the table's `current` and `history` are made by the warehouse (`prepare`), then
filled as a snapshot through the pipeline leaves them (files of
`stores.warehouse.max_offsets_per_trigger` rows, in key order, one commit each, written
with delta-rs); then --batches micro-batches go through the warehouse's own writer
(`write_frame`, as the apply job writes a batch of changes shaped on the driver) after
one not timed, each timed as the warehouse logs it (history, current) and whole. A
batch of --batch changes updates keys drawn uniformly (the worst case for a
copy-on-write table: each batch meets nearly every file) or, with --shape recent, from
the newest 1%; or inserts new keys (--shape inserts: above every key held, as a serial
key's; scattered-inserts: between them, as a UUID's), which the warehouse appends once
it knows the table holds none of them. With --spark-dv the same batches are also
MERGEd by delta-spark into a copy of `current` with deletion vectors on (what Spark
would write instead of rewriting files; delta-rs cannot write or read those tables).
Prints and appends the figures to bench/results/current_size.jsonl, with the ratio of
each size's median to the first's.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record
from bench.history_write import EVENTS, TABLE, change_events
from cdc.core.settings import load_settings
from cdc.core.spark import spark_session
from cdc.stores.warehouse.store import WarehouseStore
from cdc.stores.warehouse.tables import current_path, history_path

_TIMES = re.compile(r"history ([\d.]+) s, current ([\d.]+) s")
FIRST_POSITION = 1_000  # the snapshot's rows


class _Times(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _TIMES.search(record.getMessage())
        if found:
            self.seen.append((float(found[1]), float(found[2])))


def _fill(path: str, keys: int, rows_per_file: int, op: str | None) -> None:
    """The table at `path` filled with `keys` rows in the warehouse's columns, as a
    snapshot leaves it: a commit of `rows_per_file` rows per micro-batch, in key order."""
    import numpy as np
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    for start in range(0, keys, rows_per_file):
        offsets = np.arange(start, min(keys, start + rows_per_file))  # the snapshot's
        ids = 2 * offsets  # even: the odd ones are new keys
        n = len(ids)
        known = {
            "id": pa.array(ids, pa.int32()),
            "balance": pa.array(np.random.randint(0, 10**6, n), pa.int32()),
            "filler": pa.array(["x" * 80] * n),
            "_cdc_commit_lsn": pa.array(np.full(n, FIRST_POSITION), pa.int64()),
            "_cdc_lsn": pa.array(np.full(n, FIRST_POSITION), pa.int64()),
            "_cdc_offset": pa.array(offsets, pa.int64()),
            "_cdc_partition": pa.array(np.zeros(n, dtype=np.int32), pa.int32()),
            "_cdc_op": pa.array([op] * n, pa.string()),
        }
        columns = [
            known[f.name].cast(f.type)
            if f.name in known and (f.name != "_cdc_op" or op)
            else pa.nulls(n, f.type)
            for f in schema
        ]
        write_deltalake(path, pa.Table.from_arrays(columns, schema=schema), mode="append")


def _batches(shape: str, keys: int, size: int, count: int) -> tuple[list[list[int]], str]:
    """`count` batches of `size` keys of a table holding the even keys below 2 × `keys`,
    and their events' op."""
    if shape in ("uniform", "recent"):
        drawn = range(keys) if shape == "uniform" else range(keys - keys // 100, keys)
        return [sorted(2 * k for k in random.sample(drawn, size)) for _ in range(count)], "u"
    if shape == "inserts":
        return [[2 * keys + 1 + 2 * (b * size + j) for j in range(size)] for b in range(count)], "c"
    new = random.sample(range(keys), size * count)
    return [sorted(2 * k + 1 for k in new[b * size : (b + 1) * size]) for b in range(count)], "c"


def _write(store: WarehouseStore, frame: Any, rows: list[dict[str, Any]]) -> None:
    """The batch written as the apply job writes a small batch of changes without a TOAST
    placeholder: decoded and shaped on the driver, committed by delta-rs (the route
    `spark-decoded`; `arrow` differs only in who decodes)."""
    size = sum(len(str(r["after"])) for r in rows)
    tables = {TABLE.qualified: TABLE}
    store.write_frame(tables, frame, {TABLE.qualified}, set(), {TABLE.qualified: size})


def _spark_dv(spark: Any, source: str, batches: list[list[int]]) -> list[float]:
    """The batches MERGEd by delta-spark into a copy of `source` with deletion vectors."""
    from delta.tables import DeltaTable

    copy = f"{source}-dv"
    spark.read.format("delta").load(source).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(copy)
    table = DeltaTable.forPath(spark, copy)
    fields = "id int, balance int, filler string, _cdc_lsn long"
    walls = []
    for n, keys in enumerate(batches):
        rows = spark.createDataFrame([(k, 1, "y" * 80, 10**9 + n) for k in keys], fields)
        started = time.monotonic()
        (
            table.alias("t")
            .merge(rows.alias("s"), "t.id = s.id")
            .whenMatchedUpdate(
                "t._cdc_lsn < s._cdc_lsn",
                {c: f"s.{c}" for c in ("balance", "filler", "_cdc_lsn")},
            )
            .whenNotMatchedInsert(values={"id": "s.id", "balance": "s.balance"})
            .execute()
        )
        walls.append(round(time.monotonic() - started, 2))
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=1000, help="updates per timed batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument(
        "--shape",
        choices=["uniform", "recent", "inserts", "scattered-inserts"],
        default="uniform",
        help="what a batch holds: updates of keys drawn uniformly (pgbench's shape) or from "
        "the newest 1%% (an order's status moving on); or new keys, above every key the "
        "table holds (a serial key) or between them (a UUID's)",
    )
    parser.add_argument("--spark-dv", action="store_true", help="also delta-spark with DVs")
    parser.add_argument("--label", default="", help="recorded with the figures (e.g. the commit)")
    args = parser.parse_args()

    settings = load_settings()
    spark = spark_session(settings, "bench-current-size")
    times = _Times()
    logging.getLogger("cdc.stores.warehouse.store").addHandler(times)
    logging.getLogger("cdc.stores.warehouse.store").setLevel(logging.INFO)
    results: list[dict[str, Any]] = []
    try:
        for keys in args.keys:
            folder = Path(tempfile.mkdtemp(prefix="current-size-"))
            try:
                root = str(folder / "warehouse")
                store = WarehouseStore(spark, root)
                store.prepare([TABLE])
                started = time.monotonic()
                rows_per_file = settings.store_section("warehouse").max_offsets_per_trigger
                _fill(current_path(root, TABLE.qualified), keys, rows_per_file, None)
                _fill(history_path(root, TABLE.qualified), keys, rows_per_file, "r")
                filled_s = round(time.monotonic() - started, 1)
                position, offset = [10**9], [keys]
                batches, op = _batches(args.shape, keys, args.batch, args.batches + 1)
                warm, batches = batches[0], batches[1:]
                # one batch first, not timed: Spark plans and compiles what the rest reuse
                rows = change_events(warm, position, offset, op, "y")
                _write(store, spark.createDataFrame(rows, EVENTS), rows)
                times.seen.clear()
                walls = []
                for picked in batches:
                    rows = change_events(picked, position, offset, op, "y")
                    frame = spark.createDataFrame(rows, EVENTS)
                    started = time.monotonic()
                    _write(store, frame, rows)
                    walls.append(round(time.monotonic() - started, 2))
                from deltalake import DeltaTable

                current = DeltaTable(current_path(root, TABLE.qualified))
                result: dict[str, Any] = {
                    "keys": keys,
                    "shape": args.shape,
                    "filled_s": filled_s,
                    "batch": args.batch,
                    "batch_s": walls,
                    "batch_s_median": round(statistics.median(walls), 2),
                    "history_s": [h for h, _ in times.seen],
                    "current_s": [c for _, c in times.seen],
                    "current_s_median": round(statistics.median(c for _, c in times.seen), 2),
                    "current_files_after": len(current.file_uris()),
                }
                if args.spark_dv:
                    dv = _spark_dv(spark, current_path(root, TABLE.qualified), batches)
                    result["spark_dv_merge_s"] = dv
                    result["spark_dv_merge_s_median"] = round(statistics.median(dv), 2)
                results.append(result)
                print(json.dumps(result), flush=True)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        first = results[0]
        for result in results:
            result["ratio_to_first"] = round(result["batch_s_median"] / first["batch_s_median"], 2)
            if "spark_dv_merge_s_median" in result:
                result["spark_dv_ratio_to_first"] = round(
                    result["spark_dv_merge_s_median"] / first["spark_dv_merge_s_median"], 2
                )
        record({"label": args.label, "sizes": results}, "current_size")
        for result in results:
            print(
                f"{result['keys']:>11,} keys: batch {result['batch_s_median']} s "
                f"(current {result['current_s_median']} s), x{result['ratio_to_first']}"
                + (
                    f"; delta-spark with deletion vectors {result['spark_dv_merge_s_median']} s, "
                    f"x{result['spark_dv_ratio_to_first']}"
                    if "spark_dv_merge_s_median" in result
                    else ""
                )
            )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
