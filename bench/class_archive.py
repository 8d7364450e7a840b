"""A Spark driver's start with and without its class archive (cdc/core/class_archive.py):
a driver started as every `cdc` command starts one, its first SQL and its first Delta
read, in runs that alternate so that the machine's noise falls on both alike.

    .venv/bin/python bench/class_archive.py [--runs 3]

Needs the archive (install.sh builds it); no stack."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import record
from cdc.core.settings import Settings
from cdc.core.spark import archive_path

_ONE = """
import json, sys, time
started = time.monotonic()
from cdc.core.settings import Settings
from cdc.core.spark import spark_session
spark = spark_session(Settings(), "bench-class-archive")
session = time.monotonic()
spark.sql("SELECT 1").collect()
sql = time.monotonic()
spark.read.format("delta").load(sys.argv[1]).where("id > 3").collect()
read = time.monotonic()
print(json.dumps({"session_s": session - started, "first_sql_s": sql - session,
                  "first_delta_read_s": read - sql, "total_s": read - started}))
"""


def _run(data_dir: Path, table: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _ONE, str(table)],
        env={**os.environ, "CDC_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    settings = Settings()
    stamp = archive_path(settings).with_suffix(".stamp")
    if not stamp.is_file():
        sys.exit("no class archive: run ./install.sh (or python -m cdc.core.class_archive)")
    kept = stamp.read_text()
    runs: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(prefix="bench-class-archive-") as scratch:
        data, table = Path(scratch) / "data", Path(scratch) / "table"
        from cdc.core.spark import spark_session

        spark = spark_session(settings.model_copy(update={"data_dir": data}), "bench-setup")
        spark.range(10).write.format("delta").save(str(table))
        spark.stop()
        try:
            for _ in range(args.runs):
                stamp.write_text(kept)
                runs["with"].append(_run(data, table))
                stamp.unlink()  # the driver then maps no archive
                runs["without"].append(_run(data, table))
        finally:
            stamp.write_text(kept)
    figures: dict[str, object] = {"runs": args.runs}
    for name, found in runs.items():
        totals = [r["total_s"] for r in found]
        figures[name] = {
            "total_s_median": round(statistics.median(totals), 1),
            "total_s_range": [round(min(totals), 1), round(max(totals), 1)],
            "session_s_median": round(statistics.median(r["session_s"] for r in found), 1),
        }
    record(figures, "class_archive")


if __name__ == "__main__":
    main()
