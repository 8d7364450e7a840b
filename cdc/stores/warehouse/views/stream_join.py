"""Stream-stream joins (`apply.joins` of kind `stream_stream`), kept by a streaming
query of their own (streams.py): each start with the first end after it within
`within`. A start is written when its end arrives (the earliest end wins, whatever
order the batches brought them in), or without an end once the watermark has passed
`within` after it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cdc.core.catalog import Table
from cdc.core.settings import Settings
from cdc.core.settings.views import StreamStreamJoin, duration_ms
from cdc.core.topics import ChangeRecord
from cdc.log.checkpoints import Checkpoint
from cdc.stores.base import Expected, ValueForm, Verifier
from cdc.stores.warehouse.native import NativeWriter
from cdc.stores.warehouse.settings import writer_in_use
from cdc.stores.warehouse.tables import view_path
from cdc.stores.warehouse.views.base import NOW, Branch, StreamingView
from cdc.stores.warehouse.views.streams import (
    LoggedChange,
    definition_of,
    events,
    logged_changes,
    merged_into,
    start_afresh,
    wide,
)
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["JOIN_COLUMNS", "StreamJoinView", "first_ends"]

# a stream-stream join's columns after the start's key and before the end's carried ones
JOIN_COLUMNS = ("start_ts", "end_ts", "elapsed_s")


class StreamJoinView(StreamingView):
    """Each row inserted into `table` (the start) with the first later change of a
    `references` row whose `on` holds the start's key and whose values match `when`."""

    settings: StreamStreamJoin
    label = "join"

    @property
    def verified_as(self) -> str:
        return "stream-stream join equals its starts and ends joined again from the log"

    def verify(self, by: Verifier) -> Any:
        return by.at_watermark(self)

    def definition(self) -> str:
        return definition_of(self.settings)

    def check_settings(self, tables: dict[str, Table], pipeline: str) -> None:
        super().check_settings(tables, pipeline)
        join = self.settings
        start, end = tables[join.table], tables[join.references]
        for c in [*join.columns, *join.when, join.on]:
            self.has(end, c)
        self.single_key(start, "a stream_stream join")
        self.not_taken(start, set(start.key), join.carried, JOIN_COLUMNS)

    def fields(self, start: Table, end: Table) -> list[Any]:
        """Its table: the start's key, its commit time and position, the end's commit
        time, the seconds between, the end's carried columns and position."""
        from pyspark.sql import types as T

        start_ts, end_ts, elapsed = JOIN_COLUMNS
        join = self.settings
        return [
            *[T.StructField(k, spark_type(start.column(k))) for k in start.key],
            T.StructField(start_ts, T.TimestampType()),
            T.StructField("_cdc_commit_lsn", T.LongType()),
            T.StructField("_cdc_lsn", T.LongType()),
            T.StructField(end_ts, T.TimestampType()),
            T.StructField(elapsed, T.DoubleType()),
            *[
                T.StructField(join.column_prefix + c, spark_type(end.column(c)))
                for c in join.columns
            ],
            T.StructField("_cdc_end_commit_lsn", T.LongType()),
            T.StructField("_cdc_end_lsn", T.LongType()),
        ]

    def branch(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Branch:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        from cdc.stores.warehouse.tables import warehouse_root

        join = self.settings  # its settings checked before (registry.check_views)
        start, end = wide(tables[join.table]), wide(tables[join.references])
        (key,) = start.key
        starts = events(spark, settings, start, [key], ("c",), join.watermark).select(
            F.col(q(f"__c_{key}")).alias("__start_key"),
            F.col("commit_ts").alias("start_ts"),
            F.col("__commit_lsn").alias("__start_commit"),
            F.col("__lsn").alias("__start_lsn"),
        )
        wanted = sorted({join.on, *join.when, *join.columns})
        ends = events(spark, settings, end, wanted, ("c", "u"), join.watermark, join.when).select(
            F.col(q(f"__c_{join.on}")).alias("__end_link"),
            F.col("commit_ts").alias("end_ts"),
            F.col("__commit_lsn").alias("__end_commit"),
            F.col("__lsn").alias("__end_lsn"),
            *[F.col(q(f"__c_{c}")).alias(f"__carried_{c}") for c in join.columns],
        )
        after_start = F.expr(
            f"__end_link = __start_key AND end_ts >= start_ts "
            f"AND end_ts <= start_ts + INTERVAL {join.within} "
            "AND (__end_commit > __start_commit "
            "OR (__end_commit = __start_commit AND __end_lsn > __start_lsn))"
        )
        joined = starts.join(ends, after_start, "leftOuter")
        fields = self.fields(start, end)
        names = [f.name for f in fields]
        start_afresh(spark, settings, join.name, checkpoint)
        start_ts, end_ts, _ = JOIN_COLUMNS
        end_position = F.struct(F.col("_cdc_end_commit_lsn"), F.col("_cdc_end_lsn"))
        first = Window.partitionBy(F.col(q(key)), "_cdc_commit_lsn", "_cdc_lsn").orderBy(
            end_position.asc_nulls_last()
        )
        merge = merged_into(
            spark,
            view_path(warehouse_root(settings), join.name),
            fields,
            [key, "_cdc_commit_lsn", "_cdc_lsn"],
            # the earliest end wins
            condition="s._cdc_end_commit_lsn IS NOT NULL AND (t._cdc_end_commit_lsn IS NULL "
            "OR s._cdc_end_commit_lsn < t._cdc_end_commit_lsn "
            "OR (s._cdc_end_commit_lsn = t._cdc_end_commit_lsn "
            "AND s._cdc_end_lsn < t._cdc_end_lsn))",
            native=NativeWriter(writer_in_use(settings) == "delta-rs"),
        )

        def write(batch: DataFrame, batch_id: int) -> None:
            rows = (
                batch.select(
                    F.col("__start_key").alias(key),
                    start_ts,
                    F.col("__start_commit").alias("_cdc_commit_lsn"),
                    F.col("__start_lsn").alias("_cdc_lsn"),
                    end_ts,
                    (F.unix_micros(end_ts) - F.unix_micros(start_ts)).cast("double") / 1e6,
                    *[F.col(q(f"__carried_{c}")) for c in join.columns],
                    F.col("__end_commit").alias("_cdc_end_commit_lsn"),
                    F.col("__end_lsn").alias("_cdc_end_lsn"),
                )
                .toDF(*names)
                .withColumn("_cdc_rank", F.row_number().over(first))
                .where("_cdc_rank = 1")
                .drop("_cdc_rank")
            )
            merge(rows, batch_id)

        return Branch(joined, write)

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Per start (its key's value, position): its first end's commit time and
        carried values, due at once; without one, NULLs, due `within` after the start."""
        join = self.settings
        start, end = tables[join.table], tables[join.references]
        (key,) = start.key
        starts = logged_changes(logs[start.qualified], start, [key], ("c",))
        wanted = sorted({join.on, *join.when, *join.columns})
        ends = [
            e
            for e in logged_changes(logs[end.qualified], end, wanted, ("c", "u"))
            if all(_text(e.values.get(c)) in values for c, values in join.when.items())
        ]
        raw = first_ends(starts, ends, key, join.on, duration_ms(join.within), join.columns)
        kc = start.column(key)
        return {
            (form(kc, k[0]), *k[1:]): (
                (v[0], *[form(end.column(c), x) for c, x in zip(join.columns, v[1:], strict=True)]),
                due,
            )
            for k, (v, due) in raw.items()
        }

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        join = self.settings
        start, end = tables[join.table], tables[join.references]
        (key,) = start.key
        carried = join.carried
        rows = frame.selectExpr(
            f"{q(key)} AS k",
            "_cdc_commit_lsn",
            "_cdc_lsn",
            "unix_millis(end_ts) AS end_ts_ms",
            *map(q, carried),
        ).collect()
        return {
            (form(start.column(key), r["k"]), r["_cdc_commit_lsn"], r["_cdc_lsn"]): (
                r["end_ts_ms"],
                *[form(end.column(c), r[p]) for c, p in zip(join.columns, carried, strict=True)],
            )
            for r in rows
        }


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


def _text(value: Any) -> str:
    """A value as Spark casts it to text (for `when`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
