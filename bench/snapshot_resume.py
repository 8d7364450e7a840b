"""An initial snapshot killed at about half, then resumed, against one not interrupted.

    .venv/bin/python bench/snapshot_resume.py [--scale 20] [--runs 2] [--at 0.45]
        [--only-whole] [--repo DIR]

(--at 0.45: the ranges are recorded a group at a time, and the first group of this
table holds half of its pages.)

Needs the local stack (`cdc up`); loads pgbench at --scale (20: 2 M rows in
pgbench_accounts) into the stack's database if it is not there. Each run, on a
pipeline of its own over pgbench_accounts:

1. `cdc snapshot`, not interrupted: its wall time (the command, Spark's start included);
2. `cdc snapshot` killed (SIGKILL, its Spark driver with it) once the CTID ranges it
   recorded as written hold --at of the table's pages; then `cdc snapshot` again, which
   resumes (reads the rest, then streams from the slot): the time to the kill, the
   resume's time, and the rows that went through the log twice (the records in the
   topic less the table's rows: the table is idle).

After each, `cdc apply --store warehouse --once` from the same checkout: how long the
warehouse takes after the command to hold every row (the snapshot writes it itself; what
it does not, its apply reads from Kafka).

--only-whole times step 1 alone, and --repo runs `cdc` from another checkout (the code
before a change, in the same sitting).
Prints the figures and appends them to results/snapshot_resume.jsonl.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_settings, cleanup, record
from bench.snapshot_throughput import load_pgbench
from cdc.core.settings import Settings, load_settings
from cdc.core.topics import change_topic, end_offsets

ROOT = Path(__file__).resolve().parent.parent
TABLE = "public.pgbench_accounts"


def environment(settings: Settings, repo: Path) -> dict[str, str]:
    pipe = settings.pipeline
    return {
        **os.environ,
        "PYTHONPATH": str(repo),
        "CDC_DATA_DIR": str(settings.data_dir),  # its secrets, whichever checkout runs
        "CDC_PIPELINE__NAME": pipe.name,
        "CDC_PIPELINE__TOPIC_PREFIX": pipe.topic_prefix,
        "CDC_PIPELINE__TABLES": f'["{TABLE}"]',
    }


def snapshot(settings: Settings, repo: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cdc", "snapshot"],
        env=environment(settings, repo),
        cwd=repo,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(process: subprocess.Popen[bytes]) -> float:
    started = time.monotonic()
    _, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"cdc snapshot failed: {err.decode()[-2000:]}")
    return time.monotonic() - started


def written_pages(settings: Settings) -> int:
    with psycopg.connect(settings.postgres.dsn()) as conn:
        made = conn.execute("SELECT to_regclass('cdc.snapshot_ranges')").fetchone()
        if not made or made[0] is None:
            return 0
        row = conn.execute(
            "SELECT coalesce(sum(coalesce(end_page, first_page + 1) - first_page), 0) "
            "FROM cdc.snapshot_ranges WHERE pipeline = %s",
            (settings.pipeline.name,),
        ).fetchone()
    return int(row[0]) if row else 0


def records(settings: Settings) -> int:
    topic = change_topic(settings.pipeline, TABLE)
    return sum(end_offsets(settings.kafka, [topic])[topic].values())


def warehouse_apply(settings: Settings, repo: Path) -> float:
    """Seconds of `cdc apply --store warehouse --once` (module doc)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cdc", "apply", "--store", "warehouse", "--once"],
        env=environment(settings, repo),
        cwd=repo,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if done.returncode != 0:
        raise SystemExit(f"cdc apply failed: {done.stderr.decode()[-2000:]}")
    return time.monotonic() - started


def whole(base: Settings, repo: Path) -> tuple[float, float]:
    """The snapshot's seconds, then the warehouse's apply's after it."""
    settings = bench_settings(base, [TABLE])
    try:
        started = time.monotonic()
        finish(snapshot(settings, repo))
        return time.monotonic() - started, warehouse_apply(settings, repo)
    finally:
        cleanup(settings)


def interrupted(base: Settings, at: float, rows: int, repo: Path) -> dict[str, float]:
    settings = bench_settings(base, [TABLE])
    with psycopg.connect(base.postgres.dsn()) as conn:
        pages = conn.execute(f"SELECT relpages FROM pg_class WHERE oid = '{TABLE}'::regclass")
        total_pages = int(pages.fetchone()[0])  # type: ignore[index]
    try:
        started = time.monotonic()
        first = snapshot(settings, repo)
        while written_pages(settings) < at * total_pages:
            if first.poll() is not None:
                raise SystemExit("the snapshot finished before it was killed: lower --at")
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        killed = time.monotonic() - started
        done_fraction = written_pages(settings) / total_pages
        resumed = finish(snapshot(settings, repo))
        twice = records(settings) - rows
        apply_s = warehouse_apply(settings, repo)
        return {
            "warehouse_apply_s": round(apply_s, 1),
            "warehouse_whole_after_kill_s": round(resumed + apply_s, 1),
            "to_kill_s": round(killed, 1),
            "pages_written_at_kill": round(done_fraction, 3),
            "resume_s": round(resumed, 1),
            "total_s": round(killed + resumed, 1),
            "rows_read_twice": twice,
            "fraction_read_twice": round(twice / rows, 3),
        }
    finally:
        cleanup(settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--at", type=float, default=0.45, help="kill once this fraction of pages is written"
    )
    parser.add_argument("--only-whole", action="store_true")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout `cdc` runs from")
    args = parser.parse_args()
    base = load_settings()
    rows = load_pgbench(base, args.scale)
    wholes: list[float] = []
    applies: list[float] = []
    broken = []
    for run in range(args.runs):
        seconds, apply_s = whole(base, args.repo)
        wholes.append(round(seconds, 1))
        applies.append(round(apply_s, 1))
        print(
            f"run {run + 1}: uninterrupted {wholes[-1]} s, warehouse apply {applies[-1]} s",
            flush=True,
        )
        if not args.only_whole:
            broken.append(interrupted(base, args.at, rows, args.repo))
            print(f"run {run + 1}: interrupted {broken[-1]}", flush=True)
    figures: dict[str, object] = {
        "rows": rows,
        "repo": str(args.repo),
        "uninterrupted_s": wholes,
        "uninterrupted_median_s": statistics.median(wholes),
        "uninterrupted_warehouse_apply_s": applies,
    }
    if broken:
        figures["interrupted"] = broken
        figures["interrupted_total_median_s"] = statistics.median(b["total_s"] for b in broken)
    record(figures, "snapshot_resume", base)


if __name__ == "__main__":
    main()
