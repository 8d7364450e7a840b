"""What a micro-batch's checkpoint writes cost, with each checkpoint file manager.

    .venv/bin/python bench/checkpoint.py [--seconds 25] [--rounds 2]

Needs no stack. Runs, in the pipeline's Spark session (cdc/core/spark.py), with each
checkpoint file manager in turn (Spark's default, FileContext; and the FileSystem one
the pipeline sets), --rounds times, the trivial query: the rate source at 200 rows/s,
`foreachBatch` counting its batch, trigger 1 s, checkpoint in a temporary directory.
Prints the mean of Spark's own durations per trigger (walCommit: the offset log's
file; commitOffsets: the commit log's; triggerExecution: the whole trigger) and appends
them to bench/results/checkpoint.jsonl.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import record, trigger_durations
from cdc.core.settings import load_settings
from cdc.core.spark import CHECKPOINT_FILE_MANAGER, spark_session

MANAGERS = {
    "FileContext (Spark's default)": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    ),
    "FileSystem (the pipeline's)": CHECKPOINT_FILE_MANAGER,
}
WARM_UP = 5  # triggers left out: the JVM's first ones


def run(spark: Any, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 200)
            .load()
            .writeStream.option("checkpointLocation", checkpoint)
            .foreachBatch(lambda batch, _: batch.count())
            .trigger(processingTime="1 second")
            .start()
        )
        time.sleep(seconds)
        durations = trigger_durations(query, skip=WARM_UP)
        query.stop()
    keys = ("triggers", "walCommit", "commitOffsets", "addBatch", "triggerExecution")
    return {k: durations.get(k, 0.0) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=25, help="per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each file manager")
    args = parser.parse_args()
    settings = load_settings()
    spark = spark_session(settings, "bench-checkpoint")
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(args.rounds):  # interleaved: the JVM warms up for both alike
        for name, manager in MANAGERS.items():
            spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", manager)
            runs[name].append(run(spark, args.seconds))
            print(f"{name}: {runs[name][-1]} (mean ms per trigger)", flush=True)
    record({"benchmark": "checkpoint", "ms_per_trigger": runs}, "checkpoint", settings)


if __name__ == "__main__":
    main()
