"""What `cdc resync` takes after a lost slot, against a full re-snapshot of the same tables.

    .venv/bin/python bench/resync.py [--rows 1000000] [--pgbench-scale 2] [--gap 0.01]

Needs the local stack (`cdc up`). The slot is lost on a PostgreSQL of the benchmark's
own (the project's component, `max_slot_wal_keep_size` 1MB, on a free port), never on
the stack's. For each case (a table of --rows rows; pgbench's tables with a key at
--pgbench-scale):

1. the initial snapshot, then `cdc apply` (every store) until each store holds it: what a
   full re-snapshot (`cdc drop`, `cdc snapshot`) of these tables costs, stores included;
2. the connector stopped; a gap of changes the log never gets (--gap of the rows
   updated, a tenth of that deleted); the slot lost;
3. `cdc resync` (a new slot, then every store verified and repaired at a cut) until it
   exits 0, with `cdc apply` running: its time, and the records it sent through the log.

Prints the figures and appends them to results/resync.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_settings, cleanup, record
from bench.snapshot_throughput import pgbench_init
from cdc.capture.connect_client import connect_client
from cdc.check.status import pipeline_status
from cdc.core.settings import Settings, load_settings
from cdc.core.topics import change_topic, end_offsets
from cdc.stack.components.postgres import Postgres
from cdc.stores.warehouse.settings import warehouse_settings

ROOT = Path(__file__).resolve().parent.parent


def environment(settings: Settings) -> dict[str, str]:
    """The CDC_* environment of `cdc` on this pipeline and the benchmark's PostgreSQL."""
    pipe = settings.pipeline
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
        "CDC_DATA_DIR": str(settings.data_dir),
        "CDC_POSTGRES__PORT": str(settings.postgres.port),
        "CDC_POSTGRES__PASSWORD": settings.postgres.password.get_secret_value(),
        "CDC_PIPELINE__NAME": pipe.name,
        "CDC_PIPELINE__TOPIC_PREFIX": pipe.topic_prefix,
        "CDC_PIPELINE__TABLES": json.dumps(pipe.tables),
        "CDC_STORES__WAREHOUSE__PATH": str(warehouse_settings(settings).path),
        "CDC_APPLY__JOINS": "[]",
        "CDC_APPLY__WINDOWS": "[]",
    }


