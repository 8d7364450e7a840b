"""Finding F of the 2026-12-01 review (issue 66), on the stack: a `COMMIT PREPARED`
caught between its commit record (logical decoding streams it) and its becoming
visible, while a backfill reads its chunk.

The backfill's watermark waits for the commits in flight first
(`cdc.await_commits_in_flight`, sql/pipeline_schema.sql), so that the chunk read sees
them. A session running COMMIT PREPARED holds no xid of its own (the prepared
transaction's is held by a dummy process), so a wait that looks for sessions with an
xid does not see it: the chunk reads the old row, and it lands in the log after the
change. A commit waiting for a synchronous standby that never answers holds that state
for as long as the test needs (the race a busy machine hits for a few milliseconds);
the test makes it visible as soon as the watermark waits for it.

The test stack's PostgreSQL allows no prepared transaction (max_prepared_transactions
0): the test sets it and restarts PostgreSQL (fast shutdown, then `cdc up`)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.core.topics import change_topic, read_topic
from cdc.stack import Stack
from tests.conftest import Capture, RunningStack
from tests.helpers import ended, run_cdc
from tests.logcheck import poll
from tests.stores import stores

pytestmark = pytest.mark.integration

# the read-only path repeats the signal table's guarantee on the other path: make test-long
MODES = pytest.mark.parametrize(
    "read_only",
    [False, pytest.param(True, marks=pytest.mark.long)],
    ids=["signal_table", "read_only"],
)
STORES = ["cache", "search", "warehouse"]


@pytest.fixture
def prepared_transactions(stack: RunningStack) -> None:
    """The stack's PostgreSQL with max_prepared_transactions > 0 (a restart)."""
    dsn = stack.settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
        if row and int(row[0]) > 0:
            return
        conn.execute("ALTER SYSTEM SET max_prepared_transactions = 10")
    postgres = next(c for c in Stack(stack.settings).components if c.name == "postgres")
    pid = postgres.pid()
    assert pid is not None
    os.kill(pid, signal.SIGINT)  # fast shutdown: its backends end first
    poll(lambda: ended(pid), 60, "PostgreSQL to stop")
    result = run_cdc("up", env=stack.env)
    assert result.returncode == 0, result.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
    assert row == ("10",)


@MODES
@pytest.mark.usefixtures("prepared_transactions")
def test_a_commit_prepared_decoded_before_others_see_it_is_not_lost_to_a_backfill(
    captured: Capture, read_only: bool
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL)",
        "INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 20) g",
        prefix="bfp",
        read_only_backfills=read_only,
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    gid = f"{name}_gid"
    committer = psycopg.connect(dsn, autocommit=True)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # only the session that asks waits for a standby (here: none will answer)
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'cdc_test_nobody'")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute(f"UPDATE {name} SET version = 1 WHERE id = 3")
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
        committer.execute("SET synchronous_commit = on")
        pid = committer.info.backend_pid
        commit = threading.Thread(target=committer.execute, args=(f"COMMIT PREPARED '{gid}'",))
        commit.start()
        topic = change_topic(settings.pipeline, table)

        def decoded() -> bool:
            return any(
                r.op == "u" and r.value["after"]["id"] == 3
                for r in read_topic(settings.kafka, topic)
            )

        poll(decoded, 60, "the prepared update's change event")
        with psycopg.connect(dsn) as conn:  # in the log, yet nobody sees it
            row = conn.execute(f"SELECT version FROM {name} WHERE id = 3").fetchone()
            waiting = conn.execute(
                "SELECT backend_xid IS NULL FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
        assert row == (0,)
        assert waiting == (True,), "the committing session holds an xid of its own"
        _, offset = start_backfill(settings, table)
        finished: list[str] = []
        watch = threading.Thread(
            target=lambda: finished.append(
                watch_backfill(settings, offset, lambda p: None, timeout=120).state
            )
        )
        watch.start()

        def waited_for_or_done() -> bool:
            """The watermark waits for the commits in flight (in the signal table's
            trigger, or in cdc_watermarks.pg_current_snapshot()), at most 2 s: checked
            quickly. Without that wait, the backfill finishes meanwhile."""
            with psycopg.connect(dsn, autocommit=True) as conn:
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                ).fetchone()
            return bool(waiting and waiting[0]) or not watch.is_alive()

        poll(waited_for_or_done, 120, "the watermark's wait or the backfill's end")
        # now the commit becomes visible (its wait for the standby cancelled)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        commit.join(30)
        watch.join(120)
        assert finished == ["COMPLETED"]
        with psycopg.connect(dsn) as conn:
            row = conn.execute(f"SELECT version FROM {name} WHERE id = 3").fetchone()
        assert row == (1,)
        events = [
            e for e in read_topic(settings.kafka, topic) if e.value and e.value["after"]["id"] == 3
        ]
        order = [(e.op, e.value["after"]["version"]) for e in events]
        print(f"\nF ({'read-only' if read_only else 'signal table'}): key 3 in the log: {order}")
        run_apply(settings, STORES, once=True)
        held = {store: rows[3]["version"] for store, rows in stores(settings, table).items()}
        print(f"F: key 3's version in the stores: {held}")
        assert order[-1][1] == 1, order
        assert all(str(v) == "1" for v in held.values()), held
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET synchronous_commit")
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_cancel_backend(%s)", (committer.info.backend_pid,))
        committer.close()
        with psycopg.connect(dsn, autocommit=True) as conn:  # never left holding its locks
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
