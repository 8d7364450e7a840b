"""`cdc verify` of the derived views (those of the store that keeps them, found through
its declaration's views door): each view says which comparison is its own
(`DerivedView.verify`, cdc/stores/base.py), and `ViewChecks` runs it:

- against the source: a table join against the same join computed by PostgreSQL,
  after a cut on both tables (verify.verify_join);
- against the log: a stream-table join against its events enriched again from the
  change log, once the warehouse applied every change committed before now;
- at the watermark: a sliding or session window, or a stream-stream join, against its
  rows computed again from the log that are due at the watermark of its query's last
  committed batch, once that batch read the whole log as it is now; events it found
  too late were not applied: then it is not recomputed (`cdc status` shows how many);
- as filled: a tumbling or hopping window against its windows from the log, once its
  query read the whole log; with events too late, only the total is compared (counted
  + late = the (event, window) pairs).

The logs are read with a Kafka consumer of the check's own, once per table for every
view of one verify. A topic that compaction thinned no longer holds every change: its
views are not recomputed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cdc.check.quality import Check
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.settings import Settings
from cdc.core.settings.views import TableJoin
from cdc.core.topics import ChangeRecord, change_topic, read_topic, thinned
from cdc.log.checkpoints import checkpoint
from cdc.log.progress import late_events
from cdc.stores.base import (
    DerivedView,
    Expected,
    StoreReader,
    StreamingDerivedView,
    ViewReader,
)
from cdc.stores.registry import derived_views, reader_with
from cdc.types.store_forms import warehouse_value

__all__ = ["ViewChecks", "compare_due", "view_checks"]


def view_checks(
    settings: Settings, tables: dict[str, Table], timeout: float = 120.0
) -> list[Check]:
    """A check of each view over the verified `tables` (module doc)."""
    door = derived_views(settings)
    if door is None:
        return []
    checks = ViewChecks(settings, tables, timeout)
    views = [v for v in door.of(settings) if set(v.sides) <= set(tables)]
    return [v.verify(checks) for v in views]


class ViewChecks:
    """The comparisons of a Verifier (cdc/stores/base.py)."""

    def __init__(self, settings: Settings, tables: dict[str, Table], timeout: float) -> None:
        self.settings = settings
        self.tables = tables
        self.timeout = timeout
        self._logs: dict[str, list[ChangeRecord]] = {}
        self._store: StoreReader | None = None  # the views' store, read when a view's rows are

    def against_source(self, view: DerivedView) -> Check:
        from cdc.check.verify import verify_join

        join = view.settings
        assert isinstance(join, TableJoin)  # a table join's comparison
        drift = verify_join(self.settings, join, self.tables)
        found = drift.missing + drift.extra + drift.different
        return Check(
            drift.table,
            view.verified_as,
            None,
            drift.ok,
            f"{len(drift.missing)} missing, {len(drift.extra)} extra, "
            f"{len(drift.different)} different" + (f" (e.g. {found[0]})" if found else ""),
        )

    def against_log(self, view: DerivedView) -> Check:
        from cdc.check.verify import consistent_cut

        consistent_cut(
            self.settings, [self.tables[t] for t in view.sides], [self._views().name], self.timeout
        )
        logs = self._read(view)
        if isinstance(logs, str):
            return self._check(view, True, logs)
        logs[TRUNCATIONS_TABLE] = self._log(TRUNCATIONS_TABLE)
        expected = view.expected(self.tables, logs, warehouse_value)
        ok, detail = compare_due(expected, self._held(view), rows="events")
        return self._check(view, ok, detail)

    def at_watermark(self, view: StreamingDerivedView) -> Check:
        logs = self._read(view)
        if isinstance(logs, str):
            return self._check(view, True, logs)
        watermark = self._caught_up(view, logs)
        if watermark is None:
            return self._check(
                view, False, f"its query did not read the log within {self.timeout}s"
            )
        late = late_events(self.settings, view.name) or 0
        if late:
            return self._check(
                view, True, f"not recomputed: {late} events came after the watermark"
            )
        expected = view.expected(self.tables, logs, warehouse_value)
        ok, detail = compare_due(expected, self._held(view), watermark)
        return self._check(view, ok, detail)

    def as_filled(self, view: StreamingDerivedView) -> Check:
        logs = self._read(view)
        if isinstance(logs, str):
            return self._check(view, True, logs)
        if self._caught_up(view, logs) is None:
            return self._check(
                view, False, f"its query did not read the log within {self.timeout}s"
            )
        expected = {
            start: rows
            for start, (rows, _) in view.expected(self.tables, logs, warehouse_value).items()
        }
        held = self._held(view)
        late = late_events(self.settings, view.name) or 0
        if late:  # Spark counts a late event once per window it is too late for
            counted = sum(rows for rows, _ in held.values())
            places = sum(rows for rows, _ in expected.values())
            return self._check(
                view,
                counted + late == places,
                f"{counted} counted + {late} late of {places} (event, window) pairs",
            )
        differ = sorted(s for s in set(held) | set(expected) if held.get(s) != expected.get(s))
        return self._check(
            view,
            not differ,
            f"{len(differ)} of {len(set(held) | set(expected))} windows differ"
            + (f" (e.g. the one from {differ[0]} ms)" if differ else ""),
        )

    def _check(self, view: DerivedView, ok: bool, detail: str) -> Check:
        return Check(f"view {view.name}", view.verified_as, None, ok, detail)

    def _log(self, table: str) -> list[ChangeRecord]:
        """The table's change log as it is now, read once per verify (its generated
        columns computed: the log has none)."""
        if table not in self._logs:
            topic = change_topic(self.settings.pipeline, table)
            records = read_topic(self.settings.kafka, topic)
            if table in self.tables and self.tables[table].generated and not thinned(records):
                _with_generated(self.settings, self.tables[table], records)
            self._logs[table] = records
        return self._logs[table]

    def _read(self, view: DerivedView) -> dict[str, list[ChangeRecord]] | str:
        """The logs of the view's tables, or why it cannot be recomputed from them."""
        logs = {t: self._log(t) for t in view.sides}
        for table, records in logs.items():
            if thinned(records):
                return f"not recomputed: compaction removed records of {table}"
        return logs

    def _views(self) -> ViewReader:
        """The store that keeps the views ("views" ability), opened once."""
        if self._store is None:
            self._store = reader_with(self.settings, "views")
        assert isinstance(self._store, ViewReader)
        return self._store

    def _held(self, view: DerivedView) -> dict[Any, Any]:
        frame = self._views().view_frame(view.name)
        return {} if frame is None else view.held(frame, self.tables, warehouse_value)

    def _caught_up(
        self, view: StreamingDerivedView, logs: dict[str, list[ChangeRecord]]
    ) -> int | None:
        """The watermark (ms) of the last batch the view's query committed, once that
        batch read every topic of `logs` up to their ends; None after the timeout (its
        Structured Streaming checkpoint: commits/<id>, offsets/<id>: a version line,
        the batch's metadata, then each source's offsets)."""
        ends = {
            change_topic(self.settings.pipeline, t): {r.partition: r.offset + 1 for r in records}
            for t, records in logs.items()
        }
        query = checkpoint(self.settings, view.checkpoint_label)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                batch = query.last_committed_batch()
                if batch is None:
                    raise ValueError("no batch committed yet")
                lines = query.read(f"offsets/{batch}").splitlines()
                sources = [json.loads(line) for line in lines[2:]]
                reading = {t: [s[t] for s in sources if t in s] for t in ends}  # per reader
                if all(
                    reading[topic]
                    and all(
                        int(read.get(str(p), 0)) >= end
                        for read in reading[topic]
                        for p, end in offsets.items()
                    )
                    for topic, offsets in ends.items()
                ):
                    return int(json.loads(lines[1]).get("batchWatermarkMs", 0))
            except (OSError, ValueError, IndexError):
                pass
            if time.monotonic() > deadline:
                return None
            time.sleep(1)


