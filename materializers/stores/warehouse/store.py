"""Delta Lake: per source table, the current state kept by MERGE with a position guard.

`<warehouse>/<prefix>/<schema>/<table>/current` holds one row per key ever seen: the
columns typed from the PostgreSQL catalog, plus the position `_cdc_commit_lsn`,
`_cdc_lsn` (materializers/log/position.py), `_cdc_offset`, `_cdc_partition`,
`_cdc_commit_ts` and `_cdc_deleted`. A delete keeps the row as a deleted marker
(`_cdc_deleted = true`, columns as they were) with its position, so a stale write is
refused for ever; readers see live rows through the `<table>` view (`WHERE NOT
_cdc_deleted`). A MERGE updates a row only from a newer position; an unchanged TOASTed
value keeps the stored column. A tombstone deletes only what an earlier record of its
partition wrote.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, date, datetime
from datetime import time as clock
from decimal import Decimal
from functools import partial
from typing import Any, Protocol

from cdc.catalog import Column, Table, reserved_problem
from cdc.decode import Interval, decode_value, parse_interval
from cdc.errors import ConfigError
from materializers.log.keys import key_text, shortest_real
from materializers.log.typed import quoted as q
from materializers.log.typed import spark_type, typed_image
from materializers.stores.base import Entry, FrameStore, Rows
from materializers.stores.warehouse.history import NEWEST, partition_history, write_history
from materializers.stores.warehouse.tables import (
    append_rows,
    clear_columns,
    current_path,
    dropped_columns,
    ensure_delta,
    history_path,
    is_empty,
    view_path,
)

__all__ = ["BatchStep", "WarehouseStore", "warehouse_value"]

log = logging.getLogger(__name__)

# the position (materializers/log/position.py) of the target row `t` is older than the
# source row `s`'s; a row written before positions were kept counts as older
_OLDER = (
    "(t._cdc_commit_lsn IS NULL OR t._cdc_commit_lsn < s._cdc_commit_lsn OR "
    "(t._cdc_commit_lsn = s._cdc_commit_lsn AND t._cdc_lsn < s._cdc_lsn))"
)
# what the decoded events carry beside the table's columns, each as `_cdc_<name>`
_EVENT_META = ("key", "op", "offset", "partition", "commit_lsn", "lsn", "commit_ms", "cut_ms")


def warehouse_value(column: Column, value: Any) -> Any:
    """A value from either side (psycopg's, Delta's) in one form: text for most types."""
    if value is None:
        return None
    if isinstance(value, list):
        return [warehouse_value(column, v) for v in value]
    base = column.base
    if base in ("json", "jsonb"):  # text on both sides, compared as such (JSON_TEXT)
        return value
    if base == "interval":
        parsed = parse_interval(value) if isinstance(value, str) else value
        return json.dumps(parsed.__dict__) if isinstance(parsed, Interval) else str(parsed)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, clock):
        return value.strftime("%H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if base == "float4":
        return shortest_real(value)
    if isinstance(value, Decimal):
        return str(value)
    return str(value) if not isinstance(value, bool | int | float) else value


_REMOVE_BATCH = 1000  # keys per UPDATE of a many-column key


class BatchStep(Protocol):
    """Work after each batch over the tables it wrote (a derived view: materializers/
    views/)."""

    def keeps(self) -> dict[str, set[str]]:
        """What of each table's batch it reads (frames_to_keep)."""
        ...

    def refresh(
        self,
        spark: Any,
        root: str,
        tables: dict[str, Table],
        kept: dict[str, dict[str, Any]],
        truncated: set[str],
    ) -> None:
        """Run after the batch (`kept`: per table, what it kept; `truncated`: the tables
        a TRUNCATE or a reset emptied since the last batch)."""
        ...


