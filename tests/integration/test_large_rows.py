"""A row of several MB moves through every part: the snapshot's Kafka writer, Debezium's
producer, the topics and the local broker are all set to `kafka.max_message_bytes`
(16 MiB by default, against Kafka's 1 MiB), and every store takes the row whole (read
with the tests' own readers)."""

from __future__ import annotations

import io

import psycopg
import pytest
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.capture.pipeline import sync_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.status import pipeline_status
from cdc.core.topics import change_topic, read_topic, wait_for_records
from tests.conftest import Capture
from tests.logcheck import poll
from tests.stores import cache, stores

pytestmark = pytest.mark.integration

# about 3.3 MB of words (md5 hex, 32 characters each, compressing poorly)
BIG = "(SELECT string_agg(md5(g::text || {seed}), ' ') FROM generate_series(1, 100000) g)"


def test_a_row_of_several_mb_reaches_every_store(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} VALUES (1, " + BIG.format(seed=1) + "), (2, 'small')",
        prefix="big",
    )
    with psycopg.connect(t.dsn, autocommit=True) as conn:  # the stream carries one too
        conn.execute(f"UPDATE {t.name} SET body = {BIG.format(seed=2)} WHERE id = 2")
        sizes = dict(conn.execute(f"SELECT id, length(body) FROM {t.name}").fetchall())
    assert min(sizes.values()) > 3_000_000
    records = wait_for_records(t.settings.kafka, change_topic(t.settings.pipeline, t.table), 3)
    assert len(records) == 3 and max(len(r.value_bytes or b"") for r in records) > 3_000_000
    run_apply(t.settings, ["cache", "search", "warehouse"], once=True)
    for store, rows in stores(t.settings, t.table).items():
        assert {k: len(r["body"]) for k, r in rows.items()} == sizes, store


def test_an_event_over_the_limit_stops_capture_loudly_and_a_higher_limit_resumes_it(
    captured: Capture,
) -> None:
    """Nothing is skipped: the task stops at the event (the slot keeps the WAL), `cdc
    status` says which setting to raise, and after `cdc setup` with a higher limit the
    event and every change after it arrive."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text)",
        "INSERT INTO {name} VALUES (1, 'small'), (2, 'small')",
        prefix="over",
        snapshot=False,
    )
    kafka = t.settings.kafka
    small = t.settings.model_copy(
        update={"kafka": kafka.model_copy(update={"max_message_bytes": 1024 * 1024})}
    )
    run_snapshot(small, Console(file=io.StringIO()))
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET body = {BIG.format(seed=3)} WHERE id = 1")
        conn.execute(f"UPDATE {t.name} SET body = 'after' WHERE id = 2")

    def error() -> str | None:
        return (pipeline_status(small).connector or {}).get("error")

    poll(lambda: error() is not None, 120, "the task to stop")
    said = str(error())
    assert "kafka.max_message_bytes (1048576 bytes)" in said and "`cdc setup`" in said, said
    topic = change_topic(t.settings.pipeline, t.table)
    assert len(read_topic(kafka, topic)) == 2  # the snapshot's rows; nothing skipped past

    sync_pipeline(t.settings)  # `cdc setup` with the default limit, 16 MiB
    records = wait_for_records(kafka, topic, 4, timeout=120)
    assert sorted(r.key["id"] for r in records if r.value and r.value["op"] == "u") == [1, 2]
    run_apply(t.settings, ["cache"], once=True)
    rows = cache(t.settings, t.table, "id")
    assert len(rows[1]["body"]) > 3_000_000 and rows[2]["body"] == "after"
