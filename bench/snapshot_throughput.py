"""Initial snapshot of pgbench_accounts (scale 20 = 2 M rows), side by side with \\copy
and with Debezium's own initial snapshot.

    .venv/bin/python bench/snapshot_throughput.py [--scale 20]
        [--warehouse direct|apply|none] [--no-debezium] [--experiment "what this run tries"]

Needs the local stack (`cdc up`). Loads pgbench at the given scale into the stack's
database (the one database its replication role may read) if it is not there, then, in
one run:
  1. `\\copy pgbench_accounts TO /dev/null`: what reading the table costs at least;
  2. our initial snapshot into Kafka (a pipeline of its own) and into the warehouse:
     `direct` (the default), the snapshot writes the warehouse itself from the same read
     (pipeline.snapshot_into_stores), then `cdc apply --store warehouse --once` skips
     those records (timed apart); `apply`, as before: the snapshot into Kafka, then that
     apply over the snapshot's events, and the floor of its steps over the same records
     (Spark's read of them, their collect as Arrow, their decoding, one delta-rs append);
  3. Debezium's initial snapshot (`snapshot.mode=initial`, same connector settings,
     same Connect worker, topic with as many partitions) of the same table into Kafka,
     timed from registering the connector until its topic holds every row.
Prints rows/s, the ratios and the cores each component kept busy during our read and
write, and appends them to bench/results/snapshot.jsonl.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CpuMark, ResourceSampler, bench_settings, cleanup, record
from cdc.apply.job import run_apply
from cdc.apply.snapshot_into import snapshot_into
from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import connector_config, secret_reference
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.clients import kafka_admin
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import spark_session
from cdc.core.topics import change_topic, end_offsets
from cdc.stack.components.postgres import postgres_bin_dir
from cdc.stores.warehouse.settings import warehouse_settings

TABLE = "public.pgbench_accounts"


def load_pgbench(settings: Settings, scale: int) -> int:
    pg = settings.postgres
    with psycopg.connect(pg.dsn()) as conn:
        have = conn.execute("SELECT to_regclass('public.pgbench_accounts') IS NOT NULL").fetchone()
        rows = conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone() if have[0] else (0,)  # type: ignore[index]
    if rows[0] != scale * 100_000:  # type: ignore[index]
        print(f"loading pgbench at scale {scale} ...", flush=True)
        pgbench_init(settings, scale)
    return scale * 100_000


def pgbench_init(settings: Settings, scale: int) -> None:
    """pgbench's tables at `scale` (100,000 accounts each) in the settings' database."""
    bin_dir = postgres_bin_dir()
    assert bin_dir is not None
    subprocess.run(
        [str(bin_dir / "pgbench"), "-i", "-q", "-s", str(scale), *psql_args(settings)],
        check=True,
        env=psql_env(settings),
        capture_output=True,
    )


def psql_args(settings: Settings) -> list[str]:
    pg = settings.postgres
    return ["-h", pg.host, "-p", str(pg.port), "-U", pg.user, "-d", pg.database]


def psql_env(settings: Settings) -> dict[str, str]:
    return {**os.environ, "PGPASSWORD": settings.postgres.password.get_secret_value()}


def copy_seconds(settings: Settings) -> float:
    started = time.monotonic()
    subprocess.run(
        ["psql", *psql_args(settings), "-c", r"\copy pgbench_accounts TO /dev/null"],
        check=True,
        env=psql_env(settings),
        capture_output=True,
    )
    return time.monotonic() - started


def warehouse_floor(settings: Settings) -> dict[str, float]:
    """What the warehouse's apply of the snapshot cannot go below on this machine, step
    by step over one of its batches (the topic's first records, read again): Spark
    reading them from Kafka (a count), collecting them to the driver as Arrow, decoding
    them there (_arrow_events.py), and one delta-rs append of the decoded rows into a new
    table. Seconds, and the batch's records."""
    import shutil

    from deltalake import write_deltalake

    from cdc.capture.source_reader import SourceReader
    from cdc.core.spark import kafka_options
    from cdc.stores.warehouse.write._arrow_events import decode_records

    spark = spark_session(settings, "bench-snapshot-warehouse")
    topic = change_topic(settings.pipeline, TABLE)
    # one batch of the apply's (its first records, each partition's share)
    ends = end_offsets(settings.kafka, [topic])[topic]
    share = warehouse_settings(settings).max_offsets_per_trigger // len(ends)
    until = {str(p): min(end, share) for p, end in ends.items()}
    records = (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("endingOffsets", json.dumps({topic: until}))
        .load()
        .select("key", "value", "topic", "partition", "offset")
    )
    floor: dict[str, float] = {"records": sum(until.values())}
    started = time.monotonic()
    records.count()
    floor["kafka_read_s"] = time.monotonic() - started
    started = time.monotonic()
    collected = records.toArrow()
    floor["collect_s"] = time.monotonic() - started
    tables, _ = SourceReader(settings).read()
    started = time.monotonic()
    decoded = decode_records(collected, {topic: TABLE}, tables, {}, int(time.time() * 1000))
    floor["decode_s"] = time.monotonic() - started
    assert decoded is not None, "the Arrow path does not take pgbench_accounts"
    rows = decoded.tables[TABLE]
    target = settings.data_dir / "bench" / settings.pipeline.name / "floor"
    started = time.monotonic()
    write_deltalake(str(target), rows, mode="append")
    floor["delta_append_s"] = time.monotonic() - started
    shutil.rmtree(target, ignore_errors=True)
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in floor.items()}