class WarehouseStore(FrameStore):
    name = "warehouse"

    def __init__(self, spark: Any, root: str, after_batch: Sequence[BatchStep] = ()) -> None:
        self.spark = spark
        self.root = root
        self.after_batch = list(after_batch)
        self._truncated: set[str] = set()
        # each Delta table's handle, kept while the columns it was checked for hold
        self._tables: dict[str, tuple[list[Any], Any]] = {}
        # the Delta tables known to hold rows (only a reset empties one again)
        self._filled: set[str] = set()
        # MERGEs of a batch at once: twice the cores, as much of a MERGE is driver work
        self.parallel = min(2 * (os.cpu_count() or 1), 8)

    def prepare(self, tables: Iterable[Table]) -> None:
        for table in tables:
            self._ensure(table)
            self._history(table)

    def _ensure(self, table: Table) -> Any:
        """The table's current state (SCD type 1), created or widened to its columns."""
        from pyspark.sql import types as T

        return self._delta(
            current_path(self.root, table.qualified),
            [
                T.StructField("_cdc_offset", T.LongType()),
                T.StructField("_cdc_partition", T.IntegerType()),
                T.StructField("_cdc_lsn", T.LongType()),
                T.StructField("_cdc_commit_ts", T.TimestampType()),
                T.StructField("_cdc_deleted", T.BooleanType()),
                T.StructField("_cdc_commit_lsn", T.LongType()),
            ],
            table,
            clear_dropped=True,
        )

    def _history(self, table: Table) -> Any:
        """The table's history (SCD type 2), created or widened to its columns, and
        partitioned by each key's newest version (history.NEWEST)."""
        from pyspark.sql import types as T

        if problem := reserved_problem([c.name for c in table.columns], ("warehouse",)):
            raise ConfigError(f"table {table.qualified} cannot be kept in the warehouse: {problem}")

        return self._delta(
            history_path(self.root, table.qualified),
            [
                T.StructField("_cdc_op", T.StringType()),
                T.StructField("_cdc_offset", T.LongType()),
                T.StructField("_cdc_partition", T.IntegerType()),
                T.StructField("_cdc_lsn", T.LongType()),
                T.StructField("valid_from", T.TimestampType()),
                T.StructField("valid_to", T.TimestampType()),
                T.StructField("_cdc_commit_lsn", T.LongType()),
                T.StructField(NEWEST, T.BooleanType()),
            ],
            table,
            partitioned_by=(NEWEST,),
        )

    def _delta(
        self,
        path: str,
        meta: list[Any],
        table: Table,
        partitioned_by: tuple[str, ...] = (),
        clear_dropped: bool = False,
    ) -> Any:
        """The Delta table at `path` for `table`'s columns and `meta`. A column dropped
        in PostgreSQL stays in the Delta table (its history keeps what it held); with
        `clear_dropped` (the current state) no live row keeps a value in it."""
        from pyspark.sql import types as T

        fields = [T.StructField(c.name, spark_type(c)) for c in table.columns] + meta
        known = self._tables.get(path)
        if known is not None and known[0] == fields:
            return known[1]  # a handle always reads the table's latest version
        target = ensure_delta(self.spark, path, fields, partitioned_by)
        if clear_dropped:
            clear_columns(target, dropped_columns(target, fields))
        if partitioned_by == (NEWEST,):
            target = partition_history(self.spark, table, path, target)
        self._tables[path] = (fields, target)
        return target

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        """Rows written before the TRUNCATE (position `before`) become deleted markers;
        their open history versions end at the TRUNCATE's commit time."""
        commit, lsn = int(before[0]), int(before[1])
        cut = (
            f"(_cdc_commit_lsn IS NULL OR _cdc_commit_lsn < {commit} OR "
            f"(_cdc_commit_lsn = {commit} AND _cdc_lsn < {lsn}))"
        )
        self._ensure(table).update(
            condition=f"{cut} AND NOT _cdc_deleted", set={"_cdc_deleted": "true"}
        )
        # every version from before it that lasts past it: the open ones, and one whose
        # next version (after the TRUNCATE) was written first, its topic read further ahead
        ended = f"timestamp_millis({int(commit_ms)})"
        self._history(table).update(
            condition=f"{cut} AND _cdc_op <> 'd' AND (valid_to IS NULL OR valid_to > {ended})",
            set={"valid_to": ended},
        )
        self._truncated.add(table.qualified)  # its join views are rebuilt after the batch

    def reset(self, table: Table) -> None:
        """Every row of the table's current state and history goes (a Delta version of
        its own: time travel still reaches what was there)."""
        self._ensure(table).delete()
        self._history(table).delete()
        self._filled.discard(current_path(self.root, table.qualified))
        self._filled.discard(history_path(self.root, table.qualified))
        self._truncated.add(table.qualified)

    def rows(self, table: Table) -> Rows:
        return self.rows_at(table, current_path(self.root, table.qualified), live=True)

    def holds(self, table: Table) -> bool:
        """Whether the table's current state is a Delta table yet (its log, not its data)."""
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, current_path(self.root, table.qualified)))

    def live_frame(self, table: Table) -> Any | None:
        """The table's live rows (its current state without the deleted markers) as a
        DataFrame; None while it has no Delta table."""
        frame = self._frame(current_path(self.root, table.qualified))
        return None if frame is None else frame.where("NOT _cdc_deleted")

    def history_frame(self, table: Table) -> Any | None:
        """The table's history as a DataFrame; None while it has none."""
        return self._frame(history_path(self.root, table.qualified))

    def view_frame(self, name: str) -> Any | None:
        """A derived view's Delta table as a DataFrame; None while it has none."""
        return self._frame(view_path(self.root, name))

    def _frame(self, path: str) -> Any | None:
        """The Delta table at `path` as a DataFrame; None while there is none."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self.spark, path):
            return None
        return self.spark.read.format("delta").load(path)

    def rows_at(self, table: Table, path: str, live: bool = False) -> Rows:
        """The rows of the Delta table at `path` with `table`'s columns (a join view's,
        whose deleted rows are gone; `live`: without the deleted markers)."""
        frame = self._frame(path)
        if frame is None:
            return {}
        if live:
            frame = frame.where("NOT _cdc_deleted")
        names = [c.name for c in table.columns]
        # a current state's column that PostgreSQL dropped: a value left in it is drift,
        # as a field left in the cache or the index is
        gone = [n for n in frame.columns if live and n not in names and not n.startswith("_cdc")]
        rows = {}
        # as Arrow: one job, no Row objects (timestamps come with their UTC zone)
        for batch in frame.select(*[q(n) for n in names + gone]).toArrow().to_batches():
            for record in batch.to_pylist():
                values = dict(zip(names + gone, record.values(), strict=True))
                row = self.form(table, values)
                row.update({n: values[n] for n in gone if values[n] is not None})
                rows[key_text(table, values)] = row
        return rows

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return {c.name: warehouse_value(c, row.get(c.name)) for c in table.columns}

    def remove(self, table: Table, keys: list[str]) -> None:
        """The rows become deleted markers (keeping their positions)."""
        from pyspark.sql import functions as F

        target = self._ensure(table)
        # the Delta values of the keys to remove (a key's text is not its Delta value)
        wanted = set(keys)
        live = target.toDF().where("NOT _cdc_deleted").select(*[q(k) for k in table.key])
        values = [
            row.asDict()
            for row in live.toLocalIterator()
            if key_text(table, row.asDict()) in wanted
        ]
        if not values:
            return
        if len(table.key) == 1:  # one IN list (Spark makes it a hash set)
            column = table.key[0]
            condition = F.col(q(column)).isin([v[column] for v in values])
            target.update(condition, {"_cdc_deleted": F.lit(True)})
            return
        for at in range(0, len(values), _REMOVE_BATCH):
            matches = []
            for value in values[at : at + _REMOVE_BATCH]:
                match = F.lit(True)
                for column in table.key:
                    match = match & (F.col(q(column)) == F.lit(value[column]))
                matches.append(match)
            target.update(any_of(matches), {"_cdc_deleted": F.lit(True)})

    def get(self, table: Table, key: str) -> Entry | None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        path = current_path(self.root, table.qualified)
        if not DeltaTable.isDeltaTable(self.spark, path):
            return None
        raw = json.loads(key)
        match = F.lit(True)
        for name in table.key:
            value = decode_value(table.column(name), raw.get(name))
            match = match & F.col(q(name)).eqNullSafe(F.lit(value))
        found = self.spark.read.format("delta").load(path).where(match).collect()
        if not found:
            return None
        fields = found[0].asDict()
        return Entry(fields, bool(fields["_cdc_deleted"]))

    def _empty(self, path: str, target: Any) -> bool:
        """The Delta table holds no row yet (a first load, or after a reset): a batch
        into it is a plain append, every change of it new to the table."""
        if path in self._filled:
            return False
        if is_empty(target):
            return True
        self._filled.add(path)
        return False

    def _timed(self, work: Callable[..., Any], *args: Any) -> float:
        """Run `work` in this thread, in the warehouse's scheduler pool; its seconds."""
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        started = time.monotonic()
        work(*args)
        return time.monotonic() - started

    def _write_table(
        self,
        table: Table,
        events: Any,
        histories: ThreadPoolExecutor,
        keep: set[str],
        toasted: bool,
    ) -> tuple[float, float, dict[str, Any]]:
        """A table's events of the batch into its history (in `histories`) and its current
        state (in this thread); their seconds, and what the views want kept of the batch
        (`keep`): its keys of the table ("keys", for the join views), its creation
        events ("created", for the enrichments it streams) and the positions of its
        changes per key ("versions", for the enrichments it is referenced by)."""
        from pyspark.sql import functions as F

        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        decoded, history, current = self._merge(table, events, histories, toasted)
        try:
            try:
                current_s = self._timed(current)
            finally:
                wait([history])  # the history reads the decoded events too
            kept: dict[str, Any] = {}
            if "keys" in keep:
                kept["keys"] = (
                    decoded.select(*[F.col(q(f"_cdc_k_{k}")).alias(k) for k in table.key])
                    .distinct()
                    .localCheckpoint()
                )
            changes = decoded.where("_cdc_commit_lsn IS NOT NULL")  # tombstones are not changes
            if "created" in keep:  # an INSERT carries every value: no placeholder
                kept["created"] = (
                    changes.where("_cdc_op = 'c'")
                    .select(
                        *[q(c.name) for c in table.columns],
                        "_cdc_commit_lsn",
                        "_cdc_lsn",
                        "_cdc_commit_ms",
                    )
                    .dropDuplicates([*table.key, "_cdc_commit_lsn", "_cdc_lsn"])
                    .localCheckpoint()
                )
            if "versions" in keep and len(table.key) == 1:
                kept["versions"] = changes.select(
                    F.col(q(f"_cdc_k_{table.key[0]}")).alias("_cdc_ref"),
                    "_cdc_commit_lsn",
                    "_cdc_lsn",
                ).localCheckpoint()
            return history.result(), current_s, kept
        finally:
            decoded.unpersist()

    def _merge(
        self, table: Table, events: Any, pool: ThreadPoolExecutor, toasted: bool = True
    ) -> tuple[Any, Future[float], Callable[[], Any]]:
        """Start the history write of a table's events of the batch (in `pool`), and make
        the write of its current state. Returns the decoded events (checkpointed: the
        caller unpersists them), the history's future (its seconds), and the current
        state's write to run. `toasted` false: no event of the batch carries a TOAST
        placeholder, and no value is carried over or read from the stored rows."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        target = self._ensure(table)
        rows = events.where(F.col("table") == table.qualified)
        key_image = typed_image(
            table.__class__(
                table.schema,
                table.name,
                tuple(table.column(k) for k in table.key),
                table.key,
                table.replica_identity,
                0,
                0,
            ),
            F.col("key"),
            prefix="_cdc_k_",
            placeholders=False,
        )
        decoded = rows.select(
            # under names no column can take (cdc.catalog.reserved_problem)
            *[F.col(c).alias(f"_cdc_{c}") for c in _EVENT_META],
            *key_image,
            *typed_image(table, F.col("after"), placeholders=toasted),
        )
        # a key column's value comes from the event's key, never a placeholder
        placeholders = {
            c for c in decoded.columns if c.startswith("__ph_") and c[5:] not in table.key
        }
        for flag in placeholders:
            # a create carrying a placeholder is a key change (an INSERT carries every
            # value): the value kept under this key belongs to another row, so it is
            # not known (NULL), never kept. A read (the snapshot, a backfill) carries
            # every value: one that looks like a placeholder is real (the value stays)
            c = flag[len("__ph_") :]
            created = F.col(q(flag)) & (F.col("_cdc_op") == "c")
            read = F.col("_cdc_op") == "r"
            decoded = decoded.withColumn(
                c,
                F.when(created, F.lit(None).cast(decoded.schema[c].dataType)).otherwise(
                    F.col(q(c))
                ),
            ).withColumn(flag, F.col(q(flag)) & ~created & ~read)
        by_key = Window.partitionBy("_cdc_key").orderBy(
            "_cdc_commit_lsn", "_cdc_lsn", "_cdc_offset"
        )
        so_far = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        types = {c.name: spark_type(c) for c in table.columns}
        for flag in placeholders:
            c = flag[len("__ph_") :]
            # the key's latest known value of c in the batch up to this event: a real
            # value is known, a placeholder tells nothing, a delete forgets
            value = F.when(
                F.col("_cdc_op") == "d",
                F.struct(F.lit(None).cast(types[c]).alias("v"), F.lit(False).alias("known")),
            ).when(~F.col(q(flag)), F.struct(F.col(q(c)).alias("v"), F.lit(True).alias("known")))
            decoded = decoded.withColumn(
                f"__carried_{c}", F.last(value, ignorenulls=True).over(so_far)
            )
        # read by the history MERGE and the current one: computed once, and the plans
        # that read it start from its rows, not from the decoding of the Kafka records
        # (planning and generating code for those cost more than running them)
        decoded = decoded.localCheckpoint()
        fresh = self._empty(current_path(self.root, table.qualified), target)
        stored = None
        if placeholders and not fresh:  # values the history may need, read before any MERGE
            keys = decoded.select(*[F.col(q(f"_cdc_k_{k}")) for k in table.key]).distinct()
            stored = (
                target.toDF()
                .select(
                    *[F.col(q(k)).alias(f"_cdc_cur_{k}") for k in table.key],
                    # a deleted row's values are no one's to keep (write_history), but
                    # those of a row a TRUNCATE deleted are an earlier change's
                    F.col("_cdc_deleted").alias("_cdc_cur_deleted"),
                    *[F.col(q(f[5:])).alias(f"_cdc_cur_{f[5:]}") for f in placeholders],
                )
                .join(
                    keys,
                    [
                        F.col(q(f"_cdc_cur_{k}")).eqNullSafe(F.col(q(f"_cdc_k_{k}")))
                        for k in table.key
                    ],
                    "left_semi",
                )
                .localCheckpoint()
            )
        history_table = self._history(table)
        history = pool.submit(
            self._timed,
            write_history,
            table,
            decoded,
            placeholders,
            stored,
            history_table,
            self._empty(history_path(self.root, table.qualified), history_table),
        )
        newest = Window.partitionBy("_cdc_key").orderBy(
            F.col("_cdc_commit_lsn").desc_nulls_last(),
            F.col("_cdc_lsn").desc(),
            F.col("_cdc_offset").desc(),
        )
        source = (
            decoded.where("_cdc_cut_ms IS NULL")  # what a later TRUNCATE emptied is history only
            .withColumn("__rank", F.row_number().over(newest))
            .where("__rank = 1")
        )
        for flag in placeholders:
            c = flag[len("__ph_") :]
            known = F.coalesce(F.col(q(f"__carried_{c}") + ".known"), F.lit(False))
            source = source.withColumn(
                c, F.when(known, F.col(q(f"__carried_{c}") + ".v")).otherwise(F.col(q(c)))
            ).withColumn(flag, F.col(q(flag)) & ~known)
        condition = " AND ".join(f"t.{q(k)} <=> s.{q('_cdc_k_' + k)}" for k in table.key)
        meta = {
            "_cdc_commit_lsn": "s._cdc_commit_lsn",
            "_cdc_lsn": "s._cdc_lsn",
            "_cdc_offset": "s._cdc_offset",
            "_cdc_partition": "s._cdc_partition",
            "_cdc_commit_ts": "timestamp_millis(s._cdc_commit_ms)",
        }
        values = {}
        for column in table.columns:
            c = column.name
            if column.name in table.key:
                values[c] = f"s.{q('_cdc_k_' + c)}"
            elif f"__ph_{c}" in placeholders:  # a deleted row's values are no one's to keep
                values[c] = (
                    f"CASE WHEN s.{q('__ph_' + c)} THEN (CASE WHEN t._cdc_deleted THEN NULL "
                    f"ELSE t.{q(c)} END) ELSE s.{q(c)} END"
                )
            else:
                values[c] = f"s.{q(c)}"
        insert = {
            c: (
                v
                if not v.startswith("CASE")
                else f"CASE WHEN s.{q('__ph_' + c)} THEN NULL ELSE s.{q(c)} END"
            )
            for c, v in values.items()
        }
        # a key the table does not hold yet: the change's values (none for a delete)
        inserted = {
            **{
                q(c): (v if c in table.key else f"CASE WHEN s._cdc_op = 'd' THEN NULL ELSE {v} END")
                for c, v in insert.items()
            },
            **meta,
            "_cdc_deleted": "s._cdc_op = 'd'",
        }
        if fresh:
            # every key is new: what the MERGE below would write, in a plain append
            first = (
                source.alias("s")
                .where("s._cdc_commit_lsn IS NOT NULL")
                .selectExpr(*[f"{v} AS {c}" for c, v in inserted.items()])
            )
            return decoded, history, partial(append_rows, target, first)
        merge = (
            target.alias("t")
            .merge(source.alias("s"), condition)
            .whenMatchedUpdate(  # a tombstone: deletes what an earlier record wrote
                condition="s._cdc_commit_lsn IS NULL AND NOT t._cdc_deleted AND "
                "t._cdc_partition = s._cdc_partition AND t._cdc_offset < s._cdc_offset",
                # its marker sits just below the change it deleted (position.below)
                set={
                    "_cdc_offset": "s._cdc_offset",
                    "_cdc_lsn": "t._cdc_lsn - 1",
                    "_cdc_deleted": "true",
                },
            )
            .whenMatchedUpdate(
                condition=f"s._cdc_commit_lsn IS NOT NULL AND s._cdc_op = 'd' AND {_OLDER}",
                set={**meta, "_cdc_deleted": "true"},
            )
            .whenMatchedUpdate(
                condition=f"s._cdc_commit_lsn IS NOT NULL AND {_OLDER}",
                set={
                    **{q(c): v for c, v in values.items()},
                    **meta,
                    "_cdc_deleted": "false",
                },
            )
            .whenNotMatchedInsert(condition="s._cdc_commit_lsn IS NOT NULL", values=inserted)
        )
        return decoded, history, merge.execute

    def write_frame(
        self,
        tables: dict[str, Table],
        events: Any,
        present: set[str],
        toasted: set[str] | None = None,
    ) -> None:
        """MERGE each key's newest event of the batch into its table's current state, and
        every event into its history (`present`: the tables the batch has events of;
        `toasted`: those of them whose events may carry a TOAST placeholder, None: any;
        `cut_ms`, per event: the commit time of the TRUNCATE it came before, if any).

        A TOAST placeholder in the last event is filled from the key's latest earlier
        event in the batch that carried the value (if none did, the stored value stays).

        The tables of the batch are written side by side, each table's history and
        current state too (separate Delta tables), so the cores work while a MERGE's
        driver plans, reads a log or commits. A table that holds no row yet (a first
        load, a reset) is appended to, not merged into. The history reads the current
        state only for values an unchanged TOASTed column leaves out, which a concurrent
        MERGE of the same batch does not change (it keeps the stored value, or writes the
        batch's own, which the history takes from the batch).
        """
        keep = frames_to_keep(self.after_batch)
        kept: dict[str, dict[str, Any]] = {}
        names = sorted(present & set(tables))
        # a thread per table (its decoding, its reads of stored values, its current
        # state's MERGE) and one per history write
        with (
            ThreadPoolExecutor(self.parallel, thread_name_prefix="table") as each,
            ThreadPoolExecutor(self.parallel, thread_name_prefix="history") as histories,
        ):
            writes = [
                each.submit(
                    self._write_table,
                    tables[n],
                    events,
                    histories,
                    keep.get(n, set()),
                    toasted is None or n in toasted,
                )
                for n in names
            ]
            wait(writes)  # every MERGE has ended before the batch does
        for name, write in zip(names, writes, strict=True):
            history_s, current_s, kept[name] = write.result()  # the first failure raises
            log.info("warehouse %s: history %.1f s, current %.1f s", name, history_s, current_s)
        truncated, self._truncated = self._truncated, set()
        for step in self.after_batch:
            step.refresh(self.spark, self.root, tables, kept, truncated)


def frames_to_keep(steps: Sequence[BatchStep]) -> dict[str, set[str]]:
    """What of each table's batch the steps after it read: its keys ("keys": a join
    view's sides), its creation events ("created": the stream of a stream-table join),
    its changes per key ("versions": the table a stream-table join references)."""
    keep: dict[str, set[str]] = {}
    for step in steps:
        for table, frames in step.keeps().items():
            keep.setdefault(table, set()).update(frames)
    return keep


def any_of(conditions: list[Any]) -> Any:
    """OR of the conditions as a balanced tree (a chain of thousands is too deep for Spark)."""
    while len(conditions) > 1:
        pairs = [conditions[i : i + 2] for i in range(0, len(conditions), 2)]
        conditions = [p[0] | p[1] if len(p) == 2 else p[0] for p in pairs]
    return conditions[0]
