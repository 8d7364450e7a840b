"""A generated column: PostgreSQL 15 publishes no value for it, so the snapshot leaves it
out too, and every store holds the same columns for snapshot and streamed rows; verify
finds the stores in sync. (Before, the snapshot wrote the value and the stream did not.)"""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest
from rich.console import Console

from cdc.pipeline import drop_pipeline
from cdc.topics import read_topic
from materializers.apply import run_apply
from materializers.verify import verify
from snapshot.initial import run_snapshot
from tests.conftest import RunningStack
from tests.logcheck import pipeline_for, table_info, wait_until_equal

pytestmark = pytest.mark.integration


def test_a_generated_column_is_left_out_alike(stack: RunningStack) -> None:
    name = "gen_" + uuid.uuid4().hex[:8]
    table = f"public.{name}"
    settings = pipeline_for(stack.settings, [table])
    dsn = settings.postgres.dsn()
    stores = ["cache", "search", "warehouse"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY, a int, "
            "doubled int GENERATED ALWAYS AS (a * 2) STORED)"
        )
        conn.execute(f"INSERT INTO {name} (id, a) SELECT g, g FROM generate_series(1, 10) g")
    try:
        run_snapshot(settings, Console(file=io.StringIO()))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {name} (id, a) VALUES (11, 11)")
            conn.execute(f"UPDATE {name} SET a = 100 WHERE id <= 3")
        info = table_info(settings, table)
        assert [c.name for c in info.columns] == ["id", "a"]
        wait_until_equal(settings, info)
        images = [
            set((r.value or {}).get("after") or {})
            for r in read_topic(settings.kafka.bootstrap_servers, settings.pipeline.topic(table))
        ]
        assert images and all(i <= {"id", "a"} for i in images), images
        run_apply(settings, stores, once=True)
        results = verify(settings, [info], stores, timeout=60)
        assert [(d.store, d.ok, d.store_rows) for d in results] == [
            (s, True, 11) for s in stores
        ], [(d.store, d.different[:3]) for d in results]
    finally:
        drop_pipeline(settings)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
