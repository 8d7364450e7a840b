"""Pipelines on two databases of one local stack: `cdc up` under the second database's
settings admits it (its replication role reaches it), and the first database's pipeline
streams on, its role still admitted; PostgreSQL restarted under either database's
settings admits both, and both connectors stream on; the roles still reach no other
database."""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from cdc.capture.connect_client import connect_client
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.capture.source_setup import replication_dsn
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, wait_for_records
from cdc.stack.components.postgres import Postgres
from tests.conftest import Capture, RunningStack
from tests.helpers import run_cdc
from tests.logcheck import pipeline_for

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_a_pipeline_on_a_second_database_streams_beside_the_first(
    stack: RunningStack, captured: Capture
) -> None:
    first = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, v text)",
        "INSERT INTO {name} VALUES (1, 'a')",
        prefix="first",
    )
    database = f"second_{uuid.uuid4().hex[:8]}"
    up = run_cdc("up", env={**stack.env, "CDC_POSTGRES__DATABASE": database})
    assert up.returncode == 0, up.stderr
    base = stack.settings.model_copy(
        update={"postgres": stack.settings.postgres.model_copy(update={"database": database})}
    )
    second = pipeline_for(base, ["public.items"])
    try:
        with psycopg.connect(second.postgres.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
            conn.execute("INSERT INTO items VALUES (1, 'x')")
        run_snapshot(second, Console(file=io.StringIO()))
        with psycopg.connect(second.postgres.dsn(), autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (2, 'streamed')")
        topic = change_topic(second.pipeline, "public.items")
        records = wait_for_records(second.kafka, topic, 2, timeout=120)
        assert sorted(r.key["id"] for r in records) == [1, 2]  # snapshot, then the stream

        # the first database's pipeline streams on: its role is still admitted
        with psycopg.connect(first.dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {first.name} VALUES (2, 'b')")
        topic = change_topic(first.settings.pipeline, first.table)
        records = wait_for_records(first.settings.kafka, topic, 2, timeout=120)
        assert sorted(r.key["id"] for r in records) == [1, 2]
        for settings in (first.settings, second):
            psycopg.connect(replication_dsn(settings, replication=True)).close()

        # PostgreSQL restarted under each database's settings in turn: both stream on
        expected = {first.table: 2, "public.items": 2}
        pipelines = {first.table: first.settings, "public.items": second}
        for n, (env, restarted) in enumerate(
            [({"CDC_POSTGRES__DATABASE": database}, second), ({}, first.settings)], start=3
        ):
            assert Postgres(restarted).stop()
            up = run_cdc("up", env={**stack.env, **env})
            assert up.returncode == 0, up.stderr
            for table, settings in pipelines.items():
                with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
                    name = table.split(".", 1)[1]
                    conn.execute(f"INSERT INTO {name} VALUES ({n}, 'after a restart')")
                expected[table] += 1
                topic = change_topic(settings.pipeline, table)
                records = wait_for_records(settings.kafka, topic, expected[table], timeout=180)
                keys = {r.key["id"] for r in records}
                assert keys == set(range(1, n + 1)), (
                    table,
                    sorted(keys),
                    connect_client(settings).status(settings.pipeline.connector),
                )
            for settings in (first.settings, second):
                assert_running(settings)
        # and the replication roles reach no database without a pipeline
        other = second.model_copy(
            update={"postgres": second.postgres.model_copy(update={"database": "postgres"})}
        )
        with pytest.raises(psycopg.OperationalError, match=r"pg_hba\.conf|rejects"):
            psycopg.connect(replication_dsn(other), connect_timeout=5).close()
    finally:
        drop_pipeline(second)
        with psycopg.connect(stack.settings.postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


def assert_running(settings: Settings) -> None:
    status = connect_client(settings).status(settings.pipeline.connector)
    states = [status["connector"]["state"], *(t["state"] for t in status["tasks"])]
    assert set(states) == {"RUNNING"}, (settings.pipeline.connector, states)
