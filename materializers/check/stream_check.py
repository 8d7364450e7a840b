"""`cdc verify` of the derived data kept with a watermark (materializers/stores/
warehouse/streams.py) that the window check does not cover: sliding and session
windows and stream-stream joins, computed again from the change log, read with a Kafka
consumer of its own, and compared with their Delta tables.

Spark writes a sliding window, a session and a start without an end once the
watermark has passed their end; the watermark is the one the query's last committed
micro-batch ran with (its checkpoint's offset log). What falls due within a
millisecond of it may be written or not; anything before must be, anything after must
not. A join's start with an end is written as soon as both are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cdc.catalog import Column, Table
from cdc.decode import decode_value
from cdc.settings import JoinView, WindowAggregate, duration_ms
from cdc.topics import ChangeRecord
from materializers.log.position import Position, event_position

__all__ = [
    "LoggedChange",
    "compare_due",
    "events_of",
    "first_ends",
    "session_windows",
    "sliding_windows",
]

NOW = -(2**62)  # due at once: written when read


@dataclass(frozen=True)
class LoggedChange:
    """A change in the log: its position, commit time (ms) and decoded values."""

    at: Position
    ms: int
    values: dict[str, Any]


def events_of(
    records: Iterable[ChangeRecord], table: Table, columns: list[str], ops: tuple[str, ...]
) -> list[LoggedChange]:
    """The changes of `ops` in `records`, each (key, LSN) once (the connector may send
    one twice), with `columns` decoded from the row after the change."""
    seen: set[tuple[bytes | None, Any]] = set()
    out = []
    for record in records:
        value = record.value
        if not value or value.get("op") not in ops:
            continue
        source = value.get("source") or {}
        at = event_position(value["op"], source)
        if at is None or (record.key_bytes, source.get("lsn")) in seen:
            continue
        seen.add((record.key_bytes, source.get("lsn")))
        after = value.get("after") or {}
        decoded = {c: decode_value(table.column(c), after.get(c)) for c in columns}
        out.append(LoggedChange(at, int(source["ts_ms"]), decoded))
    return out


def _total(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return sum(present[1:], present[0]) if present else None


def sliding_windows(
    created: list[LoggedChange], width_ms: int, amount: str | None
) -> dict[int, tuple[tuple[int, Any], int]]:
    """Per distinct commit time E of a creation: (rows, total) of the creations from
    E - width to E (both included), due at E + width: Spark's join of the ends with
    their members holds a member `width` longer than an end, and passes on the
    watermark less that (the watermark its aggregation writes a window by)."""
    out = {}
    for end in sorted({e.ms for e in created}):
        inside = [e for e in created if end - width_ms <= e.ms <= end]
        total = _total([e.values.get(amount) for e in inside]) if amount else None
        out[end] = ((len(inside), total), end + width_ms)
    return out


def session_windows(
    created: list[LoggedChange], gap_ms: int, group: str | None, amount: str | None
) -> dict[tuple[Any, int], tuple[tuple[int, int, Any], int]]:
    """Per (group value, session start): (end, rows, total), due at its end: creations
    of a group less than `gap` apart are one session; it ends `gap` after its last."""
    by_group: dict[Any, list[LoggedChange]] = {}
    for e in created:
        by_group.setdefault(e.values.get(group) if group else None, []).append(e)
    out = {}
    for value, events in by_group.items():
        events.sort(key=lambda e: e.ms)
        runs: list[list[LoggedChange]] = [[events[0]]]
        for e in events[1:]:
            if e.ms - runs[-1][-1].ms < gap_ms:
                runs[-1].append(e)
            else:
                runs.append([e])
        for run in runs:
            end = run[-1].ms + gap_ms
            total = _total([e.values.get(amount) for e in run]) if amount else None
            out[(value, run[0].ms)] = ((end, len(run), total), end)
    return out


def first_ends(
    starts: list[LoggedChange],
    ends: list[LoggedChange],
    key: str,
    link: str,
    within_ms: int,
    carried: list[str],
) -> dict[tuple[Any, int, int], tuple[tuple[Any, ...], int]]:
    """Per start (its key's value, position): the first end (by position) whose `link`
    holds the start's key, after it, committed from the start's time to `within` later:
    (its commit time, carried values...), due at once; without one, (None, None...),
    due `within` after the start."""
    by_link: dict[Any, list[LoggedChange]] = {}
    for e in sorted(ends, key=lambda e: e.at):
        by_link.setdefault(e.values.get(link), []).append(e)
    out = {}
    for s in starts:
        name = s.values.get(key)
        found = next(
            (e for e in by_link.get(name, []) if e.at > s.at and s.ms <= e.ms <= s.ms + within_ms),
            None,
        )
        if found is None:
            nothing: tuple[Any, ...] = (None, *[None] * len(carried))
            out[(name, *s.at)] = (nothing, s.ms + within_ms)
        else:
            out[(name, *s.at)] = ((found.ms, *[found.values.get(c) for c in carried]), NOW)
    return out


def compare_due(
    expected: dict[Any, tuple[Any, int]], held: dict[Any, Any], watermark_ms: int
) -> tuple[bool, str]:
    """Whether the held rows are those of `expected` due at the watermark (module doc),
    with what differs in words."""
    missing = [k for k, (_, due) in expected.items() if due < watermark_ms - 1 and k not in held]
    extra = [k for k in held if k not in expected or expected[k][1] > watermark_ms + 1]
    different = [k for k in held if k in expected and held[k] != expected[k][0]]
    found = [*missing, *extra, *different]
    due = sum(1 for _, d in expected.values() if d < watermark_ms - 1)
    return not found, (
        f"{due} due: {len(missing)} missing, {len(extra)} extra, {len(different)} different"
        + (f" (e.g. {sorted(found, key=str)[0]})" if found else "")
    )


def expected_rows(
    view: JoinView | WindowAggregate,
    tables: dict[str, Table],
    logs: dict[str, list[ChangeRecord]],
    form: Callable[[Column, Any], Any],
) -> dict[Any, tuple[Any, int]]:
    """The rows of `view` recomputed from the change logs (`logs`: per table), each
    value in `form` (the warehouse's), keyed as `held_rows` keys the table's."""
    if isinstance(view, JoinView):
        start, end = tables[view.table], tables[view.references]
        (key,) = start.key
        starts = events_of(logs[start.qualified], start, [key], ("c",))
        wanted = sorted({view.on, *view.when, *view.columns})
        ends = [
            e
            for e in events_of(logs[end.qualified], end, wanted, ("c", "u"))
            if all(_text(e.values.get(c)) in values for c, values in view.when.items())
        ]
        raw = first_ends(starts, ends, key, view.on, duration_ms(view.within or ""), view.columns)
        kc = start.column(key)
        return {
            (form(kc, k[0]), *k[1:]): (
                (v[0], *[form(end.column(c), x) for c, x in zip(view.columns, v[1:], strict=True)]),
                due,
            )
            for k, (v, due) in raw.items()
        }
    table = tables[view.table]
    read = [c for c in (view.sum, view.group_by) if c]
    created = events_of(logs[table.qualified], table, read, ("c",))
    if view.kind == "sliding":
        width = duration_ms(view.window)
        return {
            end: ((rows, _number(total)), due)
            for end, ((rows, total), due) in sliding_windows(created, width, view.sum).items()
        }
    group = table.column(view.group_by) if view.group_by else None
    sessions = session_windows(created, duration_ms(view.gap or ""), view.group_by, view.sum)
    return {
        (form(group, g) if group else None, begin): ((end, rows, _number(total)), due)
        for (g, begin), ((end, rows, total), due) in sessions.items()
    }


def _text(value: Any) -> str:
    """A value as Spark casts it to text (for `when`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _number(total: Any) -> Any:
    return None if total is None else float(total)
