from __future__ import annotations

import math
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path

import pytest

from cdc.capture.backfill import BackfillProgress, _apply, _take
from cdc.capture.slot import int_to_lsn, lsn_to_int
from cdc.capture.snapshot.ranges import (
    ctid_clause,
    newer_rows,
    page_ranges,
    relation_kept,
    unchanged_unread_rows,
    unread_rows,
)
from cdc.capture.snapshot.record import ReadRange
from cdc.core.catalog import Column, Table
from cdc.types.decode import UNAVAILABLE, Interval, decode_row, decode_value, parse_interval


def col(name: str, base: str, *, array: bool = False, precision: int | None = None) -> Column:
    return Column(name, base, base, "X", array, precision, False)


def ctid_ranges(pages: int, pages_per_reader: int) -> list[str]:
    return [ctid_clause(first, end) for first, end in page_ranges(pages, pages_per_reader)]


def test_ctid_ranges_cover_every_page_once() -> None:
    assert ctid_ranges(0, 100) == ["true"]
    assert ctid_ranges(100, 100) == ["true"]
    assert page_ranges(250, 100) == [(0, 100), (100, 200), (200, None)]
    ranges = ctid_ranges(250, 100)
    assert ranges == [
        "ctid < '(100,0)'::tid",
        "ctid >= '(100,0)'::tid AND ctid < '(200,0)'::tid",
        "ctid >= '(200,0)'::tid",  # open-ended: the table may have grown past relpages
    ]


def test_an_interrupted_snapshot_reads_only_the_ranges_it_had_not_written() -> None:
    assert unread_rows([], 7) == "true"  # nothing written: the whole table
    assert unread_rows([(0, 100), (100, 200), (200, None)], 7) is None  # all of it
    assert unread_rows([(200, None), (0, 100), (100, 200)], 7) is None  # in any order
    rest = unread_rows([(0, 100), (100, 200)], 7)  # merged into one range
    assert rest is not None and rest.startswith("(NOT ((ctid < '(200,0)'::tid)) OR ")
    gaps = unread_rows([(0, 100), (200, 300)], 7) or ""
    assert "(ctid < '(100,0)'::tid) OR (ctid >= '(200,0)'::tid AND ctid < '(300,0)'::tid)" in gaps


def test_a_resumed_table_is_cut_unless_every_row_written_is_still_its_own() -> None:
    """relation_kept: a table backfilled after a crash needs a cut first when the rows
    the first run wrote may be another relation's (a partition gone, the table created
    again, none recorded) or a TRUNCATE of it since may be missing from the log."""
    files = "100:0,101:5001,102:5002"  # a partitioned table (files 0) and two partitions

    def ranges(files: str) -> list[ReadRange]:
        return [ReadRange(100, files, 0, 60), ReadRange(100, files, 60, None)]

    assert relation_kept(ranges(files), files, truncate_logged=False)  # nothing changed
    assert not relation_kept([], files, truncate_logged=True)  # another relation, or none
    # rewritten (VACUUM FULL): kept when a TRUNCATE, which also gives new files, is logged
    rewritten = "100:0,101:6001,102:5002"
    assert relation_kept(ranges(files), rewritten, truncate_logged=True)
    assert not relation_kept(ranges(files), rewritten, truncate_logged=False)
    # a partition attached: kept (its rows are read whole); one detached or dropped: cut
    assert relation_kept(ranges(files), files + ",103:5003", truncate_logged=True)
    assert not relation_kept(ranges(files), "100:0,101:5001", truncate_logged=True)
    # files recorded before they named their relations: which is unknown, so cut
    assert not relation_kept(ranges("0,5001,5002"), files, truncate_logged=True)


