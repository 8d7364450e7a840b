"""The same job on a Spark cluster: a standalone master and two workers started here, the
snapshot and the apply job run by `cdc` with `spark.master=spark://…`, and every store
ends holding what a local-mode run of the same table gives. Stores read with redis-py,
OpenSearch over HTTP and a Delta reader of this test's own."""

from __future__ import annotations

import io
from collections.abc import Iterator

import psycopg
import pytest
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from tests.conftest import Capture, RunningStack
from tests.helpers import run_cdc
from tests.logcheck import pipeline_for, table_info, wait_until_equal
from tests.spark_cluster import WORKERS, SparkCluster, spark_cluster
from tests.stores import stores

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(stack: RunningStack) -> Iterator[SparkCluster]:
    with spark_cluster(stack.settings.java_home) as running:
        yield running


def test_snapshot_and_apply_on_a_cluster_give_the_local_runs_stores(
    captured: Capture, stack: RunningStack, cluster: SparkCluster
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL, amount numeric(12, 2), "
        "tags text[], seen timestamptz)",
        "INSERT INTO {name} SELECT g, 'row ' || g, g * 1.5, ARRAY['a', 'b' || g], "
        "'2026-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 600) g",
        prefix="cluster",
        snapshot=False,
    )
    cluster_env = {**t.env, **cluster.conf()}
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
    done = cluster.state()["completedapps"]
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
