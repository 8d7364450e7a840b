"""Kafka Connect killed mid-stream and restarted: nothing is lost, and what Debezium
delivers twice adds nothing to any store or to the history."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cdc.apply.job import run_apply
from cdc.stack.components import Connect
from tests.conftest import Capture, RunningStack
from tests.contents import expected_cache, expected_search, source_tuples
from tests.helpers import run_cdc
from tests.logcheck import events_by_key, table_info, wait_until_equal
from tests.source_load import Writer
from tests.stores import (
    cache_contents,
    history_rows,
    open_and_live,
    search_contents,
    warehouse_rows,
)

pytestmark = pytest.mark.integration


def test_connect_killed_and_restarted_loses_nothing(stack: RunningStack, captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 3000) g",
        prefix="crash",
    )
    name, settings, dsn = t.name, t.settings, t.dsn
    writer = Writer(dsn, name, first_new_id=100_000, max_id=3000)
    connect = Connect(settings)
    try:
        writer.start()
        time.sleep(3)
        pid = connect.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # mid-stream, offsets not flushed
        committed_while_down = writer.commits
        time.sleep(3)
        assert writer.commits > committed_while_down  # the source went on changing
        result = run_cdc("up", env=stack.env)
        assert result.returncode == 0, result.stderr
        assert connect.pid() not in (None, pid)
        time.sleep(3)
        writer.stop.set()
        writer.join()
        assert writer.error is None

        table = table_info(settings, f"public.{name}")
        _, records = wait_until_equal(settings, table, timeout=300)
        for key, events in events_by_key(records).items():
            versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
            # a restart replays from the last committed offset: duplicates are allowed,
            # a missing version is not, and the last event is the newest
            assert sorted(set(versions)) == list(range(versions[0], max(versions) + 1)), key
            assert versions[-1] == max(versions), key

        # the apply job: one history version per change, however often it is in the log
        changes = {
            (r.key_bytes, r.value["source"].get("sequence"), r.value["source"]["lsn"])
            for r in records
            if r.value is not None
        }
        print(f"{len(records)} records, {len(changes)} distinct changes")
        run_apply(settings, ["cache", "search", "warehouse"], once=True)
        qualified = f"public.{name}"
        assert cache_contents(settings, qualified) == expected_cache(settings, qualified)
        assert search_contents(settings, qualified) == expected_search(settings, qualified)
        columns = ["version", "note"]
        assert warehouse_rows(settings, qualified, columns) == source_tuples(
            settings, qualified, columns
        )
        history = history_rows(settings, qualified)
        assert history.count() == len(changes)
        # each live row is its key's one open version (the ends as the test derives them)
        opened, live = open_and_live(settings, qualified, ["id", "version", "note"])
        assert opened == live
    finally:
        writer.stop.set()
