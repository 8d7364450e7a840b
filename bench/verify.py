"""`cdc verify`, phase by phase: what a verification of every store costs, and where.

    .venv/bin/python bench/verify.py [--dataset demo|pgbench|accounts|small] [--scale 2]
        [--runs 2] [--engine auto|spark|python] [--stores-only]

Needs the local stack (`cdc up`). Takes a pipeline of its own over the dataset (the demo
shop's four tables with the demo's seven views, pgbench's four tables at --scale,
pgbench_accounts alone (--scale 10: one table of 1M rows), or 14 small tables of 3,362
rows in all),
snapshots it, applies it to every store (`cdc apply --once`), then runs verify as `cdc
verify` does (cdc/check/reconcile.py) --runs times, timing each phase: the stores
against the source at a consistent cut, then the warehouse's expectations (current
state, history, aggregates) and its views (not with --stores-only). `--engine` is
verify.engine: where the stores are compared (cdc/check/spark_verify.py). Prints the
seconds per phase, and the rows per second of the comparison (the `verify` phase, the
cut included), and appends them to bench/results/verify.jsonl.
"""

from __future__ import annotations

import argparse
import functools
import io
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cdc.check.reconcile as reconcile
from bench.common import bench_settings, cleanup, record
from bench.snapshot_throughput import pgbench_init
from cdc.apply.job import run_apply
from cdc.capture.snapshot.initial import run_snapshot
from cdc.cli.demo import TABLES as DEMO_TABLES
from cdc.cli.demo import create_shop, with_demo_views
from cdc.core.catalog import describe_table
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings, load_settings

PGBENCH = [f"public.pgbench_{t}" for t in ("accounts", "branches", "tellers", "history")]
# the phases of reconcile(): the names it calls
PHASES = tuple(
    p
    for p in (
        "verify",
        "expectations",
        # (before 2026-11-26, the expectations were three phases)
        "warehouse_checks",
        "history_checks",
        "aggregate_check",
        "view_checks",
    )
    if hasattr(reconcile, p)
)


def timed(seconds: dict[str, float], phase: str, function: Callable[..., Any]) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - started

    return wrapper


# 14 small tables of 3,362 rows in all, shaped like a classic sample schema (a few
# rows in most, one composite key, one wide table of a few thousand): what fixed cost
# per table and per check a verify pays
SMALL = {
    "categories": 8,
    "customer_types": 9,
    "customers": 91,
    "employees": 9,
    "employee_territories": 49,
    "order_details": 2155,
    "orders": 830,
    "products": 77,
    "regions": 4,
    "shippers": 6,
    "suppliers": 29,
    "territories": 53,
    "us_states": 36,
    "customer_demographics": 6,
}


