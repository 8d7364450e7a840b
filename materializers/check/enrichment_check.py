"""`cdc verify` of a stream-table join (materializers/stores/warehouse/enrich.py): its
events enriched again from the change log, read with a Kafka consumer of its own, and
compared with the view's rows.

Each creation event of the stream table (op "c", once per key and position) takes the
referenced key's latest change at or before its position; the referenced columns are
NULL when that change is a delete, or when a TRUNCATE of the referenced table ended it
before the event committed (as the history caps a version's valid_to), or when there
is none. A topic that compaction has thinned no longer holds every event, so it is not
recomputed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc.catalog import TRUNCATIONS_TABLE, Column, Table
from cdc.decode import decode_value
from cdc.settings import JoinView, Settings
from cdc.topics import ChangeRecord, change_topic, read_topic, thinned
from materializers.log.position import Position, event_position

__all__ = ["Version", "enrich", "enrichment_drift"]


@dataclass(frozen=True)
class Version:
    """A change of a referenced row: its position, op, after image and commit time."""

    at: Position
    op: str
    after: dict[str, Any] | None
    ms: int


@dataclass
class _Log:
    versions: dict[Any, list[Version]] = field(default_factory=dict)  # per key, by position
    truncates: list[tuple[Position, int]] = field(default_factory=list)


def enrich(
    versions: list[Version], truncates: list[tuple[Position, int]], at: Position, ms: int
) -> Version | None:
    """The change that gives an event at position `at`, committed at `ms`, its values:
    the latest of `versions` (of one key, in position order) at or before `at`; None when
    there is none, or it is a delete, or a TRUNCATE (position, commit time) after it ended
    it before `ms`."""
    earlier = [v for v in versions if v.at <= at]
    if not earlier:
        return None
    chosen = earlier[-1]
    later = [v for v in versions if v.at > chosen.at]
    following = later[0] if later else None
    ends = following.ms if following else None
    for cut, cut_ms in truncates:
        if chosen.at < cut and (following is None or cut < following.at):
            ends = cut_ms if ends is None else min(ends, cut_ms)
    if chosen.op == "d":
        return None
    if ends is None or (following is not None and ends == following.ms) or ends >= ms:
        return chosen
    return None


def enrichment_drift(
    settings: Settings,
    join: JoinView,
    tables: dict[str, Table],
    held: dict[Any, tuple[Any, ...]],
    form: Callable[[Column, Any], Any],
) -> tuple[bool | None, str]:
    """Whether the view's rows (`held`: (stream key values..., commit LSN, LSN) -> the
    referenced columns, each value in `form`) equal the events enriched from the log;
    None when the log cannot tell (compacted). With what differs, in words."""
    stream, referenced = tables[join.table], tables[join.references]
    logs = {}
    for table in (stream, referenced):
        records = read_topic(settings.kafka, change_topic(settings.pipeline, table.qualified))
        if thinned(records):
            return None, f"not recomputed: compaction removed records of {table.qualified}"
        logs[table.qualified] = records
    log = _referenced_log(settings, referenced, logs[referenced.qualified])
    on = stream.column(join.on)
    expected: dict[Any, tuple[Any, ...]] = {}
    for record in logs[stream.qualified]:
        value = record.value
        if not value or value.get("op") != "c":
            continue
        at = event_position("c", value.get("source") or {})
        if at is None:
            continue
        after = value["after"]
        identity = (
            *[
                form(stream.column(k), decode_value(stream.column(k), after.get(k)))
                for k in stream.key
            ],
            *at,
        )
        target = decode_value(on, after.get(join.on))
        chosen = enrich(log.versions.get(target, []), log.truncates, at, value["source"]["ts_ms"])
        expected[identity] = tuple(
            None
            if chosen is None or chosen.after is None
            else form(referenced.column(c), decode_value(referenced.column(c), chosen.after.get(c)))
            for c in join.columns
        )
    missing = sorted(set(expected) - set(held), key=str)
    extra = sorted(set(held) - set(expected), key=str)
    different = sorted((k for k in expected if k in held and held[k] != expected[k]), key=str)
    ok = not (missing or extra or different)
    found = missing + extra + different
    return ok, (
        f"{len(expected)} events: {len(missing)} missing, {len(extra)} extra, "
        f"{len(different)} different" + (f" (e.g. {found[0]})" if found else "")
    )


def _referenced_log(settings: Settings, table: Table, records: list[ChangeRecord]) -> _Log:
    """The referenced table's changes per key in position order (each position once),
    and its TRUNCATEs."""
    log = _Log()
    (key,) = table.key
    seen: set[tuple[Any, Position]] = set()
    for record in records:
        value = record.value
        if not value or record.key is None:
            continue
        at = event_position(value["op"], value.get("source") or {})
        name = decode_value(table.column(key), record.key.get(key))
        if at is None or (name, at) in seen:
            continue
        seen.add((name, at))
        version = Version(at, value["op"], value.get("after"), value["source"]["ts_ms"])
        log.versions.setdefault(name, []).append(version)
    for versions in log.versions.values():
        versions.sort(key=lambda v: v.at)
    cuts = read_topic(settings.kafka, change_topic(settings.pipeline, TRUNCATIONS_TABLE))
    for record in cuts:
        value = record.value
        if not value or value.get("op") not in ("c", "r"):
            continue
        if (value.get("after") or {}).get("table_name") != table.qualified:
            continue
        at = event_position(value["op"], value.get("source") or {})
        if at is not None:
            log.truncates.append((at, value["source"]["ts_ms"]))
    return log
