"""The initial snapshot at the slot's consistent point, and the seam with streaming."""

from __future__ import annotations

import io
import threading
import time

import psycopg
import pytest
from rich.console import Console

from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.settings import Settings
from tests.conftest import Capture
from tests.logcheck import events_by_key, poll, table_info, wait_until_equal
from tests.source_load import Writer

pytestmark = [pytest.mark.integration, pytest.mark.pg_matrix]


def snapshot(settings: Settings, notes: list[str] | None = None):  # type: ignore[no-untyped-def]
    sink = notes if notes is not None else []
    return run_snapshot(settings, Console(file=io.StringIO()), sink.append)


def test_the_seam_has_every_change_exactly_once_in_commit_order(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, version int NOT NULL, note text)",
        "INSERT INTO {name} SELECT g, 0, 'seed' FROM generate_series(1, 20000) g",
        "ANALYZE {name}",
        snapshot=False,
        # tiny CTID ranges: many readers, each reaching its rows at a different time
        snapshot_pages_per_reader=16,
    )
    table_name, settings, dsn = t.name, t.settings, t.dsn

    # a transaction open while the slot is created: the slot must wait for it
    in_flight = psycopg.connect(dsn)
    in_flight.execute(f"UPDATE {table_name} SET version = version + 1 WHERE id = 1")
    in_flight_pid = in_flight.info.backend_pid

    writer = Writer(dsn, table_name, first_new_id=100_000, max_id=20_000)
    notes: list[str] = []
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(_try(snapshot, settings, notes)))
    try:
        runner.start()
        poll(lambda: any(f"pid {in_flight_pid}" in n for n in notes), 60, "the slot to wait")
        writer.start()  # rows change after the slot exists, before and while readers reach them
        time.sleep(0.5)
        in_flight.commit()
        runner.join(timeout=300)
        assert not isinstance(result[0], BaseException), result[0]
        time.sleep(2)  # changes streamed after the snapshot too
    finally:
        writer.stop.set()
        writer.join()
        in_flight.close()
    assert writer.error is None, writer.error
    assert writer.commits > 50

    table = table_info(settings, f"public.{table_name}")
    source, records = wait_until_equal(settings, table)
    # each key: at most one snapshot event, first; then versions step by one (nothing lost,
    # nothing doubled); deletes end with a tombstone
    for key, events in events_by_key(records).items():
        ops = [e.op for e in events]
        assert ops.count("r") <= 1 and (ops[0] in ("r", "c")), (key, ops)
        versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
        assert versions == list(range(versions[0], versions[0] + len(versions))), (
            key,
            versions,
        )
        for i, op in enumerate(ops):
            if op == "d":
                assert i + 1 < len(ops) and ops[i + 1] is None, (key, ops)
    assert len({e.partition for events in events_by_key(records).values() for e in events}) > 1
    snapshot_rows = sum(1 for r in records if r.op == "r")
    assert snapshot_rows >= 19_000
    assert source


def _try(fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except BaseException as exc:
        return exc
