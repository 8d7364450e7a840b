"""A store's progress record: read back as written, and what it says of the log."""

from __future__ import annotations

from pathlib import Path

from cdc.core.settings import Settings
from cdc.log.checkpoints import checkpoint
from cdc.log.progress import (
    MAX_CUTS,
    Progress,
    add_cut,
    forget_other_definition,
    late_events,
    note_late,
    read_progress,
    set_waiting,
    write_progress,
)


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)  # type: ignore[call-arg]


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert read_progress(settings, "cache") is None
    record = Progress(
        batch=3,
        applied={"p.public.t:0": 9, "p.public.a:b:1": 4},  # a topic name may hold ':'
        commit_lsn=77,
        commit_ms=1000,
        applied_ms=1500,
        truncated={"public.t": (70, 2)},
        truncations={"public.t": [[60, 1, 800], [70, 2, 900]]},
        generation=5,
    )
    write_progress(settings, "cache", record)
    assert read_progress(settings, "cache") == record
    set_waiting(settings, "cache", "Redis does not answer")
    waiting = read_progress(settings, "cache")
    assert waiting is not None and waiting.waiting is not None
    assert waiting.waiting["reason"] == "Redis does not answer"
    set_waiting(settings, "cache", None)
    assert read_progress(settings, "cache") == record


def test_older_records_still_read() -> None:
    # a TRUNCATE cut-off once was a bare LSN; keys the record no longer has are ignored
    old = Progress.from_json({"applied": {"t:0": 1}, "truncated": {"public.t": 12}, "x": 1})
    assert old.truncated == {"public.t": (12, 0)} and old.applied == {"t:0": 1}


def test_backlog_and_what_is_behind() -> None:
    progress = Progress(applied={"a:0": 9, "a:1": 4, "b:a:0": 0})
    ends = {"a": {0: 10, 1: 8, 2: 3}, "b:a": {0: 1}, "c": {0: 0}}
    assert progress.backlog(ends) == 0 + 3 + 3
    assert progress.behind(ends) == ["a:1", "a:2"]
    assert progress.offset("a", 2) == -1
    assert progress.applied_of({"a"}) == {("a", 0): 9, ("a", 1): 4}
    assert progress.applied_of({"b:a"}) == {("b:a", 0): 0}


def test_late_events_add_up_per_report(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert late_events(settings, "w") is None
    late = [{"stateOperators": [{"numRowsDroppedByWatermark": 2}]}]
    note_late(settings, "w", [{"batchId": 0, **late[0]}, {"batchId": 1, **late[0]}])
    note_late(settings, "w", [{"batchId": 1, **late[0]}])  # seen: not counted again
    assert late_events(settings, "w") == 4


def test_an_idle_trigger_report_does_not_hide_the_batch_that_follows(tmp_path: Path) -> None:
    # a trigger that found nothing to read reports the id the next batch will have, and
    # no operator; that batch, run later (by the next `cdc apply --once`), still counts
    settings = _settings(tmp_path)
    idle = {"batchId": 3, "stateOperators": [], "numInputRows": 0}
    note_late(settings, "w", [idle])
    ran = {"batchId": 3, "stateOperators": [{"numRowsDroppedByWatermark": 1}]}
    note_late(settings, "w", [ran])
    assert late_events(settings, "w") == 1
    # a sliding window's two readers of its topic each drop a late event
    twice = {"batchId": 4, "stateOperators": [{"numRowsDroppedByWatermark": 1}] * 2}
    note_late(settings, "w", [twice], readers=2)
    assert late_events(settings, "w") == 2


def test_a_caught_up_store_has_no_lag_however_old_its_last_change() -> None:
    idle = Progress(applied={"p.public.t:0": 9}, commit_ms=1_000, applied_ms=1_400)
    an_hour_later = 1_000 + 3_600_000
    assert idle.lag_s(backlog=0, now_ms=an_hour_later) == 0.0
    assert idle.last_latency_s() == 0.4
    # with a backlog it is at least as far behind as its newest change is old
    assert idle.lag_s(backlog=5, now_ms=an_hour_later) == 3_600.0
    assert Progress().lag_s(backlog=5, now_ms=an_hour_later) is None
    # nothing applied yet: at least as far behind as the snapshot it lacks is old
    assert Progress().lag_s(backlog=5, now_ms=an_hour_later, snapshot_ms=601_000) == 3_000.0
    assert idle.lag_s(backlog=5, now_ms=an_hour_later, snapshot_ms=601_000) == 3_600.0
    assert Progress().lag_s(backlog=0, now_ms=an_hour_later) == 0.0
    assert Progress().last_latency_s() is None


def test_a_window_defined_otherwise_starts_afresh(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    query = checkpoint(settings, "window-w")
    (Path(query.path) / "commits").mkdir(parents=True)
    (Path(query.path) / "commits" / "0").write_text("v1")
    forget_other_definition(settings, query, '{"window": "1 minute"}')  # first: kept
    assert query.last_committed_batch() == 0
    forget_other_definition(settings, query, '{"window": "1 minute"}')  # the same: kept
    assert query.last_committed_batch() == 0
    forget_other_definition(settings, query, '{"window": "5 minutes"}')  # another: gone
    assert query.last_committed_batch() is None
    marker = Path(query.path).with_name("window-w.definition")
    assert marker.read_text() == '{"window": "5 minutes"}'


def test_the_lag_is_the_age_of_the_oldest_change_not_applied() -> None:
    """An idle pipeline whose store stopped an hour after its newest applied change, with
    changes committed a minute ago waiting: the lag is a minute, not an hour."""
    store = Progress(applied={"p.public.t:0": 9, "p.public.t:1": 4}, commit_ms=1_000)
    ends = {"p.public.t": {0: 12, 1: 5, 2: 0}}
    assert store.first_unapplied(ends) == {("p.public.t", 0, 10)}
    now = 1_000 + 3_600_000
    assert store.lag_s(backlog=2, now_ms=now, oldest_ms=now - 60_000) == 60.0
    assert store.lag_s(backlog=0, now_ms=now, oldest_ms=now - 60_000) == 0.0


def test_a_record_of_the_last_truncate_s_time_only_reads_as_one_cut() -> None:
    old = Progress.from_json({"truncated": {"public.t": [70, 2]}, "truncated_ms": {"public.t": 9}})
    assert old.truncations == {"public.t": [[70, 2, 9]]}


def test_every_truncate_is_kept_with_its_time_once_in_position_order() -> None:
    cuts = add_cut(add_cut([], (300, 310), 3000), (100, 110), 1000)
    cuts = add_cut(cuts, (300, 310), 3000)  # met again in a replay: kept once
    assert cuts == [[100, 110, 1000], [300, 310, 3000]]
    many: list[list[int]] = []
    for n in range(MAX_CUTS + 5):
        many = add_cut(many, (n, 0), n)
    assert len(many) == MAX_CUTS and many[0] == [5, 0, 5]