def cdc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def timed_cdc(env: dict[str, str], *args: str) -> tuple[int, list[tuple[float, str]]]:
    """Run `cdc`, printing each line it says with the seconds since it started; returns
    its exit code and those lines (the phases' profile)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "cdc", *args],
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    assert process.stdout is not None
    for line in process.stdout:
        at = round(time.monotonic() - started, 1)
        lines.append((at, line.rstrip()))
        print(f"  {at:7.1f} s  {line.rstrip()[:150]}", flush=True)
    return process.wait(), lines


def logged(settings: Settings) -> int:
    topics = [change_topic(settings.pipeline, t) for t in settings.pipeline.tables]
    return sum(sum(p.values()) for p in end_offsets(settings.kafka, topics).values())


def caught_up(settings: Settings, timeout: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stores = pipeline_status(settings).stores
        held = [stores.get(s, {}) for s in settings.apply.stores]
        if all(h.get("backlog_events") == 0 and not h.get("nothing_applied") for h in held):
            return
        time.sleep(1)
    raise SystemExit("the stores did not catch up within the hour")


def run_case(settings: Settings, case: str, make: list[str], gap: float) -> dict[str, object]:
    env = environment(settings)
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in make:
            conn.execute(statement)
        rows = {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in settings.pipeline.tables
        }
    print(f"{case}: {sum(rows.values()):,} rows; snapshot and apply...", flush=True)
    apply = subprocess.Popen(
        [sys.executable, "-m", "cdc", "apply"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        started = time.monotonic()
        snap = cdc(env, "snapshot")
        assert snap.returncode == 0, snap.stderr[-2000:]
        caught_up(settings)
        full = time.monotonic() - started
        before = logged(settings)
        connect_client(settings).stop(settings.pipeline.connector)
        connect_client(settings).wait_stopped(settings.pipeline.connector)
        changed = 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in settings.pipeline.tables:
                key, column = TABLES_KEYS[table]
                every = max(1, round(1 / gap))
                changed += conn.execute(
                    f"UPDATE {table} SET {column} = {column} + 1 WHERE {key} % {every} = 1"
                ).rowcount
                changed += conn.execute(
                    f"DELETE FROM {table} WHERE {key} % {every * 10} = 2"
                ).rowcount
            time.sleep(2)
            for _ in range(4):  # the slot past its 1MB: lost at the checkpoint
                conn.execute("SELECT pg_logical_emit_message(false, 'bench', repeat('x', 1000))")
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            lost = conn.execute(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                (settings.pipeline.slot,),
            ).fetchone()
            assert lost == ("lost",), lost
        print(f"{case}: slot lost after a gap of ~{changed:,} changes; cdc resync...", flush=True)
        started = time.monotonic()
        code, lines = timed_cdc(env, "resync", "--timeout", "1800")
        took = time.monotonic() - started
        assert code == 0, "\n".join(line for _, line in lines[-40:])
        return {
            "case": case,
            "rows": sum(rows.values()),
            "gap_changes": changed,
            "full_snapshot_and_apply_s": round(full, 1),
            "resync_s": round(took, 1),
            "records_through_the_log": logged(settings) - before,
            # when `cdc resync` said each step: where its time goes
            "steps": [{"at_s": at, "said": line[:200]} for at, line in lines if line.strip()],
        }
    finally:
        apply.send_signal(signal.SIGINT)
        try:
            apply.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(apply.pid, signal.SIGKILL)
        cleanup(settings)


TABLES_KEYS = {
    "public.bench_resync": ("id", "n"),
    "public.pgbench_accounts": ("aid", "abalance"),
    "public.pgbench_tellers": ("tid", "tbalance"),
    "public.pgbench_branches": ("bid", "bbalance"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pgbench-scale", type=int, default=2)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument(
        "--case", choices=["table", "pgbench"], action="append", help="only this case (repeat)"
    )
    args = parser.parse_args()
    local = load_settings()
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-resync-"))
    data_dir.chmod(0o755)  # the service user runs PostgreSQL when run as root
    port = _free_port()
    section = local.postgres.model_copy(update={"port": port, "max_slot_wal_keep_size": "1MB"})
    postgres = Postgres(local.model_copy(update={"data_dir": data_dir, "postgres": section}))
    figures: list[dict[str, object]] = []
    try:
        postgres.start()
        section = postgres.settings.postgres  # with the password the component made
        source = local.model_copy(update={"postgres": section})
        cases = [
            (
                f"a table of {args.rows:,} rows",
                ["public.bench_resync"],
                [
                    "CREATE TABLE bench_resync (id bigint PRIMARY KEY, n int, note text)",
                    f"INSERT INTO bench_resync SELECT i, 0, md5(i::text) "
                    f"FROM generate_series(1, {args.rows}) i",
                ],
            ),
            (
                f"pgbench scale {args.pgbench_scale}",
                ["public.pgbench_accounts", "public.pgbench_tellers", "public.pgbench_branches"],
                [],
            ),
        ]
        chosen = args.case or ["table", "pgbench"]
        cases = [c for c, kind in zip(cases, ["table", "pgbench"], strict=True) if kind in chosen]
        for case, tables, make in cases:
            settings = bench_settings(source, tables)
            if not make:
                pgbench_init(settings, args.pgbench_scale)
            figures.append(run_case(settings, case, make, args.gap))
    finally:
        postgres.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    record({"benchmark": "resync", "cases": figures}, "resync", local)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