def test_a_row_version_written_after_the_snapshot_is_read_again() -> None:
    """An UPDATE after the snapshot may move a row into a range already written: every
    version whose xmin is at or after the snapshot's (modulo 2^32) is read again."""
    import re

    xmin = (5 << 32) + 4_294_967_000  # an xid8 near a 32-bit wrap
    where = unread_rows([(0, 100)], xmin) or ""
    found = re.search(
        r"\(\(xmin::text::bigint - (\d+) \+ 4294967296\) % 4294967296\) < 2147483648", where
    )
    assert found is not None
    base = int(found.group(1))

    def newer(xid32: int) -> bool:
        return (xid32 - base + 2**32) % 2**32 < 2**31

    assert base == xmin % 2**32
    assert newer(4_294_967_000) and newer(4_294_967_295) and newer(5)  # after it, wrapped
    assert not newer(4_294_966_999) and not newer(3_000_000_000)  # before it


@pytest.mark.parametrize("lsn", ["0/0", "0/16B3748", "16/B374D848", "FFFFFFFF/FFFFFFFF"])
def test_lsn_text_and_number_round_trip(lsn: str) -> None:
    assert int_to_lsn(lsn_to_int(lsn)) == lsn
    assert lsn_to_int("1/0") == 1 << 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("P1Y2M3DT4H5M6.78S", Interval(14, 3, 14_706_780_000)),
        ("PT0S", Interval(0, 0, 0)),
        ("P-3DT-1S", Interval(0, -3, -1_000_000)),
        ("-P1D", Interval(0, -1, 0)),
        ("P2W", Interval(0, 14, 0)),
    ],
)
def test_iso_intervals_parse_exactly(text: str, expected: Interval) -> None:
    assert parse_interval(text) == expected


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_interval("3 days")


def test_debezium_encodings_decode_to_python_values() -> None:
    assert decode_value(col("n", "numeric"), "12345.6789") == Decimal("12345.6789")
    assert decode_value(col("d", "date"), 19782) == date(2024, 2, 29)
    assert decode_value(col("t", "time"), 86_399_999_999) == time(23, 59, 59, 999999)
    assert decode_value(col("ts", "timestamp"), 1_709_210_096_123_456) == datetime(
        2024, 2, 29, 12, 34, 56, 123456
    )
    assert decode_value(col("ts3", "timestamp", precision=3), 1_709_210_096_789) == datetime(
        2024, 2, 29, 12, 34, 56, 789000
    )
    assert decode_value(col("tz", "timestamptz"), "2024-02-29T07:04:56.123456Z") == datetime(
        2024, 2, 29, 7, 4, 56, 123456, tzinfo=UTC
    )
    assert decode_value(col("b", "bytea"), "AP8Q") == b"\x00\xff\x10"
    assert decode_value(col("j", "jsonb"), '{"a": [1]}') == {"a": [1]}
    assert math.isnan(decode_value(col("f", "float8"), "NaN"))
    assert decode_value(col("arr", "numeric", array=True), ["1.50", None]) == [
        Decimal("1.50"),
        None,
    ]


def test_the_toast_placeholder_is_never_turned_into_a_value() -> None:
    assert decode_value(col("big", "text"), UNAVAILABLE) == UNAVAILABLE
    assert decode_value(col("j", "jsonb"), UNAVAILABLE) == UNAVAILABLE


def test_decode_row_drops_columns_the_table_no_longer_has() -> None:
    table = Table("public", "t", (col("id", "int4"),), ("id",), "d", 0, 0)
    assert decode_row(table, {"id": 1, "gone": "x"}) == {"id": 1}


def test_a_resume_reads_as_the_snapshot_only_what_nothing_changed_since() -> None:
    newer = newer_rows(7)
    assert unchanged_unread_rows([], 7) == f"NOT {newer}"  # nothing written
    assert unchanged_unread_rows([(0, 100), (100, None)], 7) is None  # every page written
    assert unchanged_unread_rows([(0, 100)], 7) == (
        f"NOT {newer} AND NOT ((ctid < '(100,0)'::tid))"
    )
    # with the row versions written since, it is what the interrupted run did not write
    assert unread_rows([(0, 100)], 7) == f"(NOT ((ctid < '(100,0)'::tid)) OR {newer})"


