"""Window aggregates (`apply.windows`): rows created in a table per window of commit
time, and the sum of a column, kept by a streaming query of their own (streams.py).

- tumbling and hopping windows are written as they fill (update mode); each (creation,
  window) pair is counted once, so a creation too late for its older windows still
  counts in those the watermark has not passed (and late counts per pair);
- sliding windows (one per distinct commit time of a creation, the `window` up to it)
  and sessions are written once the watermark has passed their end (append mode:
  Spark has no update mode for session windows, SPARK-36463); a sliding window's by
  `window` more (its aggregation follows a join, whose watermark is `window` behind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdc.core.catalog import Table
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings
from cdc.core.settings.views import (
    HoppingWindow,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    WindowSettings,
    duration_ms,
)
from cdc.core.topics import ChangeRecord
from cdc.log.checkpoints import Checkpoint
from cdc.stores.base import Expected, ValueForm, Verifier
from cdc.stores.warehouse.native import NativeWriter
from cdc.stores.warehouse.settings import writer_in_use
from cdc.stores.warehouse.tables import view_path
from cdc.stores.warehouse.views.base import NOW, Branch, StreamingView
from cdc.stores.warehouse.views.streams import (
    LoggedChange,
    appended_to,
    definition_of,
    events,
    logged_changes,
    merged_into,
    start_afresh,
    total,
    wide,
)
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["FillingWindowView", "SessionView", "SlidingView", "WindowView"]

# a window's columns: the ones that name it, then its measures
WINDOW_COLUMNS = ("window_start", "window_end", "rows", "total")
# the column Spark names a session's window (F.session_window), beside the group_by column
SESSION_WINDOW = "session_window"


class WindowView(StreamingView):
    """A window aggregate: its query, and its windows computed again from the log."""

    settings: WindowSettings

    @property
    def verified_as(self) -> str:
        return f"{self.settings.kind} window aggregate equals its windows recomputed from the log"

    def check_settings(self, tables: dict[str, Table], pipeline: str) -> None:
        super().check_settings(tables, pipeline)
        if self.settings.sum is not None:
            self.has(tables[self.settings.table], self.settings.sum)

    def definition(self) -> str:
        return definition_of(self.settings)

    def reads(self) -> list[str]:
        """The columns of its table it reads."""
        return [self.settings.sum] if self.settings.sum else []

    def branch(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Branch:
        created, measures, _, write = self.parts(spark, settings, tables, checkpoint)
        return Branch(self.counted(created, measures), write)

    def parts(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> tuple[Callable[..., DataFrame], list[Any], Any, Callable[[DataFrame, int], None]]:
        """What its query is made of: its creation events (`created(unique)`, with
        `__amount`), its measures, the type of `__amount`, and its batch writer (which
        empties its table first when the query at `checkpoint` starts afresh)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from cdc.stores.warehouse.tables import warehouse_root

        window = self.settings
        table = wide(tables[window.table])
        amount_type: Any = T.DecimalType(38, 2)
        if window.sum is not None:
            amount_type = spark_type(table.column(window.sum))
            if isinstance(amount_type, T.DecimalType):  # room for the sum
                amount_type = T.DecimalType(38, amount_type.scale)

        def created(unique: bool = True) -> DataFrame:
            found = events(
                spark, settings, table, self.reads(), ("c",), window.watermark, unique=unique
            )
            amount = F.col(q(f"__c_{window.sum}")) if window.sum else F.lit(None)
            return found.withColumn("__amount", amount.cast(amount_type))

        measures = [F.count("*").alias("rows"), F.sum("__amount").alias("total")]
        start, end, rows, summed = WINDOW_COLUMNS
        fields = [
            *self.leading_fields(table),
            T.StructField(start, T.TimestampType()),
            T.StructField(end, T.TimestampType()),
            T.StructField(rows, T.LongType()),
            T.StructField(summed, amount_type),
        ]
        path = view_path(warehouse_root(settings), window.name)
        start_afresh(spark, settings, window.name, checkpoint)
        native = NativeWriter(writer_in_use(settings) == "delta-rs")
        write = (
            merged_into(spark, path, fields, list(window.key), native=native)
            if self.mode == "update"  # a window written again as it fills
            else appended_to(spark, path, fields, checkpoint, native)
        )
        return created, measures, amount_type, write

    def counted(self, created: Any, measures: list[Any]) -> DataFrame:
        """Its windows' rows: the names of a window (WINDOW_COLUMNS, after
        `leading_fields`'), then rows and total; `created(unique)` the creations."""
        raise NotImplementedError

    def leading_fields(self, table: Table) -> list[Any]:
        """The columns of its table before the window's own."""
        return []

    def created(self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]]) -> Any:
        table = tables[self.settings.table]
        return logged_changes(logs[table.qualified], table, self.reads(), ("c",))


