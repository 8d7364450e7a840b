"""Initial-snapshot throughput on pgbench_accounts (scale 20 = 2 M rows by default).

    .venv/bin/python bench/snapshot_throughput.py [--scale 20]

Needs the local stack (`cdc up`). Loads pgbench at the given scale into the stack's
PostgreSQL, measures `\\copy pgbench_accounts TO /dev/null` as the floor, then runs
the pipeline's initial snapshot of that table into Kafka (a pipeline of its own),
and appends the figures with the machine's description to bench/results/.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
from rich.console import Console

from cdc.components.postgres import postgres_bin_dir
from cdc.pipeline import drop_pipeline
from cdc.settings import PipelineSettings, load_settings
from snapshot.initial import run_snapshot

RESULTS = Path(__file__).parent / "results" / "snapshot.jsonl"


def machine() -> dict[str, object]:
    import pyspark

    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
    }


def record(figures: dict[str, object], results: Path) -> None:
    """Print the figures with the machine and the time, and append them to `results`."""
    figures = figures | {
        "machine": machine(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(figures, indent=2))
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as fh:
        fh.write(json.dumps(figures) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=20)
    args = parser.parse_args()
    settings = load_settings()
    pg = settings.postgres
    env = {**os.environ, "PGPASSWORD": pg.password.get_secret_value()}
    conn_args = ["-h", pg.host, "-p", str(pg.port), "-U", pg.user]
    bin_dir = postgres_bin_dir()
    assert bin_dir is not None
    with psycopg.connect(pg.dsn()) as conn:
        have = conn.execute("SELECT to_regclass('public.pgbench_accounts') IS NOT NULL").fetchone()
        rows = conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone() if have[0] else (0,)  # type: ignore[index]
    if rows[0] != args.scale * 100_000:  # type: ignore[index]
        print(f"loading pgbench at scale {args.scale} ...", flush=True)
        subprocess.run(
            [str(bin_dir / "pgbench"), "-i", "-q", "-s", str(args.scale), *conn_args, pg.database],
            check=True,
            env=env,
            capture_output=True,
        )
    rows = args.scale * 100_000

    started = time.monotonic()
    subprocess.run(
        ["psql", *conn_args, "-d", pg.database, "-c", r"\copy pgbench_accounts TO /dev/null"],
        check=True,
        env=env,
        capture_output=True,
    )
    copy_s = time.monotonic() - started

    name = "bench" + uuid.uuid4().hex[:6]
    bench = settings.model_copy(
        update={
            "pipeline": PipelineSettings(
                name=name, topic_prefix=name, tables=["public.pgbench_accounts"]
            )
        }
    )
    notes: list[tuple[float, str]] = []
    try:
        result = run_snapshot(
            bench, Console(file=io.StringIO()), lambda n: notes.append((time.monotonic(), n))
        )
    finally:
        drop_pipeline(bench)
    read_started = next(t for t, n in notes if n.startswith("snapshot "))
    copy_done = next(t for t, n in notes if n.startswith("snapshot done"))
    figures = {
        "benchmark": "snapshot",
        "table": "pgbench_accounts",
        "rows": rows,
        "copy_to_devnull_s": round(copy_s, 2),
        "copy_rows_per_s": round(rows / copy_s),
        "snapshot_total_s": round(result.seconds, 2),
        "snapshot_read_write_s": round(copy_done - read_started, 2),
        "snapshot_rows_per_s": round(rows / (copy_done - read_started)),
        "ratio_to_copy": round((copy_done - read_started) / copy_s, 1),
    }
    record(figures, RESULTS)


if __name__ == "__main__":
    main()
