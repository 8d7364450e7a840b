"""The same job on a Spark cluster: a standalone master and two workers started here, the
snapshot and the apply job run by `cdc` with `spark.master=spark://…`, and every store
ends holding what a local-mode run of the same table gives. Stores read with redis-py,
OpenSearch over HTTP and a Delta reader of this test's own."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyspark
import pytest
import requests
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.capture.initial_snapshot import run_snapshot
from cdc.capture.pipeline import drop_pipeline
from cdc.stores.warehouse.tables import warehouse_root
from tests.conftest import Capture, RunningStack
from tests.helpers import free_ports, run_cdc
from tests.logcheck import pipeline_for, table_info, wait_until_equal
from tests.stores import delta_tables, stores

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

WORKERS = 2


@pytest.fixture(scope="module")
def spark_cluster(stack: RunningStack) -> Iterator[tuple[str, str, Path]]:
    """A Spark standalone master and two one-core workers on free ports: the master's URL,
    its web UI's, and the folder holding each worker's (`worker-<n>`)."""
    home = Path(pyspark.__file__).parent
    work = Path(tempfile.mkdtemp(prefix="cdc-spark-cluster-"))
    master_port, master_ui, *worker_ui = free_ports(2 + WORKERS)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "JAVA_HOME": str(stack.settings.java_home),
        "SPARK_LOG_DIR": str(work),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    url = f"spark://127.0.0.1:{master_port}"
    daemon = [str(home / "bin" / "spark-class")]
    commands = [
        [
            *daemon,
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(master_ui)),
        ]
    ] + [
        [
            *daemon,
            "org.apache.spark.deploy.worker.Worker",
            *("--cores", "1", "--memory", "1g", "--webui-port", str(port)),
            *("--work-dir", str(work / f"worker-{n}"), url),
        ]
        for n, port in enumerate(worker_ui)
    ]
    processes = []
    try:
        for n, command in enumerate(commands):
            log = (work / f"daemon-{n}.log").open("w")
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + 120
        while True:
            try:
                state = requests.get(f"http://127.0.0.1:{master_ui}/json/", timeout=5).json()
                if state.get("aliveworkers") == WORKERS:
                    break
            except (requests.RequestException, ValueError):
                pass
            assert time.monotonic() < deadline, f"the workers did not register; see {work}"
            assert all(p.poll() is None for p in processes), f"a daemon died; see {work}"
            time.sleep(1)
        yield url, f"http://127.0.0.1:{master_ui}", work
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def test_snapshot_and_apply_on_a_cluster_give_the_local_runs_stores(
    captured: Capture, stack: RunningStack, spark_cluster: tuple[str, str, Path]
) -> None:
    master, ui, _ = spark_cluster
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL, amount numeric(12, 2), "
        "tags text[], seen timestamptz)",
        "INSERT INTO {name} SELECT g, 'row ' || g, g * 1.5, ARRAY['a', 'b' || g], "
        "'2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 600) g",
        prefix="cluster",
        snapshot=False,
    )
    cluster_env = {
        **t.env,
        "CDC_SPARK__MASTER": master,
        # one one-core executor per worker: the batch's tasks spread over both
        "CDC_SPARK__CONF": json.dumps(
            {"spark.executor.memory": "640m", "spark.executor.cores": "1", "spark.cores.max": "2"}
        ),
    }
    result = run_cdc("snapshot", env=cluster_env, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET name = 'changed ' || id WHERE id % 7 = 0")
        conn.execute(f"DELETE FROM {t.name} WHERE id % 11 = 0")
        conn.execute(
            f"INSERT INTO {t.name} SELECT g, 'late ' || g, NULL, NULL, now() "
            "FROM generate_series(601, 700) g"
        )
    wait_until_equal(t.settings, table_info(t.settings, t.table))
    result = run_cdc("apply", "--once", env=cluster_env, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # both ran on the cluster: the master lists them, each given the workers' cores
    done = requests.get(f"{ui}/json/", timeout=10).json()["completedapps"]
    assert len(done) >= 2 and all(app["cores"] == WORKERS for app in done), done

    # the same table, another pipeline, in local mode in this process
    local = pipeline_for(stack.settings, [t.table])
    try:
        run_snapshot(local, Console(file=io.StringIO()))
        run_apply(local, once=True)
        on_cluster, in_local_mode = stores(t.settings, t.table), stores(local, t.table)
    finally:
        drop_pipeline(local)
    with psycopg.connect(t.dsn) as conn:
        count = conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()
    assert count is not None and count[0] == 700 - 600 // 11
    for store in ("cache", "search", "warehouse"):
        assert len(on_cluster[store]) == count[0], store
        assert on_cluster[store] == in_local_mode[store], store


def test_the_cluster_profile_writes_on_the_executors_and_collects_no_rows(
    captured: Capture, spark_cluster: tuple[str, str, Path]
) -> None:
    """A catch-up of 150,000 changes over three tables in the cluster profile (the master
    is not local): it succeeds with the driver taking at most 8 MiB of task results, every
    warehouse commit it makes is Spark's (none is delta-rs's, which would mean the rows
    went through the driver), the executors on both workers ran its tasks, and every store
    holds what PostgreSQL holds."""
    master, ui, work = spark_cluster
    rows = 25_000
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
    cluster_env = {
        **t.env,
        "CDC_SPARK__MASTER": master,
        "CDC_SPARK__CONF": json.dumps(
            {
                "spark.executor.memory": "640m",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                "spark.driver.maxResultSize": "8m",
            }
        ),
    }
    result = run_cdc("snapshot", env=cluster_env, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        for table in tables:
            for _ in range(2):  # two changes of every row: 150,000 in all
                conn.execute(f"UPDATE {table} SET version = version + 1, note = md5(note)")
            conn.execute(f"DELETE FROM {table} WHERE id % 10 = 0")
    for table in tables:
        wait_until_equal(t.settings, table_info(t.settings, table), timeout=600)
    commits_before = _commits(t.settings)
    result = run_cdc("apply", "--once", env=cluster_env, timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    made = {path: info for path, info in _commits(t.settings).items() if path not in commits_before}
    assert made, "the apply committed nothing to the warehouse"
    not_spark = {p: i.get("engineInfo") for p, i in made.items() if "Spark" not in str(i)}
    assert not not_spark, not_spark
    # the apply's application: the last the master lists; each worker's executor ran tasks
    apps = requests.get(f"{ui}/json/", timeout=10).json()["completedapps"]
    apply_app = max(apps, key=lambda app: app["starttime"])["id"]
    for worker in sorted(work.glob("worker-*")):
        logs = list((worker / apply_app).glob("*/stderr"))
        finished = sum(log.read_text(errors="replace").count("Finished task") for log in logs)
        assert finished > 0, f"{worker.name} ran no task of {apply_app}"
    for table in tables:
        with psycopg.connect(t.dsn) as conn:
            source = {
                r[0]: (r[1], r[2])
                for r in conn.execute(f"SELECT id, version, note FROM {table}").fetchall()
            }
        assert len(source) == rows - rows // 10
        held = stores(t.settings, table)
        for store, found in held.items():
            # the cache holds text: each value read back as the column's type
            assert {k: (int(v["version"]), v["note"]) for k, v in found.items()} == source, store


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
