"""A catch-up batch (a store far behind the log) is written in bulk: OpenSearch's indexes
are not refreshed during it, and get their refresh interval back, refreshed, before the
batch commits; a job stopped during such a batch leaves nothing behind at its restart.
Read with this test's own OpenSearch client, searching without a refresh of its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

import cdc.apply.batch
from cdc.apply.job import run_apply
from cdc.core.topics import change_topic, end_offsets
from cdc.log.progress import read_progress
from cdc.stores.search.store import SearchStore, index_name
from cdc.stores.warehouse.settings import with_warehouse
from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture, Captured
from tests.stores import opensearch_reader, warehouse_rows

pytestmark = pytest.mark.integration


def refresh_interval(client: object, index: str) -> str | None:
    found = client.indices.get_settings(index=index, name="index.refresh_interval")  # type: ignore[attr-defined]
    return found.get(index, {}).get("settings", {}).get("index", {}).get("refresh_interval")


def update(t: Captured, change: str, rows: int) -> None:
    """UPDATE the table (`change`: what follows its name), and wait until the log holds
    the `rows` changes it made."""
    topic = change_topic(t.settings.pipeline, t.table)
    before = sum(end_offsets(t.settings.kafka, [topic])[topic].values())
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} {change}")
    deadline = time.monotonic() + 60
    while sum(end_offsets(t.settings.kafka, [topic])[topic].values()) < before + rows:
        assert time.monotonic() < deadline, "the updates did not reach the log"
        time.sleep(0.5)


def test_a_catch_up_batch_is_visible_to_searches_when_it_commits(
    captured: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 300) g",
        prefix="bulk",
    )
    run_apply(t.settings, ["search"], once=True)
    client = opensearch_reader(t.settings)
    index = index_name(t.settings.pipeline.topic_prefix, t.table)
    # the index's own interval, long enough that no scheduled refresh shows the batch
    client.indices.put_settings(index=index, body={"index": {"refresh_interval": "1h"}})
    update(t, "SET n = 1", 300)
    seen: list[str | None] = []
    bulk = SearchStore.bulk

    def watched(self: SearchStore, tables: object, on: bool, only_if_left: bool = False) -> None:
        bulk(self, tables, on, only_if_left)  # type: ignore[arg-type]
        seen.append(refresh_interval(client, index))

    monkeypatch.setattr(SearchStore, "bulk", watched)
    monkeypatch.setattr(cdc.apply.batch, "BULK_EVENTS", 100)  # 300 behind: a catch-up
    run_apply(t.settings, ["search"], once=True)
    # prepare() found nothing left; the batch turned refresh off, then gave the 1h back
    assert seen == ["1h", "-1", "1h"]
    # no refresh of this test's: the batch is searchable as soon as apply has committed it
    hits = client.search(index=index, body={"size": 1000, "query": {"term": {"n": 1}}})
    assert hits["hits"]["total"]["value"] == 300


def test_refresh_left_off_by_a_stopped_job_is_undone_at_its_start(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 50) g",
        prefix="bulk",
    )
    run_apply(t.settings, ["search"], once=True)
    client = opensearch_reader(t.settings)
    index = index_name(t.settings.pipeline.topic_prefix, t.table)
    # what a job killed during a catch-up batch leaves
    client.indices.put_settings(index=index, body={"index": {"refresh_interval": "-1"}})
    update(t, "SET n = 2 WHERE id <= 10", 10)
    run_apply(t.settings, ["search"], once=True)
    assert refresh_interval(client, index) is None  # OpenSearch's default again
    client.indices.refresh(index=index)
    hits = client.search(index=index, body={"size": 1000, "query": {"term": {"n": 2}}})
    assert hits["hits"]["total"]["value"] == 10


def test_the_warehouse_takes_a_backlog_in_larger_batches(captured: Capture) -> None:
    """[stores.warehouse] max_offsets_per_trigger, not the fast stores' limit, sizes the
    warehouse's batches: a backlog of 1,000 events is one Delta commit per table, where
    the cache takes ten batches (read from the Delta log and the cache's progress)."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 1000) g",
        prefix="bulk",
    )
    apply = t.settings.apply.model_copy(update={"max_offsets_per_trigger": 100})
    settings = t.settings.model_copy(update={"apply": apply})
    settings = with_warehouse(settings, max_offsets_per_trigger=100_000)
    run_apply(settings, ["cache", "warehouse"], once=True)
    path = current_path(warehouse_root(settings), t.table)
    written = [
        action["commitInfo"]["operation"]
        for log in sorted(Path(path, "_delta_log").glob("*.json"))
        for action in map(json.loads, log.read_text().splitlines())
        if "commitInfo" in action and action["commitInfo"]["operation"] in ("WRITE", "MERGE")
    ]
    assert written == ["WRITE"]  # the first load, whole, appended once
    assert read_progress(settings, "cache").batch >= 9  # type: ignore[union-attr]
    assert len(warehouse_rows(settings, t.table, ["n"])) == 1000
