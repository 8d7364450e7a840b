"""Backfills while streaming keep per-key order in the log."""

from __future__ import annotations

import io
import threading
import time

import psycopg
import pytest
from rich.console import Console

from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.capture.snapshot.initial import run_snapshot
from cdc.check.status import pipeline_status
from cdc.core.errors import BackfillError
from cdc.core.topics import change_topic, read_topic
from tests.conftest import Capture
from tests.logcheck import events_by_key, poll, table_info, wait_until_equal
from tests.source_load import Writer

pytestmark = pytest.mark.integration


# a backfill's signals and watermarks: rows in the signal table, or (read-only) a Kafka
# topic and pg_current_snapshot()
# the read-only path repeats the signal table's guarantee on the other path: make test-long
MODES = pytest.mark.parametrize(
    "read_only",
    [False, pytest.param(True, marks=pytest.mark.long)],
    ids=["signal_table", "read_only"],
)


@MODES
def test_a_backfill_under_writes_keeps_every_key_in_order(
    captured: Capture, read_only: bool
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 8000) g",
        prefix="bf",
        read_only_backfills=read_only,
    )
    name, settings, dsn = t.name, t.settings, t.dsn
    signals_before = _signal_rows(dsn)
    writer = Writer(dsn, name, first_new_id=100_000, max_id=8000)
    try:
        writer.start()
        _, offset = start_backfill(settings, name)
        states: list[str] = []
        done = watch_backfill(settings, offset, lambda p: states.append(p.state), timeout=240)
        time.sleep(1)
        writer.stop.set()
        writer.join()
        assert writer.error is None and writer.commits > 20
        assert "STARTED" in states and done.state == "COMPLETED"
        assert done.rows_scanned and done.rows_scanned >= 7000

        table = table_info(settings, f"public.{name}")
        _, records = wait_until_equal(settings, table)
        backfilled = [
            r for r in records if r.op == "r" and r.value["source"]["snapshot"] == "incremental"
        ]
        assert len(backfilled) >= 7000
        if read_only:  # neither the signal nor a watermark was written to the source
            assert _signal_rows(dsn) == signals_before
        else:
            assert _signal_rows(dsn) > signals_before
        # `cdc status` says which, from the running connector's configuration
        backfills = pipeline_status(settings).connector["backfills"]
        assert backfills.startswith("read-only") == read_only, backfills
        for key, events in events_by_key(records).items():
            versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
            # a backfilled row never lands after a newer change of its key
            assert versions == sorted(versions), (key, [(e.op, e.offset) for e in events])
    finally:
        writer.stop.set()


def _signal_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM cdc.debezium_signal").fetchone()
    return int(row[0]) if row else 0


def test_a_backfill_needs_a_streaming_pipeline_and_a_valid_filter(captured: Capture) -> None:
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="bf", snapshot=False)
    name, settings = t.name, t.settings
    with pytest.raises(BackfillError, match="not streaming"):
        start_backfill(settings, name)
    run_snapshot(settings, Console(file=io.StringIO()))
    with pytest.raises(BackfillError, match="not a valid filter"):
        start_backfill(settings, name, where="no_such_column > 1")
    with pytest.raises(BackfillError, match="not captured"):
        start_backfill(settings, "public.pg_nothing_here")


def test_a_filter_is_one_expression_checked_as_the_replication_role(captured: Capture) -> None:
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY, note text)", prefix="bfw")
    name, settings, dsn = t.name, t.settings, t.dsn
    pwned = f"{name}_pwned"
    attempts = {
        f"id < 0; CREATE TABLE public.{pwned} AS SELECT 1": "holds a `;`",
        "id < 0) OR (SELECT count(*) FROM (VALUES (1)) v) > 0 OR (id": "did not open",
        "id < 0 -- the rest": "comment",
        # the superuser could read this; the replication role reads only captured tables
        "id IN (SELECT usesysid::int FROM pg_shadow)": "replication role .* may not",
    }
    for where, error in attempts.items():
        with pytest.raises(BackfillError, match=error):
            start_backfill(settings, name, where=where)
    with psycopg.connect(dsn) as conn:
        made = conn.execute("SELECT to_regclass(%s)", (f"public.{pwned}",)).fetchone()
    assert made == (None,)
    # quoted text may hold anything
    signal, _ = start_backfill(settings, name, where="note <> ';)--' OR id > 0")
    assert signal


@MODES
def test_a_commit_decoded_before_others_see_it_is_not_lost_to_a_backfill(
    captured: Capture, read_only: bool
) -> None:
    """PostgreSQL writes a commit to the WAL (logical decoding streams it) before the
    committing backend makes it visible; between the two, a backfill's chunk read misses
    it, and its older row would land in the log after the change: the stores would keep
    the old row. A commit waiting for a synchronous standby that never answers holds
    that state for as long as the test needs (the race a busy machine hits for a few
    milliseconds). The watermark waits for it (sql/pipeline_schema.sql)."""
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 20) g",
        prefix="bfv",
        read_only_backfills=read_only,
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    held = psycopg.connect(dsn, autocommit=True)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # only the session that asks waits for a standby (here: none will answer)
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'cdc_test_nobody'")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(1)
        held.execute("SET synchronous_commit = on")
        pid = held.info.backend_pid
        update = threading.Thread(
            target=held.execute, args=(f"UPDATE {name} SET version = 1 WHERE id = 3",)
        )
        update.start()
        topic = change_topic(settings.pipeline, table)

        def decoded() -> bool:
            return any(
                r.op == "u" and r.value["after"]["id"] == 3
                for r in read_topic(settings.kafka, topic)
            )

        poll(decoded, 60, "the update's change event")
        with psycopg.connect(dsn) as conn:  # in the log, yet nobody sees it
            row = conn.execute(f"SELECT version FROM {name} WHERE id = 3").fetchone()
        assert row == (0,)
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM cdc.debezium_signal WHERE type = 'snapshot-window-open'"
            ).fetchone()
        opened_before = row[0] if row else 0
        _, offset = start_backfill(settings, table)

        def window_opening() -> bool:
            """Debezium takes the window's low watermark and waits for the commits in
            flight: in the signal table's trigger as its row commits, or (read-only) in
            cdc_watermarks.pg_current_snapshot(). Checked quickly: the wait lasts 2 s."""
            with psycopg.connect(dsn, autocommit=True) as conn:
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                ).fetchone()
                rows = conn.execute(
                    "SELECT count(*) FROM cdc.debezium_signal WHERE type = 'snapshot-window-open'"
                ).fetchone()
            return bool((waiting and waiting[0]) or (rows and rows[0] > opened_before))

        poll(window_opening, 60, "the backfill's window to open")
        # now the commit becomes visible (its wait for the standby cancelled)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        done = watch_backfill(settings, offset, lambda p: None, timeout=120)
        update.join(30)
        assert done.state == "COMPLETED"
        _, records = wait_until_equal(settings, table_info(settings, table))
        events = [e for e in records if e.value and e.value["after"]["id"] == 3]
        assert events[-1].value["after"]["version"] == 1, [(e.op, e.offset) for e in events]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET synchronous_commit")
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_cancel_backend(%s)", (held.info.backend_pid,))
        held.close()
