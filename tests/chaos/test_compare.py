"""The harness's checks find what they look for (pure logic, no stack)."""

from __future__ import annotations

from datetime import datetime

from tests.chaos.compare import balance, check_history, diff_rows
from tests.chaos.readers import TABLES, Current, Version

ACCOUNTS = TABLES[0]
T = [datetime(2026, 1, 1, 0, 0, s) for s in range(10)]


def version(key: int, op: str, place: int, start: int, end: int | None, balance: int) -> Version:
    values = (None, None, None) if op == "d" else (balance, 0, "n")
    return Version(key, op, (place, place), T[start], None if end is None else T[end], values)


def test_rows_missing_extra_and_differing_are_counted_with_both_sides() -> None:
    source = {1: (10, 0, "a"), 2: (20, 0, "b"), 3: (30, 0, None)}
    stored = {1: (10, 0, "a"), 2: (21, 0, "b"), 4: (0, 0, "x")}
    diff = diff_rows("cache", ACCOUNTS, source, stored)
    assert (diff.missing, diff.extra, diff.differing) == (1, 1, 1)
    assert {
        "key": {"aid": 2},
        "source": {"balance": 20, "transfers": 0, "note": "b"},
        "store": {"balance": 21, "transfers": 0, "note": "b"},
    } in diff.examples
    assert balance(source) == 60


def test_a_clean_history_has_no_problems() -> None:
    versions = [
        version(1, "r", 1, 0, 2, 10),
        version(1, "u", 5, 2, None, 12),
        version(2, "r", 1, 0, 3, 5),
        version(2, "d", 7, 3, None, 0),
        version(3, "u", 4, 1, 6, 3),  # a TRUNCATE (a cut of a swapped table) took it out
    ]
    current = {1: Current((5, 5), (12, 0, "n"))}  # key 2 deleted, key 3 cut: no row
    report = check_history("public.accounts", ["a", "b"], versions, current)
    assert report.problems == 0, report.describe()
    assert (report.versions, report.keys) == (5, 3)


def test_each_broken_rule_is_found() -> None:
    versions = [
        version(1, "r", 1, 0, 2, 10),
        version(1, "u", 5, 2, None, 12),
        version(1, "u", 5, 2, None, 12),  # delivered twice: a duplicate, two open versions
        version(2, "r", 1, 4, 3, 5),  # ends before it starts
        version(2, "u", 6, 3, 5, 7),  # the newest, yet closed
        version(3, "r", 1, 0, None, 1),  # no current row
    ]
    current = {
        1: Current((5, 5), (13, 0, "n")),  # not what the newest version holds
        2: Current((6, 6), (7, 0, "n")),
        4: Current((9, 9), (1, 0, "n")),  # no history
    }
    report = check_history("public.accounts", ["a", "b"], versions, current)
    assert report.duplicates == 1
    assert report.open_many == 1
    assert report.inverted == 1
    assert report.newest_closed == 1
    assert report.newest_differs == 1
    assert report.no_current == 1
    assert report.no_history == 1