def _with_generated(settings: Settings, table: Table, records: list[ChangeRecord]) -> None:
    """Each change's after image with the table's generated columns, which the log does
    not hold, computed by PostgreSQL (in place)."""
    names = {c.name for c in table.generated}
    afters = [
        r.value["after"]
        for r in records
        if r.value and r.value.get("after") and not names <= set(r.value["after"])
    ]
    if not afters:
        return
    from cdc.log.generated_columns import compute, expressions_connection, expressions_dsn

    with expressions_connection(expressions_dsn(settings)) as conn:
        compute(conn, table, afters)


def compare_due(
    expected: Expected, held: dict[Any, Any], watermark_ms: int = 2**62, rows: str = "due"
) -> tuple[bool, str]:
    """Whether the held rows are those of `expected` due at the watermark (a row due
    within a millisecond of it may be written or not; without one, every row is due),
    with what differs in words (`rows`: what the due rows are called)."""
    missing = [k for k, (_, due) in expected.items() if due < watermark_ms - 1 and k not in held]
    extra = [k for k in held if k not in expected or expected[k][1] > watermark_ms + 1]
    different = [k for k in held if k in expected and held[k] != expected[k][0]]
    found = [*missing, *extra, *different]
    due = sum(1 for _, d in expected.values() if d < watermark_ms - 1)
    return not found, (
        f"{due} {rows}: {len(missing)} missing, {len(extra)} extra, {len(different)} different"
        + (f" (e.g. {sorted(found, key=str)[0]})" if found else "")
    )
