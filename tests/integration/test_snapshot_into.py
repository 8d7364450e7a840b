"""The snapshot writes the warehouse itself (issue 68 item 2): the same read that fills
the change topics appends the rows to the warehouse's tables, each with the partition its
record took in Kafka; the warehouse's apply starts after those records, and changes after
the snapshot reach it as before (a query with a checkpoint already leaves them out of its
batches: test_resnapshot.py's second snapshot, taken by `cdc snapshot`). Interrupted
after a group was in Kafka but before it was in the warehouse, a rerun resumes and every
store ends equal to the source.

The warehouse is read by delta-rs (the `deltalake` package), not through the product."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cdc.apply.job import run_apply
from cdc.apply.snapshot_into import StoresTakingSnapshot, snapshot_into
from cdc.capture.snapshot.held import read_held
from cdc.capture.snapshot.initial import run_snapshot
from cdc.capture.snapshot.table_copy import IntoStores
from cdc.core.settings import Settings
from cdc.core.topics import change_topic, read_topic
from cdc.log.progress import read_progress
from cdc.stores.warehouse.tables import current_path, history_path, warehouse_root
from tests.conftest import Capture
from tests.logcheck import poll, wait_until_captured
from tests.stores import cache_contents

pytestmark = pytest.mark.integration

ROWS = 6000


def _delta(path: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return list(DeltaTable(path).to_pyarrow_table().to_pylist())


def _source(dsn: str, name: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(f"SELECT id, name, n FROM {name}")}


def _current(settings: Settings, table: str) -> dict[int, tuple[Any, ...]]:
    rows = _delta(current_path(warehouse_root(settings), table))
    found = {r["id"]: (r["name"], r["n"]) for r in rows}
    assert len(found) == len(rows), "two live rows of one key"
    return found


def _history(settings: Settings, table: str) -> list[dict[str, Any]]:
    return _delta(history_path(warehouse_root(settings), table))


def _table(captured: Capture, **pipeline: Any) -> Any:
    return captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL, n int)",
        f"INSERT INTO {{name}} SELECT g, 'row ' || g, g % 97 FROM generate_series(1, {ROWS}) g",
        "ANALYZE {name}",
        snapshot=False,
        # several groups of ranges, each written to Kafka and then to the warehouse
        snapshot_pages_per_reader=4,
        **pipeline,
    )


def _change(dsn: str, name: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(f"UPDATE {name} SET n = -n, name = name || ' changed' WHERE id % 10 = 1")
        conn.execute(f"DELETE FROM {name} WHERE id % 10 = 2")
        conn.execute(
            f"INSERT INTO {name} SELECT g, 'new ' || g, 0 FROM generate_series({ROWS + 1}, "
            f"{ROWS + 50}) g"
        )


def test_the_snapshot_writes_the_warehouse_and_its_apply_skips_those_records(
    captured: Capture, caplog: pytest.LogCaptureFixture
) -> None:
    made = _table(captured)
    settings, table = made.settings, made.table
    into = snapshot_into(settings)
    assert into is not None, "the warehouse takes the snapshot's rows"
    notes: list[str] = []
    result = run_snapshot(settings, Console(file=io.StringIO()), notes.append, into)
    assert result.total_rows == ROWS
    assert any("writes warehouse itself" in n for n in notes), notes

    # before any apply: the warehouse holds every row, once, at the snapshot's point
    assert _current(settings, table) == _source(made.dsn, made.name)
    versions = _history(settings, table)
    assert sorted(v["id"] for v in versions) == list(range(1, ROWS + 1))
    assert {v["_cdc_op"] for v in versions} == {"r"}
    # each row carries the partition its record took, and an offset no lower than its own
    topic = change_topic(settings.pipeline, table)
    records = {json.loads(r.key_bytes or b"{}")["id"]: r for r in read_topic(settings.kafka, topic)}
    assert len(records) == ROWS
    partitions = set()
    for row in _delta(current_path(warehouse_root(settings), table)):
        record = records[row["id"]]
        assert row["_cdc_partition"] == record.partition, row["id"]
        assert row["_cdc_offset"] >= record.offset, row["id"]
        partitions.add(record.partition)
    assert len(partitions) > 1
    held = read_held(settings, "warehouse")
    assert held is not None and held.ends

    # changes after the snapshot; the apply skips the snapshot's records in the warehouse
    _change(made.dsn, made.name)
    wait_until_captured(settings)
    with caplog.at_level(logging.INFO, logger="cdc.apply.job"):
        run_apply(settings, once=True)
    said = [r.getMessage() for r in caplog.records]
    assert "warehouse: its query starts after the snapshot's records it holds" in said
    source = _source(made.dsn, made.name)
    assert _current(settings, table) == source
    versions = _history(settings, table)
    reads = [v["id"] for v in versions if v["_cdc_op"] == "r"]
    assert sorted(reads) == list(range(1, ROWS + 1)), "a snapshot row twice in the history"
    assert sum(v["_cdc_op"] == "u" for v in versions) == ROWS // 10
    assert sum(v["_cdc_op"] == "d" for v in versions) == ROWS // 10
    # the warehouse's progress is past the records it skipped; the cache took them all
    progress = read_progress(settings, "warehouse")
    assert progress is not None and held.covers(progress.applied)
    cache = cache_contents(settings, table)
    assert len(cache) == len(source)


class _StopsAfter(StoresTakingSnapshot):
    """Stops the snapshot once `groups` groups are in the warehouse, the next one in Kafka
    only (a crash between the two writes)."""

    def __init__(self, settings: Settings, names: list[str], groups: int) -> None:
        super().__init__(settings, names)
        self.groups = groups

    @contextmanager
    def writing(self, spark: Any, lsn: int, say: Any) -> Iterator[IntoStores | None]:
        with super().writing(spark, lsn, say) as write:
            assert write is not None
            done = [0]

            def stopping(records: Any, ends: dict[str, int], count: int) -> None:
                if done[0] == self.groups:
                    raise RuntimeError("stopped between Kafka and the warehouse")
                write(records, ends, count)
                done[0] += 1

            yield stopping


def test_a_group_that_does_not_reach_the_warehouse_is_applied_from_kafka(
    captured: Capture,
) -> None:
    """A group whose write into the warehouse fails (its Kafka write done) stops the
    ones after it. Either the copy stops too (the rerun resumes), or it had already
    ended (the snapshot is done, and says so): either way the warehouse holds what it
    recorded, reads the rest from Kafka, and every store ends equal to the source."""
    made = _table(captured)
    settings, table = made.settings, made.table
    console = Console(file=io.StringIO())
    notes: list[str] = []
    try:
        run_snapshot(settings, console, notes.append, _StopsAfter(settings, ["warehouse"], 1))
        stopped = False
    except RuntimeError as exc:
        assert "between Kafka and the warehouse" in str(exc)
        stopped = True
    if not stopped:
        assert any("did not go into the stores itself" in n for n in notes), notes
    held = read_held(settings, "warehouse")
    assert held is not None and held.ends  # the first group only
    in_kafka = _kafka_ends(settings, table)  # more than the warehouse holds
    assert any(held.ends.get(w, 0) < end for w, end in in_kafka.items()), (held, in_kafka)
    _change(made.dsn, made.name)
    if stopped:  # rows changed before the rerun; it resumes (backfills what was not recorded)
        assert run_snapshot(settings, console, into=snapshot_into(settings)).continued
    wait_until_captured(settings)
    source = _source(made.dsn, made.name)

    def equal() -> bool:
        run_apply(settings, once=True)
        return _current(settings, table) == source and len(cache_contents(settings, table)) == len(
            source
        )

    poll(equal, 300, "every store to equal the source")
    # each change once in the history: no key read twice at one position
    versions = _history(settings, table)
    seen = [(v["id"], v["_cdc_commit_lsn"], v["_cdc_lsn"]) for v in versions]
    assert len(seen) == len(set(seen))


def _kafka_ends(settings: Settings, table: str) -> dict[str, int]:
    from cdc.core.topics import end_offsets

    topic = change_topic(settings.pipeline, table)
    return {f"{topic}:{p}": end for p, end in end_offsets(settings.kafka, [topic])[topic].items()}


def test_a_warehouse_the_snapshot_cannot_write_is_reached_through_kafka(
    captured: Capture, tmp_path: Path
) -> None:
    """A warehouse whose tables cannot be made (its folder is a file): the snapshot says
    so in one line, writes the topics as before, and records nothing as held."""
    from cdc.stores.warehouse.settings import with_warehouse

    made = _table(captured)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    settings = with_warehouse(made.settings, path=str(blocked / "warehouse"))
    notes: list[str] = []
    result = run_snapshot(
        settings, Console(file=io.StringIO()), notes.append, snapshot_into(settings)
    )
    assert result.total_rows == ROWS
    said = [n for n in notes if "the snapshot reaches it through Kafka only" in n]
    assert len(said) == 1 and said[0].startswith("warehouse: "), notes
    assert read_held(settings, "warehouse") is None
    assert sum(_kafka_ends(settings, made.table).values()) == ROWS
