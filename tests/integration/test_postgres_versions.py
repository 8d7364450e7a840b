"""What differs between PostgreSQL majors, on the major the test stack runs
(CDC_TEST_POSTGRES_VERSION; `make test` runs these on 15 and 17, `make test-long` on
each of 14 to 18): the slot a snapshot makes is a failover slot from 17, generated
columns are computed rather than published on every major, and a column choice or row
filter, which pgoutput filters from 15, is refused on 14 in one line."""

from __future__ import annotations

import json
import os

import psycopg
import pytest

from cdc.capture.pipeline import sync_pipeline
from cdc.core.errors import SourceError
from tests.conftest import Capture, RunningStack
from tests.helpers import run_cdc

pytestmark = [pytest.mark.integration, pytest.mark.pg_matrix]


def server_major(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


def test_the_stack_runs_the_major_asked_for(stack: RunningStack) -> None:
    major = server_major(stack.settings.postgres.dsn())
    wanted = os.environ.get("CDC_TEST_POSTGRES_VERSION")
    if wanted:
        assert major == int(wanted)
    assert 14 <= major <= 18


def test_the_snapshots_slot_is_a_failover_slot_from_17(captured: Capture) -> None:
    made = captured("CREATE TABLE {name} (id int PRIMARY KEY, note text)")
    with psycopg.connect(made.dsn) as conn:
        major = conn.info.server_version // 10000
        row = conn.execute(
            "SELECT to_jsonb(s) ->> 'failover' FROM pg_replication_slots s WHERE slot_name = %s",
            (made.settings.pipeline.slot,),
        ).fetchone()
    assert row is not None
    assert row[0] == ("true" if major >= 17 else None)
    shown = json.loads(run_cdc("status", "--output", "json", env=made.env).stdout)
    assert shown["pipeline"]["slot"]["failover"] is (True if major >= 17 else None)
    text = run_cdc("status", env=made.env).stdout
    assert ("failover slot" in text) is (major >= 17)


def test_generated_columns_are_never_published_but_computed(captured: Capture) -> None:
    """PostgreSQL 18 can publish stored generated columns, but Debezium 3.6 drops them
    from the tables it decodes: the publication leaves them out on every major, and the
    apply job computes them (test_generated.py, in this matrix too)."""
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int, "
        "twice int GENERATED ALWAYS AS (n * 2) STORED)"
    )
    with psycopg.connect(made.dsn) as conn:
        major = conn.info.server_version // 10000
        row = conn.execute(
            "SELECT to_jsonb(p) ->> 'pubgencols' FROM pg_publication p WHERE pubname = %s",
            (made.settings.pipeline.publication,),
        ).fetchone()
    assert row is not None
    assert row[0] == ("n" if major >= 18 else None)


def test_a_row_filter_is_refused_in_one_line_before_15(captured: Capture) -> None:
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, region text)",
        table={"public.{name}": {"where": "id > 10"}},
        snapshot=False,
    )
    if server_major(made.dsn) >= 15:
        sync_pipeline(made.settings)  # pgoutput filters the rows
        return
    with pytest.raises(SourceError) as refused:
        sync_pipeline(made.settings)
    message = str(refused.value)
    assert "needs PostgreSQL 15 or later" in message and made.table in message
    assert "\n" not in message