def small_tables(source: Settings) -> list[str]:
    """The 14 small tables in schema verify_small (made again each time)."""
    names = []
    with psycopg.connect(source.postgres.dsn(), autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS verify_small CASCADE")
        conn.execute("CREATE SCHEMA verify_small")
        for name, rows in SMALL.items():
            if name == "order_details":  # the composite key
                conn.execute(
                    "CREATE TABLE verify_small.order_details (order_id int, product_id int, "
                    "unit_price numeric(10, 2), quantity smallint, discount real, "
                    "PRIMARY KEY (order_id, product_id))"
                )
                conn.execute(
                    "INSERT INTO verify_small.order_details SELECT 10248 + g / 3, g % 77 + 1, "
                    "(g % 500) / 7.0, g % 40 + 1, (g % 5) / 20.0 "
                    f"FROM generate_series(0, {rows - 1}) g"
                )
            else:
                conn.execute(
                    f"CREATE TABLE verify_small.{name} (id int PRIMARY KEY, name text NOT NULL, "
                    "note text, amount numeric(12, 2), active boolean, created date, "
                    "changed timestamptz, picture bytea)"
                )
                conn.execute(
                    f"INSERT INTO verify_small.{name} SELECT g, 'name ' || g, "
                    "CASE WHEN g % 3 = 0 THEN NULL ELSE repeat('note ', g % 9) END, "
                    "g * 1.25, g % 2 = 0, date '2020-01-01' + g, "
                    "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 hour', "
                    f"decode(md5(g::text), 'hex') FROM generate_series(1, {rows}) g"
                )
            names.append(f"verify_small.{name}")
    return names


def prepare(source: Settings, dataset: str, scale: int) -> tuple[Settings, list[str]]:
    if dataset == "small":
        names = small_tables(source)
        return bench_settings(source, names), names
    if dataset == "accounts":
        pgbench_init(source, scale)
        return bench_settings(source, PGBENCH[:1]), PGBENCH[:1]
    if dataset == "demo":
        create_shop(source, lambda line: print(line, flush=True))
        return with_demo_views(bench_settings(source, DEMO_TABLES)), DEMO_TABLES
    pgbench_init(source, scale)
    with psycopg.connect(source.postgres.dsn(), autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE pgbench_history ADD COLUMN IF NOT EXISTS id bigint "
            "GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        )
    return bench_settings(source, PGBENCH), PGBENCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset", choices=("demo", "pgbench", "accounts", "small"), default="demo"
    )
    parser.add_argument("--scale", type=int, default=2, help="pgbench's scale")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--change", help="what this run measures (recorded with it)")
    parser.add_argument(
        "--engine",
        help="verify.engine, or several comma-separated (auto, spark, python), each run "
        "once per run over the same data (default: as set)",
    )
    parser.add_argument("--stores-only", action="store_true", help="no expectations or view checks")
    args = parser.parse_args()
    source = load_settings()
    bench, names = prepare(source, args.dataset, args.scale)
    engines = args.engine.split(",") if args.engine else [None]
    stores: list[str] = list(bench.apply.stores)
    runs = []
    try:
        run_snapshot(bench, Console(file=io.StringIO()))
        print("applying the snapshot to every store ...", flush=True)
        run_apply(bench, stores, once=True)
        with admin_connection(bench) as conn:
            tables = [describe_table(conn, name, bench.pipeline) for name in names]
            rows = sum(
                conn.execute(f"SELECT count(*) FROM {t.qualified}").fetchone()[0]  # type: ignore[index]
                for t in tables
            )
        for run, engine in [(r, e) for r in range(args.runs) for e in engines]:
            settings = bench
            if engine is not None:
                settings = bench.model_copy(
                    update={"verify": bench.verify.model_copy(update={"engine": engine})}
                )
            seconds: dict[str, float] = {}
            originals = {phase: getattr(reconcile, phase) for phase in PHASES}
            for phase, function in originals.items():
                setattr(reconcile, phase, timed(seconds, phase, function))
            try:
                started = time.perf_counter()
                report = reconcile.reconcile(
                    settings, tables, stores, 900, quality=not args.stores_only
                )
                total = time.perf_counter() - started
            finally:
                for phase, function in originals.items():
                    setattr(reconcile, phase, function)
            figures = {
                "run": run + 1,
                "engine": settings.verify.engine,
                "ok": report.ok,
                "total_s": round(total, 1),
                "phases_s": {p: round(s, 1) for p, s in seconds.items()},
                "verify_rows_per_s": round(rows / seconds["verify"])
                if seconds.get("verify")
                else None,
                "checks": len(report.checks),
            }
            print(f"verify run {run + 1}: {figures}", flush=True)
            runs.append(figures)
    finally:
        cleanup(bench)
    record(
        {
            **({"change": args.change} if args.change else {}),
            "benchmark": "verify",
            "dataset": args.dataset,
            "tables": len(names),
            "rows": rows,
            "views": len(bench.apply.joins) + len(bench.apply.windows),
            "stores_only": args.stores_only,
            "runs": runs,
        },
        "verify",
        source,
    )


if __name__ == "__main__":
    main()
