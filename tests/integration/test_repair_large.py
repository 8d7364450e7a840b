"""`cdc verify --repair` mends thousands of drifted keys; a backfill takes a long filter.

The drift is made behind the pipeline's back (hashes deleted or changed in Redis
directly), and the cache is read back with redis-py itself, never with the project's
readers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import psycopg
import pytest
import redis

from cdc.capture.source_setup import signal_data_width, widen_signal_table
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, read_topic
from tests.conftest import Capture, Captured, RunningStack
from tests.helpers import ROOT, run_cdc

pytestmark = pytest.mark.integration

ROWS = 30_000


def cache_env(t: Captured) -> dict[str, str]:
    return {**t.env, "CDC_APPLY__STORES": json.dumps(["cache"])}


def hash_name(settings: Settings, table: str, row_id: int) -> str:
    # the cache's documented layout: <prefix>:<schema.table>:<key as the change events carry it>
    return f'{settings.pipeline.topic_prefix}:{table}:{{"id":{row_id}}}'


def source_table(dsn: str, name: str) -> dict[int, dict[str, str]]:
    """Each row as the cache should hold it: every non-NULL column as text."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id, name, qty, note FROM {name}").fetchall()
    return {
        row_id: {
            k: str(v)
            for k, v in {"id": row_id, "name": nm, "qty": qty, "note": note}.items()
            if v is not None
        }
        for row_id, nm, qty, note in rows
    }


def cache_table(
    client: redis.Redis, settings: Settings, table: str, ids: list[int]
) -> dict[int, dict[str, str]]:
    """HGETALL of each row's hash: the row's fields, without the position fields (`_...`);
    a missing hash or a deleted marker is no row."""
    pipe = client.pipeline(transaction=False)
    for row_id in ids:
        pipe.hgetall(hash_name(settings, table, row_id))
    held = {}
    for row_id, entry in zip(ids, pipe.execute(), strict=True):
        fields = {k.decode(): v.decode() for k, v in entry.items()}
        if fields and "_deleted" not in fields:
            held[row_id] = {k: v for k, v in fields.items() if not k.startswith("_")}
    return held


def stray_hashes(client: redis.Redis, settings: Settings, table: str, ids: set[int]) -> list[str]:
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    names = (n.decode() for n in client.scan_iter(match=prefix.replace("[", "\\[") + "*"))
    return [n for n in names if json.loads(n[len(prefix) :])["id"] not in ids]


def incremental_keys(settings: Settings, table: str) -> list[int]:
    """The keys of the log's backfill events (Debezium's incremental snapshot), in order."""
    records = read_topic(settings.kafka, change_topic(settings.pipeline, table))
    return [
        r.value["after"]["id"]
        for r in records
        if r.value and r.op == "r" and r.value["source"].get("snapshot") == "incremental"
    ]


