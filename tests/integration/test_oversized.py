"""kafka.oversized: a 20 MB row (over the 16 MiB default of kafka.max_message_bytes)
beside a table under load. `stop` (the default) holds every table until the limit is
raised; `dead_letter` sends the event's key, position and size to the dead-letter topic,
capture of the rest goes on, `cdc verify` lists the key, and `cdc dlq replay` finishes
it once the limit is raised."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.capture.connect_client import connect_client
from cdc.capture.pipeline import sync_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.dead_letters import replay_dead_letters
from cdc.check.status import pipeline_status
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, dead_letter_topic, end_offsets, read_topic
from tests.conftest import Capture, Captured
from tests.helpers import run_cdc, steady_updates
from tests.logcheck import poll
from tests.stores import cache

pytestmark = pytest.mark.integration

# about 20 MB of text (md5 hex words), over the 16 MiB default
HUGE = "(SELECT string_agg(md5(g::text), ' ') FROM generate_series(1, 600000) g)"


def with_kafka(settings: Settings, **kafka: Any) -> Settings:
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update=kafka)})


def two_tables(captured: Capture, prefix: str) -> Captured:
    return captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} VALUES (1, 'small'), (2, 'small')",
        "CREATE TABLE {name}_load (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name}_load SELECT g, 0 FROM generate_series(1, 20) g",
        prefix=prefix,
        tables=("public.{name}", "public.{name}_load"),
        snapshot=False,
    )


def grows(settings: Settings, topic: str, seconds: float = 20.0) -> bool:
    """Whether the topic takes new records within `seconds`."""
    before = sum(end_offsets(settings.kafka, [topic])[topic].values())

    def more() -> bool:
        return sum(end_offsets(settings.kafka, [topic])[topic].values()) > before

    try:
        poll(more, seconds, f"{topic} to grow")
    except AssertionError:
        return False
    return True


def test_dead_letter_holds_the_row_back_and_capture_goes_on(captured: Capture) -> None:
    t = two_tables(captured, "held")
    settings = with_kafka(t.settings, oversized="dead_letter")
    run_snapshot(settings, Console(file=io.StringIO()))
    stop = threading.Event()
    writer = threading.Thread(
        target=steady_updates, args=(t.dsn, f"{t.name}_load", 20, stop), daemon=True
    )
    writer.start()
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {t.name} SET body = {HUGE} WHERE id = 1")
            conn.execute(f"UPDATE {t.name} SET body = 'after' WHERE id = 2")
            size = conn.execute(f"SELECT length(body) FROM {t.name} WHERE id = 1").fetchone()
        assert size is not None and size[0] > 17 * 1024 * 1024
        topic = change_topic(settings.pipeline, t.table)

        def letters() -> list[dict[str, Any]]:
            found = read_topic(settings.kafka, dead_letter_topic(settings.pipeline))
            return [r.value for r in found if r.value and r.value.get("store") == "capture"]

        poll(lambda: bool(letters()), 120, "the oversized event's dead letter")
        (letter,) = letters()
        assert letter["topic"] == topic and json.loads(letter["key"]) == {"id": 1}
        assert letter["size"] > 17 * 1024 * 1024 and letter["position"]["op"] == "u"
        assert letter["position"]["lsn"] > 0 and letter["value"] is None
        # capture went on: the table's next change, and the other table under load
        poll(
            lambda: any(
                r.key == {"id": 2} and r.value and r.value["after"]["body"] == "after"
                for r in read_topic(settings.kafka, topic)
            ),
            60,
            "the change after the oversized one",
        )
        assert grows(settings, change_topic(settings.pipeline, f"{t.table}_load"))
        connector = pipeline_status(settings).connector or {}
        assert connector.get("tasks") == ["RUNNING"], connector
    finally:
        stop.set()
        writer.join(timeout=30)

    run_apply(settings, ["cache"], once=True)
    assert cache(settings, t.table, "id")[1]["body"] == "small"  # held back, as it was
    shown = run_cdc("verify", "--store", "cache", "--table", t.table, env=t.env)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    said = " ".join(shown.stdout.split())
    assert "held back by the capture" in said and t.table in said and '{"id":1}' in said

    # the limit raised (`cdc setup`), then `cdc dlq replay`: the row arrives whole
    raised = with_kafka(settings, max_message_bytes=32 * 1024 * 1024)
    sync_pipeline(raised)
    assert replay_dead_letters(raised, ["cache"], lambda _: None) == {t.table: 1}
    run_apply(raised, ["cache"], once=True)
    rows = cache(raised, t.table, "id")
    assert len(rows[1]["body"]) == size[0] and rows[2]["body"] == "after"
    shown = run_cdc("verify", "--store", "cache", "--table", t.table, env=t.env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "held back" not in shown.stdout


# the long form of test_large_rows.py's stop (under load, 20 MB): in `make test-long`
@pytest.mark.long
def test_stop_holds_every_table_until_the_limit_is_raised(captured: Capture) -> None:
    t = two_tables(captured, "stop")
    settings = t.settings  # kafka.oversized = "stop", the default
    run_snapshot(settings, Console(file=io.StringIO()))
    stop = threading.Event()
    writer = threading.Thread(
        target=steady_updates, args=(t.dsn, f"{t.name}_load", 20, stop), daemon=True
    )
    writer.start()
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {t.name} SET body = {HUGE} WHERE id = 1")

        def error() -> str | None:
            return (pipeline_status(settings).connector or {}).get("error")

        poll(lambda: error() is not None, 120, "the task to stop")
        said = str(error())
        assert "kafka.max_message_bytes" in said and 'kafka.oversized = "dead_letter"' in said
        load_topic = change_topic(settings.pipeline, f"{t.table}_load")
        assert not grows(settings, load_topic, 10)  # every table waits, nothing skipped
        assert not read_topic(settings.kafka, dead_letter_topic(settings.pipeline))

        sync_pipeline(with_kafka(settings, max_message_bytes=32 * 1024 * 1024))
        assert grows(settings, load_topic, 120)  # capture resumed at the event
        poll(
            lambda: any(
                r.key == {"id": 1} and r.value and r.value["op"] == "u"
                for r in read_topic(settings.kafka, change_topic(settings.pipeline, t.table))
            ),
            120,
            "the oversized event itself",
        )
        status = connect_client(settings).status(settings.pipeline.connector)
        assert [task["state"] for task in status["tasks"]] == ["RUNNING"]
    finally:
        stop.set()
        writer.join(timeout=30)