def test_backfill_progress_follows_notifications() -> None:
    progress = BackfillProgress()
    _apply(progress, {"type": "STARTED", "additional_data": {"data_collections": "public.t"}})
    assert not progress.finished
    _apply(
        progress,
        {
            "type": "IN_PROGRESS",
            "additional_data": {
                "current_collection_in_progress": "public.t",
                "last_processed_key": "[250]",
                "maximum_key": "[1000]",
            },
        },
    )
    assert progress.table == "public.t" and progress.fraction is None  # not a plain number
    progress.last_key, progress.max_key = "250", "1000"
    assert progress.fraction == 0.25
    _apply(
        progress, {"type": "TABLE_SCAN_COMPLETED", "additional_data": {"total_rows_scanned": "990"}}
    )
    _apply(progress, {"type": "COMPLETED", "additional_data": {}})
    assert progress.finished and progress.rows_scanned == 990


def _notes(*kinds: str) -> list[dict[str, object]]:
    return [
        {"aggregate_type": "Incremental Snapshot", "type": t, "additional_data": {}} for t in kinds
    ]


def test_a_stopped_backfill_is_stopped_whatever_debezium_says_around_it() -> None:
    # stop 77: Debezium 3.6 says COMPLETED, then ABORTED, of a backfill stopped in its table
    progress, seen = BackfillProgress(), []
    _take(progress, _notes("IN_PROGRESS", "COMPLETED"), lambda p: seen.append(p.state))
    assert not progress.finished  # no table scan completed: an ABORTED may follow
    _take(progress, _notes("ABORTED", "COMPLETED"), lambda p: seen.append(p.state))
    assert progress.state == "ABORTED" and seen == ["IN_PROGRESS", "COMPLETED", "ABORTED"]
    # a backfill that scanned its table is done at COMPLETED; what follows is not its own
    done = BackfillProgress()
    _take(
        done, _notes("IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED", "ABORTED"), lambda _: None
    )
    assert done.finished and done.state == "COMPLETED"


def test_a_completed_backfill_that_scanned_nothing_ends_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import cdc.capture.backfill as backfill

    progress = BackfillProgress()
    _take(progress, _notes("STARTED", "COMPLETED"), lambda _: None)
    assert not progress.finished
    monkeypatch.setattr(backfill, "STOP_GRACE_S", -1.0)
    assert progress.finished and progress.state == "COMPLETED"


def test_tables_add_and_remove_edit_the_settings_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    from cdc.core.errors import ConfigError
    from cdc.core.settings.file import edit_tables

    for key in list(os.environ):
        if key.startswith("CDC_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cdc.toml").write_text('# mine\n[pipeline]\ntables = ["public.a"]  # keep\n')
    path, tables = edit_tables(add=["b", "public.c"], remove=[])
    assert tables == ["public.a", "public.b", "public.c"]
    assert path.read_text().startswith("# mine")
    _, tables = edit_tables(add=[], remove=["public.a"])
    assert tables == ["public.b", "public.c"]
    with pytest.raises(ConfigError, match=r"not in pipeline\.tables"):
        edit_tables(add=[], remove=["public.zzz"])
    monkeypatch.setenv("CDC_PIPELINE__TABLES", '["public.x"]')
    with pytest.raises(ConfigError, match="CDC_PIPELINE__TABLES"):
        edit_tables(add=["y"], remove=[])


def test_the_status_of_an_interrupted_snapshot_says_what_a_rerun_keeps() -> None:
    import io

    from rich.console import Console

    from cdc.check.status import PipelineStatus
    from cdc.cli.render import pipeline_table

    status = PipelineStatus("p", "running", "0/16B3748", None, None)
    status.snapshot_ranges = 12
    out = io.StringIO()
    Console(file=out, width=300).print(pipeline_table(status))
    text = out.getvalue()
    assert "running at 0/16B3748; 12 CTID range(s) written" in text
    assert "`cdc snapshot` resumes an interrupted one" in text