def repair(env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = run_cdc(
        "verify", "--repair", "--store", "cache", "--table", name, "--timeout", "300", env=env
    )
    print(f"cdc verify --repair: {time.monotonic() - started:.1f}s\n{result.stderr}")
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.long
def test_verify_repair_mends_ten_thousand_keys_drifted_in_the_cache(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL, qty int, note text)",
        "INSERT INTO {name} SELECT g, 'row ' || g, g % 97, CASE WHEN g % 5 = 0 THEN NULL "
        f"ELSE md5(g::text) END FROM generate_series(1, {ROWS}) g",
        prefix="rep",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    env = cache_env(t)
    client = redis.Redis.from_url(settings.redis.url)
    ids = list(range(1, ROWS + 1))
    apply = None
    with tempfile.TemporaryFile() as log:
        try:
            # a pipeline set up before the signal table's data column became text
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "ALTER TABLE cdc.debezium_signal ALTER COLUMN data TYPE varchar(2048) "
                    "USING left(data, 2048)"
                )
            apply = subprocess.Popen(
                [sys.executable, "-m", "cdc", "apply", "--store", "cache"],
                env={**{k: v for k, v in os.environ.items() if not k.startswith("CDC_")}, **env},
                cwd=ROOT,
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            source = source_table(dsn, name)
            deadline = time.monotonic() + 600
            while cache_table(client, settings, table, ids) != source:
                assert apply.poll() is None, "the apply job died"
                assert time.monotonic() < deadline, "the cache did not take the snapshot"
                time.sleep(2)

            # 1,000 hashes deleted behind the pipeline's back (the filter of 1,000 keys
            # does not fit the signal table's varchar(2048): it is widened)
            first = [i for i in ids if i % 30 == 0]
            client.delete(*[hash_name(settings, table, i) for i in first])
            result = repair(env, name)
            assert "backfilled 1000 keys" in result.stderr
            assert cache_table(client, settings, table, ids) == source
            with psycopg.connect(dsn) as conn:
                kind = conn.execute(
                    "SELECT data_type FROM information_schema.columns WHERE table_schema = 'cdc' "
                    "AND table_name = 'debezium_signal' AND column_name = 'data'"
                ).fetchone()
            assert kind == ("text",)

            # 10,000 hashes deleted and 1,000 changed, spread over the whole table
            gone = [i for i in ids if i % 3 == 1][:10_000]
            changed = [i for i in ids if i % 3 == 2][::10][:1_000]
            assert not set(gone + changed) & set(first)
            client.delete(*[hash_name(settings, table, i) for i in gone])
            pipe = client.pipeline(transaction=False)
            for i in changed:
                pipe.hset(hash_name(settings, table, i), "name", "tampered")
            pipe.execute()
            held: dict[int, Any] = cache_table(client, settings, table, ids)
            assert len(held) == ROWS - 10_000
            assert sum(held[i]["name"] == "tampered" for i in changed) == 1_000

            result = repair(env, name)
            assert "backfilled 11000 keys" in result.stderr
            assert cache_table(client, settings, table, ids) == source
            assert stray_hashes(client, settings, table, set(ids)) == []
            # only the drifted keys went through the log again, not the whole table
            assert sorted(set(incremental_keys(settings, table))) == sorted(first + gone + changed)
            assert apply.poll() is None, "the apply job died"
        finally:
            if apply is not None and apply.poll() is None:
                os.killpg(apply.pid, signal.SIGINT)
                try:
                    apply.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(apply.pid, signal.SIGKILL)
                    apply.wait()
            log.seek(0)
            print(log.read().decode(errors="replace")[-4000:])


def test_a_backfill_takes_a_long_filter_and_keeps_its_or_within_the_chunks(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, note text)",
        "INSERT INTO {name} SELECT g, CASE WHEN g % 1000 = 1 THEN 'x' END "
        "FROM generate_series(1, 20000) g",
        prefix="bfw",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    env = cache_env(t)
    # about 100 KB of SQL (an argument of a command takes at most 128 KiB), with an OR at
    # its top level: Debezium appends the filter to its chunk query's bounds
    where = "id IN (" + ", ".join(str(i) for i in range(2, 30_001, 2)) + ") OR note = 'x'"
    assert len(where) > 90_000
    with psycopg.connect(dsn) as conn:
        matching = {r[0] for r in conn.execute(f"SELECT id FROM {name} WHERE {where}")}
    assert len(matching) == 10_020
    started = time.monotonic()
    result = run_cdc("backfill", name, "--where", where, env=env, timeout=420)
    print(f"cdc backfill --where: {time.monotonic() - started:.1f}s")
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"completed: {len(matching)} rows read" in result.stdout
    assert sorted(incremental_keys(settings, table)) == sorted(matching)

    bad = run_cdc("backfill", name, "--where", where + " AND nope > 1", env=env)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "is not a valid filter" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_signal_table_is_widened_without_waiting_long_for_its_lock(
    stack: RunningStack,
) -> None:
    schema = "sig_" + uuid.uuid4().hex[:8]
    table = f"{schema}.debezium_signal"
    dsn = stack.settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {table} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
            "data varchar(2048))"
        )
        conn.execute(f"INSERT INTO {table} VALUES ('1', 'log', 'kept')")
    try:
        with psycopg.connect(dsn) as holder, psycopg.connect(dsn) as conn:
            holder.execute(f"SELECT * FROM {table}")  # a transaction left open on the table
            started = time.monotonic()
            assert widen_signal_table(conn, table) is False
            assert time.monotonic() - started < 10
            assert signal_data_width(conn, table) == 2048
            assert conn.execute("SELECT current_setting('lock_timeout')").fetchone() == ("0",)
            holder.rollback()
            assert widen_signal_table(conn, table) is True
            assert signal_data_width(conn, table) is None
            assert widen_signal_table(conn, table) is True  # idempotent
            conn.commit()
        with psycopg.connect(dsn) as conn:
            assert conn.execute(
                "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = 'debezium_signal' AND column_name = 'data'",
                (schema,),
            ).fetchone() == ("text",)
            assert conn.execute(f"SELECT data FROM {table}").fetchall() == [("kept",)]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
