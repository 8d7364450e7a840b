"""The cluster profile at scale (issue 68, `make test-scale`; outside CI's time): a Spark
standalone master and two one-core workers started from pyspark's own `spark-class`
(tests/spark_cluster.py), `cdc` run with `spark.master=spark://…`, so the profile is
`cluster`: no batch is collected to the driver and the executors write every store.

- Under load, with a worker SIGKILLed (and its executor) and started again, every store
  ends equal to the source, and the history holds one version per change.
- A catch-up of 300,000 changes over three tables succeeds with the driver taking at
  most 8 MiB of task results, the task results it took (Spark's own event log) stay
  under 1 MiB per 100,000 changes, every warehouse commit is Spark's, and both workers'
  executors ran its tasks.
- On object storage (S3Proxy, tests/s3_server.py): the snapshot writes the warehouse
  itself (Spark's commits, before any apply), then apply, verify and repair of drift
  another writer made, then delta-rs reads every row as PostgreSQL holds it.

Stores are read with the tests' own readers (tests/stores.py) or delta-rs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.stores.warehouse.tables import warehouse_root
from tests.conftest import Capture, RunningStack
from tests.contents import expected_cache
from tests.helpers import apply_process, run_cdc
from tests.logcheck import table_info, wait_until_equal
from tests.s3_server import s3_server
from tests.source_load import Writer
from tests.spark_cluster import SparkCluster, spark_cluster
from tests.stores import cache_contents, delta_tables, stores
from tests.survival import assert_nothing_lost_or_doubled

pytestmark = [pytest.mark.integration, pytest.mark.scale]


@pytest.fixture(scope="module")
def cluster(stack: RunningStack) -> Iterator[SparkCluster]:
    with spark_cluster(stack.settings.java_home) as running:
        yield running


def _ok(result: Any) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else ""


def test_under_load_with_a_worker_lost_every_store_ends_exact(
    captured: Capture, cluster: SparkCluster, tmp_path: Path
) -> None:
    rows = 3000
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        f"INSERT INTO {{name}} SELECT g, 0, 'seed' FROM generate_series(1, {rows}) g",
        prefix="scale",
        snapshot=False,
    )
    # the row stores shuffled by key into more tasks than the topic has partitions
    env = {
        **t.env,
        **cluster.conf(),
        "CDC_APPLY__PROFILE": "cluster",
        "CDC_APPLY__ROW_STORE_TASKS": "4",
    }
    _ok(run_cdc("snapshot", env=env, timeout=900))
    log = tmp_path / "apply.log"
    writer = Writer(t.dsn, t.table, first_new_id=rows + 1, max_id=rows, rate=40)
    with apply_process(env, ["cache", "search", "warehouse"], log=log) as apply:
        writer.start()
        time.sleep(60)  # batches on both executors
        apps = cluster.state()["activeapps"]
        assert len(apps) == 1, apps
        app = apps[0]["id"]
        killed = cluster.kill_worker(0)
        assert len(killed) >= 2, f"worker 0 ran no executor: {killed}"
        time.sleep(30)  # the load goes on with one executor
        cluster.start_worker(0)
        cluster.wait_alive(2)
        time.sleep(45)
        writer.stop.set()
        writer.join()
        assert writer.error is None, writer.error
        assert writer.commits > 2000, writer.commits
        # the cluster's apply job catches up by itself: the cache first, then every store
        expected = expected_cache(t.settings, t.table)
        deadline = time.monotonic() + 900
        while cache_contents(t.settings, t.table) != expected:
            assert apply.poll() is None, f"cdc apply exited {apply.returncode}: {_tail(log)}"
            assert time.monotonic() < deadline, "the cache did not catch up"
            time.sleep(5)
        time.sleep(20)
        assert apply.poll() is None, f"cdc apply exited {apply.returncode}: {_tail(log)}"
    # an apply of what is left (nothing, or the last batch) in the cluster profile
    _ok(run_cdc("apply", "--once", env=env, timeout=900))
    # the killed worker's executor, then the other and the new one, ran the job's tasks
    finished = cluster.finished_tasks(app)
    assert all(n > 0 for n in finished.values()), finished
    assert_nothing_lost_or_doubled(t.settings, t.table)


def test_a_catch_up_of_300k_changes_takes_no_rows_through_the_driver(
    captured: Capture, cluster: SparkCluster, tmp_path: Path
) -> None:
    """Two changes of 50,000 rows in each of three tables, and a tenth of them deleted:
    315,000 changes, applied by one `cdc apply --once`."""
    rows = 50_000
    t = captured(
        *(
            statement
            for part in "abc"
            for statement in (
                f"CREATE TABLE {{name}}_{part} (id int PRIMARY KEY, version int NOT NULL, "
                "note text)",
                f"INSERT INTO {{name}}_{part} SELECT g, 0, md5(g::text) "
                f"FROM generate_series(1, {rows}) g",
            )
        ),
        prefix="scale",
        tables=("public.{name}_a", "public.{name}_b", "public.{name}_c"),
        snapshot=False,
    )
    tables = [f"public.{t.name}_{part}" for part in "abc"]
    events = tmp_path / "events"
    events.mkdir()
    env = {
        **t.env,
        **cluster.conf(
            **{
                "spark.driver.maxResultSize": "8m",
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": f"file://{events}",
            }
        ),
    }
    _ok(run_cdc("snapshot", env=env, timeout=1800))
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        for table in tables:
            for _ in range(2):
                conn.execute(f"UPDATE {table} SET version = version + 1, note = md5(note)")
            conn.execute(f"DELETE FROM {table} WHERE id % 10 = 0")
    changes = 3 * (2 * rows + rows // 10)
    for table in tables:
        wait_until_equal(t.settings, table_info(t.settings, table), timeout=900)
    commits_before = _commits(t.settings)
    started = {p.name for p in events.iterdir()}
    result = run_cdc("apply", "--once", env=env, timeout=3600)
    _ok(result)

    made = {path: info for path, info in _commits(t.settings).items() if path not in commits_before}
    assert made, "the apply committed nothing to the warehouse"
    not_spark = {p: i.get("engineInfo") for p, i in made.items() if "Spark" not in str(i)}
    assert not not_spark, not_spark
    (event_log,) = [p for p in events.iterdir() if p.name not in started]
    # Spark 4 writes a rolling log: a folder eventlog_v2_<app> of zstd-compressed files
    app = event_log.name.removeprefix("eventlog_v2_").split(".")[0]
    finished = cluster.finished_tasks(app)
    assert all(n > 0 for n in finished.values()), finished
    # what the executors sent the driver as task results, by Spark's own account
    result_bytes = _task_result_bytes(event_log)
    per_100k = result_bytes * 100_000 / changes
    print(f"task results: {result_bytes} bytes for {changes} changes, {per_100k:.0f} per 100k")
    assert per_100k <= 1 << 20, f"{per_100k:.0f} bytes of task results per 100,000 changes"
    for table in tables:
        with psycopg.connect(t.dsn) as conn:
            source = {
                r[0]: (r[1], r[2])
                for r in conn.execute(f"SELECT id, version, note FROM {table}").fetchall()
            }
        assert len(source) == rows - rows // 10
        for store, found in stores(t.settings, table).items():
            # the cache holds text: each value read back as the column's type
            assert {k: (int(v["version"]), v["note"]) for k, v in found.items()} == source, store


def test_on_object_storage_snapshot_apply_verify_and_repair(
    captured: Capture, cluster: SparkCluster, tmp_path: Path
) -> None:
    """The warehouse and the checkpoints in a bucket of S3Proxy, written by the
    executors (the snapshot's rows by the snapshot itself); another writer (delta-rs)
    deletes and changes rows of `current`; `cdc verify` names them, `cdc verify --repair`
    mends them through the running apply job; delta-rs reads every row as PostgreSQL
    holds it."""
    from deltalake import DeltaTable

    with s3_server() as s3:
        s3.make_bucket("lake")
        t = captured(
            "CREATE TABLE {name} (id int PRIMARY KEY, note text, n bigint)",
            "INSERT INTO {name} SELECT g, 'row ' || g, g * 10 FROM generate_series(1, 2000) g",
            prefix="scale",
            snapshot=False,
        )
        prefix = t.settings.pipeline.topic_prefix
        schema, name = t.table.split(".", 1)
        current = f"s3://lake/cdc/{prefix}/{schema}/{name}/current"
        # the streaming queries' checkpoints in the bucket too, as on a cluster whose
        # workers share no folder
        env = {
            **t.env,
            **cluster.conf(),
            **s3.warehouse_env("lake"),
            "CDC_APPLY__CHECKPOINTS": "s3://lake/checkpoints",
        }
        # delta-rs writes here as another writer would: no lock of S3's
        options = {**s3.delta_rs_options(), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
        config = json.loads(run_cdc("config", "--output", "json", env=env).stdout)
        assert config["profile_in_use"]["name"] == "cluster", config["profile_in_use"]
        _ok(run_cdc("snapshot", env=env, timeout=900))
        # the snapshot wrote the warehouse itself, by the executors: every row is there
        # before any apply ran, and each commit is Spark's
        assert _delta_rs(current, options) == _source(t.dsn, t.table)
        delta_log = s3.folder / "lake" / "cdc" / prefix / schema / name / "current" / "_delta_log"
        made = [
            json.loads(line)["commitInfo"]
            for commit in sorted(delta_log.glob("*.json"))
            for line in commit.read_text().splitlines()
            if '"commitInfo"' in line
        ]
        assert made and all("Spark" in str(c.get("engineInfo")) for c in made), made
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {t.table} SET n = n + 1 WHERE id % 3 = 0")
            conn.execute(f"DELETE FROM {t.table} WHERE id % 13 = 0")
        _ok(run_cdc("apply", "--once", env=env, timeout=900))
        assert _delta_rs(current, options) == _source(t.dsn, t.table)
        commits = s3.folder / "lake" / "checkpoints" / t.settings.pipeline.name / "warehouse"
        assert any(p.name.isdigit() for p in (commits / "commits").iterdir())
        # another writer: 5 rows gone, 3 changed
        lake = DeltaTable(current, storage_options=options)
        lake.delete("id IN (1, 2, 4, 5, 7)")
        lake.update({"note": "'tampered'"}, predicate="id IN (10, 11, 12)")
        # the running apply job and verify are two applications of the cluster: each
        # takes one worker's core (Spark's standalone master gives an application every
        # core it may take, and the other would wait for executors)
        env = {**env, **cluster.conf(**{"spark.cores.max": "1"})}
        log = tmp_path / "apply.log"
        with apply_process(env, ["warehouse"], log=log) as apply:
            found = run_cdc("verify", "--store", "warehouse", "--output", "json", env=env)
            assert found.returncode == 1, found.stdout[-2000:] + found.stderr[-2000:]
            (drift,) = [d for d in json.loads(found.stdout)["results"] if d["table"] == t.table]
            assert len(drift["missing"]) == 5 and len(drift["different"]) == 3, drift
            mended = run_cdc("verify", "--store", "warehouse", "--repair", env=env, timeout=900)
            assert apply.poll() is None, f"cdc apply exited {apply.returncode}: {_tail(log)}"
            _ok(mended)
        assert _delta_rs(current, options) == _source(t.dsn, t.table)


def _source(dsn: str, table: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: tuple(r) for r in conn.execute(f"SELECT id, note, n FROM {table}")}


def _delta_rs(path: str, options: dict[str, str]) -> dict[int, tuple[Any, ...]]:
    from deltalake import DeltaTable

    rows = DeltaTable(path, storage_options=options).to_pyarrow_table(columns=["id", "note", "n"])
    return {r["id"]: (r["id"], r["note"], r["n"]) for r in rows.to_pylist()}


def _task_result_bytes(event_log: Path) -> int:
    """The sum of every finished task's result size in a Spark event log: one file, or
    Spark 4's rolling folder of event files (zstd-compressed by default)."""
    import io

    import zstandard

    files = sorted(event_log.glob("events_*")) if event_log.is_dir() else [event_log]
    total = 0
    for path in files:
        with path.open("rb") as raw:
            stream: Any = raw
            if path.suffix == ".zstd":
                stream = zstandard.ZstdDecompressor().stream_reader(raw)
            for line in io.TextIOWrapper(stream, encoding="utf-8"):
                if '"SparkListenerTaskEnd"' in line:
                    metrics = json.loads(line).get("Task Metrics") or {}
                    total += int(metrics.get("Result Size", 0))
    return total


def _commits(settings: Any) -> dict[str, dict[str, Any]]:
    """Every commit in the pipeline's warehouse folder, by its file, with its commitInfo
    (read from the Delta log's JSON, not through the pipeline)."""
    commits = {}
    for table in delta_tables(warehouse_root(settings)):
        for entry in sorted((table / "_delta_log").glob("*.json")):
            for line in entry.read_text().splitlines():
                action = json.loads(line)
                if "commitInfo" in action:
                    commits[str(entry)] = action["commitInfo"]
    return commits
