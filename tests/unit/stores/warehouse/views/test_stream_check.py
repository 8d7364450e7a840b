"""The log-side rules `cdc verify` recomputes session windows and stream-stream joins by."""

from __future__ import annotations

from decimal import Decimal

from cdc.check.view_checks import compare_due
from cdc.stores.warehouse.views.stream_join import first_ends
from cdc.stores.warehouse.views.streams import LoggedChange
from cdc.stores.warehouse.views.windows import session_windows, sliding_windows


def event(ms: int, at: int, **values: object) -> LoggedChange:
    return LoggedChange((at, at), ms, dict(values))


def test_a_sliding_window_ends_at_each_creation_time_and_holds_its_width() -> None:
    created = [
        event(1000, 1, t=Decimal("1")),
        event(1000, 2, t=Decimal("2")),  # the same commit: one window
        event(2000, 3, t=Decimal("4")),
        event(3001, 4, t=None),
    ]
    assert sliding_windows(created, 2000, "t") == {
        1000: ((2, Decimal("3")), 3000),  # written once the watermark is a width past
        2000: ((3, Decimal("7")), 4000),  # from 0 to 2000, both included
        3001: ((2, Decimal("4")), 5001),  # 1001 to 3001: not the first two
    }


def test_a_session_ends_a_gap_after_its_last_creation_per_group() -> None:
    created = [
        event(1000, 1, c=1, t=Decimal("1.50")),
        event(2500, 2, c=1, t=Decimal("2.00")),  # 1.5 s later: the same session
        event(4500, 3, c=1, t=Decimal("1.00")),  # 2 s later (the gap): a new one
        event(1200, 4, c=2, t=None),
    ]
    sessions = session_windows(created, 2000, "c", "t")
    assert sessions == {
        (1, 1000): ((4500, 2, Decimal("3.50")), 4500),
        (1, 4500): ((6500, 1, Decimal("1.00")), 6500),
        (2, 1200): ((3200, 1, None), 3200),
    }
    assert set(session_windows(created, 2000, None, None)) == {(None, 1000), (None, 4500)}


def test_a_start_takes_its_first_end_within_or_none() -> None:
    starts = [event(1000, 10, id=1), event(1000, 10, id=2), event(1000, 10, id=3)]
    ends = [
        event(4000, 40, id=1, s="cancelled"),
        event(2000, 20, id=1, s="shipped"),  # the first by position
        event(4500, 45, id=2, s="shipped"),  # 3.5 s after its start: not within 3 s
        event(1000, 5, id=3, s="shipped"),  # before its start's position
    ]
    joined = first_ends(starts, ends, "id", "id", 3000, ["s"])
    assert joined == {
        (1, 10, 10): ((2000, "shipped"), joined[(1, 10, 10)][1]),
        (2, 10, 10): ((None, None), 4000),
        (3, 10, 10): ((None, None), 4000),
    }
    assert joined[(1, 10, 10)][1] < 0  # due at once


def test_rows_are_compared_by_when_they_fall_due() -> None:
    expected = {"a": ("x", 100), "b": ("y", 5000), "c": ("z", 1000)}
    assert compare_due(expected, {"a": "x", "c": "z"}, 2000)[0]
    assert compare_due(expected, {"a": "x", "c": "z", "b": "y"}, 2000) == (
        False,
        "2 due: 0 missing, 1 extra, 0 different (e.g. b)",
    )
    assert compare_due(expected, {"a": "x"}, 2000)[1].startswith("2 due: 1 missing")
    assert not compare_due(expected, {"a": "x", "c": "w"}, 2000)[0]
    assert compare_due(expected, {"a": "x"}, 1000)[0]  # c due at the watermark: either way
    assert compare_due(expected, {"a": "x", "c": "z"}, 1000)[0]
