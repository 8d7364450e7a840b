"""Operating a pipeline: an interrupted snapshot, adding and removing tables, pausing backfills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from pydantic import SecretStr

from cdc.capture.backfill import send_signal, start_backfill, watch_backfill
from cdc.capture.connect_client import connect_client
from cdc.capture.pipeline import sync_pipeline
from cdc.check.status import pipeline_status
from cdc.core.topics import change_topic, end_offsets
from tests.conftest import Capture, Captured
from tests.helpers import ROOT, run_cdc
from tests.logcheck import events_by_key, poll, table_info, wait_until_equal

pytestmark = pytest.mark.integration


def table_sql(rows: int, name: str = "{name}") -> list[str]:
    return [
        f"CREATE TABLE {name} (id int PRIMARY KEY, note text)",
        f"INSERT INTO {name} SELECT g, md5(g::text) FROM generate_series(1, {rows}) g",
        f"ANALYZE {name}",
    ]


def env_for(t: Captured) -> dict[str, str]:
    pages = t.settings.pipeline.snapshot_pages_per_reader
    return {**t.env, "CDC_PIPELINE__SNAPSHOT_PAGES_PER_READER": str(pages)}


@pytest.mark.long
def test_an_interrupted_snapshot_is_never_taken_for_complete_and_reruns_cleanly(
    captured: Capture,
) -> None:
    t = captured(*table_sql(300_000), prefix="intr", snapshot=False, snapshot_pages_per_reader=8)
    name, settings = t.name, t.settings
    topic = change_topic(settings.pipeline, f"public.{name}")
    env = {**os.environ, **env_for(t)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc", "snapshot"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def some_rows_written() -> bool:
            try:
                return sum(end_offsets(settings.kafka, [topic])[topic].values()) > 0
            except Exception:
                return False

        poll(some_rows_written, 180, "the snapshot to write rows")
        os.killpg(proc.pid, signal.SIGKILL)  # the snapshot and its Spark JVM, mid-copy
        proc.wait()
        status = pipeline_status(settings, [f"public.{name}"])
        assert status.snapshot == "running" and status.connector is None
        partial = sum(end_offsets(settings.kafka, [topic])[topic].values())
        assert partial > 0
        # its slot gone (a DBA dropped it): nothing to resume from, so the rerun starts
        # again (test_snapshot_resume.py resumes one whose slot is kept)
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            poll(
                lambda: (
                    conn.execute(
                        "SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s",
                        (settings.pipeline.slot,),
                    ).fetchone()
                    == (True,)
                ),
                60,
                "the killed snapshot's slot to be released",
            )
            conn.execute("SELECT pg_drop_replication_slot(%s)", (settings.pipeline.slot,))

        result = run_cdc("snapshot", env=env_for(t))
        assert result.returncode == 0, result.stderr
        assert "interrupted snapshot" in result.stderr and "starting again" in result.stderr
        assert pipeline_status(settings, [f"public.{name}"]).snapshot == "done"
        table = table_info(settings, f"public.{name}")
        _, records = wait_until_equal(settings, table)
        # what the killed run wrote is gone: one snapshot event per row
        assert len(records) == 300_000
        assert all(len(events) == 1 for events in events_by_key(records).values())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_adding_a_table_captures_and_backfills_it_and_removing_stops_it(
    captured: Capture,
) -> None:
    # the pipeline captures the first table; the second is made beside it, not captured
    t = captured(*table_sql(100), *table_sql(5000, "{name}_b"), prefix="add")
    first, second, settings = t.name, f"{t.name}_b", t.settings
    both = settings.model_copy(
        update={
            "pipeline": settings.pipeline.model_copy(
                update={"tables": [f"public.{first}", f"public.{second}"]}
            )
        }
    )
    result = sync_pipeline(both)
    assert result.added == [f"public.{second}"] and result.backfills == [f"public.{second}"]
    with psycopg.connect(both.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"UPDATE {second} SET note = 'changed' WHERE id <= 10")
        conn.execute(f"INSERT INTO {second} VALUES (999999, 'new')")
    wait_until_equal(both, table_info(both, f"public.{second}"), timeout=120)
    wait_until_equal(both, table_info(both, f"public.{first}"))

    result = sync_pipeline(settings)  # back to the first table only
    assert result.removed == [f"public.{second}"]
    topic = change_topic(both.pipeline, f"public.{second}")
    before = end_offsets(both.kafka, [topic])[topic]
    with psycopg.connect(both.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"UPDATE {second} SET note = 'unseen'")
        conn.execute(f"INSERT INTO {first} VALUES (424242, 'still captured')")
    wait_until_equal(settings, table_info(settings, f"public.{first}"))
    assert end_offsets(both.kafka, [topic])[topic] == before


def test_a_backfill_can_be_paused_resumed_and_stopped(captured: Capture) -> None:
    t = captured(*table_sql(200_000), prefix="pause")
    name, settings = t.name, t.settings
    _, offset = start_backfill(settings, name)
    seen: list[str] = []
    paused = False

    def on(progress) -> None:  # type: ignore[no-untyped-def]
        nonlocal paused
        seen.append(progress.state)
        if progress.state == "IN_PROGRESS" and not paused:
            paused = True
            send_signal(settings, "pause-snapshot", {"type": "incremental"})
        elif progress.state == "PAUSED":
            time.sleep(2)
            send_signal(settings, "resume-snapshot", {"type": "incremental"})

    done = watch_backfill(settings, offset, on, timeout=300)
    assert done.state == "COMPLETED"
    assert seen.index("PAUSED") < seen.index("RESUMED")

    # the stop follows the start in the signal table: Debezium takes it once it has
    # read the first of the table's chunks (a stop sent later may find it finished)
    _, offset = start_backfill(settings, name)
    send_signal(
        settings,
        "stop-snapshot",
        {"type": "incremental", "data-collections": [f"public.{name}"]},
    )
    with pytest.raises(Exception, match="stopped before it finished"):
        watch_backfill(settings, offset, lambda _: None, timeout=300)


def test_drop_asks_before_it_removes_anything(captured: Capture) -> None:
    t = captured(
        *table_sql(10),
        prefix="drop",
        replication_password=SecretStr("pw-drop_" + uuid.uuid4().hex[:8]),
    )
    name, settings = t.name, t.settings
    # the connector's password is a file reference, not the secret itself
    config = connect_client(settings).config(settings.pipeline.connector)
    secret = settings.pipeline.replication_password.get_secret_value()
    assert config["database.password"].startswith("${file:")
    assert secret not in json.dumps(config)
    env = env_for(t)
    refused = run_cdc("drop", env=env)  # no TTY, no --yes
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert pipeline_status(settings).connector is not None
    done = run_cdc("drop", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    status = pipeline_status(settings, [f"public.{name}"])
    assert status.connector is None and status.slot is None and status.snapshot == "none"