class FillingWindowView(WindowView):
    """Windows one after the other (tumbling) or every `slide` (hopping), written as
    they fill; `cdc verify` counts what came too late (Verifier.as_filled)."""

    settings: TumblingWindow | HoppingWindow
    mode = "update"

    def verify(self, by: Verifier) -> Any:
        return by.as_filled(self)

    def counted(self, created: Any, measures: list[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        return (
            self.paired(created)
            .groupBy("window")
            .agg(*measures)
            .select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "rows",
                "total",
            )
        )

    def paired(self, created: Any) -> DataFrame:
        """Each (creation, window) pair once, before they are counted: a creation too
        late for its older windows still counts in those the watermark has not passed
        (and late counts per pair)."""
        from pyspark.sql import functions as F

        window = self.settings
        return (
            created(unique=False)
            .withColumn("window", F.window("commit_ts", window.window, window.step))
            .dropDuplicates(["__key", "__lsn", "window"])
        )

    def starts(self, ms: int) -> list[int]:
        """The starts (ms since the epoch) of the windows that hold an event committed
        at `ms`: one tumbling window; every hopping window (starts every `slide`, from
        the epoch) that began at or before it and ends after it."""
        width = duration_ms(self.settings.window)
        step = duration_ms(self.settings.step)
        found = []
        start = ms - ms % step
        while start > ms - width:
            found.append(start)
            start -= step
        return sorted(found)

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Per window start (ms): (rows, total), due as soon as read."""
        windows: dict[int, list[LoggedChange]] = {}
        for change in self.created(tables, logs):
            for start in self.starts(change.ms):
                windows.setdefault(start, []).append(change)
        amount = self.settings.sum
        return {
            start: (
                (len(inside), total([c.values.get(amount) for c in inside]) if amount else None),
                NOW,
            )
            for start, inside in windows.items()
        }

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        return {
            int(r["start_ms"]): (r["rows"], None if r["total"] is None else float(r["total"]))
            for r in frame.selectExpr(
                "unix_millis(window_start) AS start_ms", "rows", "total"
            ).collect()
        }


class SlidingView(WindowView):
    """One window ending at each creation's commit time (SlidingWindow)."""

    settings: SlidingWindow
    late_readers = 2  # it reads its topic twice (the windows' ends and their members)

    def verify(self, by: Verifier) -> Any:
        return by.at_watermark(self)

    def counted(self, created: Any, measures: list[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        # one window per distinct creation time, joined with the creations of the window
        # up to it (a join needs an equality: every row has the same __all)
        ends = (
            created()
            .select(F.col("commit_ts").alias("window_end"), F.lit(0).alias("__all"))
            .dropDuplicatesWithinWatermark(["window_end"])
        )
        members = created().select(
            F.col("commit_ts").alias("__member_ts"), "__amount", F.lit(0).alias("__member_all")
        )
        size = f"INTERVAL {self.settings.window}"
        return (
            ends.join(
                members,
                F.expr(
                    f"__all = __member_all AND __member_ts >= window_end - {size} "
                    "AND __member_ts <= window_end"
                ),
            )
            .groupBy("window_end")
            .agg(*measures)
            .select(
                F.expr(f"window_end - {size}").alias("window_start"),
                "window_end",
                "rows",
                "total",
            )
        )

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Per distinct commit time E of a creation: (rows, total) of the creations from
        E - window to E (both included), due at E + window: Spark's join of the ends with
        their members holds a member `window` longer than an end, and passes on the
        watermark less that (the watermark its aggregation writes a window by)."""
        return sliding_windows(
            self.created(tables, logs), duration_ms(self.settings.window), self.settings.sum
        )

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        rows = frame.selectExpr("unix_millis(window_end) AS end_ms", "rows", "total").collect()
        return {
            r["end_ms"]: (r["rows"], None if r["total"] is None else float(r["total"]))
            for r in rows
        }


class SessionView(WindowView):
    """Per value of `group_by`, creations less than `gap` apart (SessionWindow)."""

    settings: SessionWindow

    def verify(self, by: Verifier) -> Any:
        return by.at_watermark(self)

    def check_settings(self, tables: dict[str, Table], pipeline: str) -> None:
        super().check_settings(tables, pipeline)
        group_by = self.settings.group_by
        if group_by is not None:
            self.has(tables[self.settings.table], group_by)
            if group_by in (*WINDOW_COLUMNS, SESSION_WINDOW):
                raise ConfigError(
                    f"view {self.name}: group_by {group_by} is a column the window has "
                    "already; sessions cannot be grouped by a column of that name"
                )

    def reads(self) -> list[str]:
        return [c for c in (self.settings.sum, self.settings.group_by) if c is not None]

    def leading_fields(self, table: Table) -> list[Any]:
        from pyspark.sql import types as T

        group_by = self.settings.group_by
        return [T.StructField(group_by, spark_type(table.column(group_by)))] if group_by else []

    def counted(self, created: Any, measures: list[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        group_by = self.settings.group_by
        group = [F.col(q(f"__c_{group_by}")).alias(group_by)] if group_by else []
        counts = (
            created()
            .groupBy(F.session_window("commit_ts", self.settings.gap), *group)
            .agg(*measures)
        )
        return counts.select(
            *([q(group_by)] if group_by else []),
            F.col(f"{SESSION_WINDOW}.start").alias("window_start"),
            F.col(f"{SESSION_WINDOW}.end").alias("window_end"),
            "rows",
            "total",
        )

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Per (group value, session start): (end, rows, total), due at its end."""
        table = tables[self.settings.table]
        group = table.column(self.settings.group_by) if self.settings.group_by else None
        sessions = session_windows(
            self.created(tables, logs),
            duration_ms(self.settings.gap),
            self.settings.group_by,
            self.settings.sum,
        )
        return {
            (form(group, g) if group else None, begin): found
            for (g, begin), found in sessions.items()
        }

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        group_by = self.settings.group_by
        group = tables[self.settings.table].column(group_by) if group_by else None
        rows = frame.selectExpr(
            f"{q(group_by)} AS g" if group_by else "NULL AS g",
            "unix_millis(window_start) AS start_ms",
            "unix_millis(window_end) AS end_ms",
            "rows",
            "total",
        ).collect()
        return {
            (form(group, r["g"]) if group else None, r["start_ms"]): (
                r["end_ms"],
                r["rows"],
                None if r["total"] is None else float(r["total"]),
            )
            for r in rows
        }


def sliding_windows(
    created: list[LoggedChange], width_ms: int, amount: str | None
) -> dict[int, tuple[tuple[int, Any], int]]:
    """Per distinct commit time E of a creation: (rows, total) of the creations from
    E - width to E (both included), due at E + width (SlidingView.expected)."""
    out = {}
    for end in sorted({e.ms for e in created}):
        inside = [e for e in created if end - width_ms <= e.ms <= end]
        summed = total([e.values.get(amount) for e in inside]) if amount else None
        out[end] = ((len(inside), summed), end + width_ms)
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
    for value, found in by_group.items():
        found.sort(key=lambda e: e.ms)
        runs: list[list[LoggedChange]] = [[found[0]]]
        for e in found[1:]:
            if e.ms - runs[-1][-1].ms < gap_ms:
                runs[-1].append(e)
            else:
                runs.append([e])
        for run in runs:
            end = run[-1].ms + gap_ms
            summed = total([e.values.get(amount) for e in run]) if amount else None
            out[(value, run[0].ms)] = ((end, len(run), summed), end)
    return out