def debezium_snapshot(settings: Settings, rows: int) -> tuple[float, float]:
    """Debezium's own initial snapshot of the table: (seconds from registering the
    connector to the last row in Kafka, seconds from the first row to the last)."""
    pipe = settings.pipeline
    name = f"{pipe.connector}-debezium"
    prefix = f"{pipe.topic_prefix}dbz"
    config = connector_config(
        settings,
        topic_prefix=prefix,
        tables=[TABLE],
        slot=f"{pipe.slot}_dbz",
        publication=f"{pipe.publication}_dbz",
        snapshot_mode="initial",
    )
    config["topic.creation.default.partitions"] = str(pipe.partitions)
    config["slot.drop.on.stop"] = "true"
    config["database.password"] = secret_reference(
        settings, "database.password", config["database.password"], connector=name
    )
    topic = f"{prefix}.{TABLE}"
    client = connect_client(settings)
    started = time.monotonic()
    client.put_config(name, config)
    first = None
    try:
        while True:
            try:
                written = sum(end_offsets(settings.kafka, [topic])[topic].values())
            except Exception:  # the topic is not there yet
                written = 0
            now = time.monotonic()
            if written and first is None:
                first = now
            if written >= rows:
                return now - started, now - (first or started)
            if now - started > 1800:
                raise SystemExit("Debezium's snapshot did not finish within 30 minutes")
            time.sleep(0.2)
    finally:
        client.delete(name)
        time.sleep(2)
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND NOT active",
                (f"{pipe.slot}_dbz",),
            )
            conn.execute(f"DROP PUBLICATION IF EXISTS {pipe.publication}_dbz")
        admin = kafka_admin(settings.kafka)
        try:
            admin.delete_topics([t for t in admin.list_topics() if t.startswith(prefix)])
        finally:
            admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=20)
    parser.add_argument(
        "--warehouse",
        choices=["direct", "apply", "none"],
        default="direct",
        help="how the snapshot reaches Delta: written by the snapshot itself (direct), by "
        "the warehouse's apply over its events (apply), or not at all",
    )
    parser.add_argument(
        "--no-debezium", action="store_true", help="skip Debezium's snapshot (no ratio to it)"
    )
    parser.add_argument(
        "--experiment", help="what this run tries (recorded as such, not as the figure)"
    )
    args = parser.parse_args()
    settings = load_settings()
    rows = load_pgbench(settings, args.scale)
    copy_s = copy_seconds(settings)
    print(f"\\copy: {copy_s:.2f} s", flush=True)

    bench = bench_settings(settings, [TABLE])
    notes: list[tuple[float, str]] = []
    figures: dict[str, object] = {"benchmark": "snapshot", "table": TABLE, "rows": rows}
    try:
        marks: dict[str, CpuMark] = {}

        def say(line: str) -> None:
            notes.append((time.monotonic(), line))
            if line.startswith("snapshot "):  # the read starts, then "snapshot done"
                marks["done" if line.startswith("snapshot done") else "read"] = resources.cpu()

        direct = args.warehouse == "direct"
        into = snapshot_into(bench) if direct else None
        if direct and into is None:
            raise SystemExit("the warehouse does not take the snapshot (apply.stores?)")
        if direct:
            spark_session(bench, "bench-snapshot-warehouse")  # started before the clock
        figures["warehouse"] = args.warehouse
        with ResourceSampler() as resources:
            result = run_snapshot(bench, Console(file=io.StringIO()), say, into)
        returned = time.monotonic()  # direct: the warehouse holds every row by now
        read_started = next(t for t, n in notes if n.startswith("snapshot "))
        copy_done = next(t for t, n in notes if n.startswith("snapshot done"))
        ours_s = copy_done - read_started
        cores = marks["done"].cores_since(marks["read"])
        print(f"our snapshot into Kafka: {ours_s:.2f} s; cores {cores}", flush=True)
        figures["snapshot_cores"] = cores
        if direct:  # the last groups go into the warehouse while the connector starts
            whole_s = returned - read_started
            print(f"the warehouse whole: {whole_s:.2f} s", flush=True)
            figures["warehouse_whole_s"] = round(whole_s, 2)
            figures["warehouse_rows_per_s"] = round(rows / whole_s)
            # the warehouse's apply then starts after the snapshot's records
            started = time.monotonic()
            run_apply(bench, ["warehouse"], once=True)
            skip_s = time.monotonic() - started
            print(f"the warehouse's apply past them: {skip_s:.2f} s", flush=True)
            figures["warehouse_apply_s"] = round(skip_s, 1)
        elif args.warehouse == "apply":
            spark_session(bench, "bench-snapshot-warehouse")  # started before the clock
            started = time.monotonic()
            run_apply(bench, ["warehouse"], once=True)
            warehouse_s = time.monotonic() - started
            print(f"and into the warehouse: {warehouse_s:.2f} s", flush=True)
            figures |= {
                "warehouse_apply_s": round(warehouse_s, 1),
                "warehouse_rows_per_s": round(rows / warehouse_s),
            }
            floor = warehouse_floor(bench)
            print(f"the floor of its steps: {floor}", flush=True)
            figures["warehouse_floor"] = floor
    finally:
        cleanup(bench)
    if args.experiment:
        figures["experiment"] = args.experiment
    figures |= {
        "copy_to_devnull_s": round(copy_s, 2),
        "copy_rows_per_s": round(rows / copy_s),
        "snapshot_total_s": round(result.seconds, 2),
        "snapshot_read_write_s": round(ours_s, 2),
        "snapshot_rows_per_s": round(rows / ours_s),
        "ratio_to_copy": round(ours_s / copy_s, 1),
        "partitions": bench.pipeline.partitions,
    }
    if not args.no_debezium:
        dbz_total_s, dbz_stream_s = debezium_snapshot(bench, rows)
        print(f"Debezium's snapshot into Kafka: {dbz_total_s:.2f} s", flush=True)
        figures |= {
            "debezium_total_s": round(dbz_total_s, 2),
            "debezium_first_to_last_s": round(dbz_stream_s, 2),
            "debezium_rows_per_s": round(rows / dbz_total_s),
            "speedup_over_debezium": round(dbz_total_s / ours_s, 1),
            "speedup_over_debezium_total": round(dbz_total_s / result.seconds, 1),
        }
    record(figures, "snapshot", settings)


if __name__ == "__main__":
    main()
