"""Delta Lake: per source table, its live rows (`current`) and its history of versions.

`<warehouse>/<prefix>/<schema>/<table>/current` holds the live rows, one per key: the
columns typed from the PostgreSQL catalog, plus where the change that wrote each sits
(`_cdc_commit_lsn`, `_cdc_lsn`: cdc/log/position.py; `_cdc_partition`,
`_cdc_offset`) and its commit time `_cdc_commit_ts`. A delete removes the row: any
engine that reads the table reads the live rows. `.../history` holds every version,
appended (history.py).

Each batch writes, per table, first its new versions to the history (one append), then
its keys' newest changes to `current`: one MERGE that takes a change only from a newer
position, and deletes; or one append, when the table holds no row yet or every change
of the batch is an insert or a read of a key it does not hold. Which changes are new is
told mostly without reading either table back (_marks.py). A batch delta-rs writes is
decoded by one Spark job for all its tables and shaped on the driver in Arrow
(_arrow_batch.py, `_write_arrow`); one that may hold a TOAST placeholder, or a change
the history holds already, by Spark's jobs per table (`_write_table`). An unchanged
TOASTed value keeps the stored column. A tombstone deletes only what an earlier record
of its partition wrote.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from cdc.core.catalog import Column, Table, reserved_problem
from cdc.core.errors import ConfigError, StoreError
from cdc.core.settings import Settings
from cdc.log.position import older_sql
from cdc.stores.base import BatchContext, BatchOutcome, DerivedView, FrameStore
from cdc.stores.warehouse.conflicts import retried
from cdc.stores.warehouse.history import (
    HISTORY_META,
    KEY_PROPERTY,
    TRUNCATE_OP,
    version_rows,
)
from cdc.stores.warehouse.native import (
    NativeWriter,
    datafusion_quoted,
    key_match,
)
from cdc.stores.warehouse.read.readback import WarehouseReader, broken_table
from cdc.stores.warehouse.settings import warehouse_settings, writer_in_use
from cdc.stores.warehouse.steps import BatchStep, Keep, Kept, frames_to_keep, steps_of
from cdc.stores.warehouse.tables import (
    aligned_rows,
    append_rows,
    clear_columns,
    current_path,
    dropped_columns,
    ensure_delta,
    history_path,
    is_empty,
    warehouse_root,
)
from cdc.stores.warehouse.write import _arrow_batch as arrow_batch
from cdc.stores.warehouse.write._marks import (
    Marks,
    held_since,
    holds_any,
    lowest_commit,
    newest_held,
    stored_values,
    summarize,
)
from cdc.stores.warehouse.write._merge import POSITION, current_clauses, current_values, key_image
from cdc.stores.warehouse.write.routes import WarehouseBatches
from cdc.types.spark_types import PLACEHOLDER_FLAG, flagged, spark_type, typed_image
from cdc.types.spark_types import quoted as q

__all__ = ["WarehouseStore"]

log = logging.getLogger(__name__)

# the columns of the layout before the current state held live rows only and the history
# was appended to: such a table is rebuilt (`cdc rebuild --store warehouse`)
_OLDER_LAYOUT = ("_cdc_deleted", "valid_to", "_cdc_newest")
_EVENT_META = ("key", "op", "offset", "partition", "commit_lsn", "lsn", "commit_ms", "cut_ms")


# a table's batch whose events' row images hold more characters than this is written by
# Spark, whose tasks stream it, rather than collected into the driver for delta-rs (its
# heap, spark.driver_memory, is 2 GiB by default, and tables are written side by side)
NATIVE_MAX_CHARS = 64 * 1024 * 1024


class WarehouseStore(WarehouseReader, FrameStore):
    name = "warehouse"

    def __init__(
        self,
        spark: Any,
        root: str,
        after_batch: Sequence[BatchStep] = (),
        writer: str = "delta-rs",
        max_records: int = 500_000,
        heap: str = "2g",
    ) -> None:
        self.spark = spark
        self.root = root
        # a batch's route and its decode (routes.py); `max_records` a batch's most records
        # ([stores.warehouse] max_offsets_per_trigger), `heap` the driver's (spark.driver_memory)
        self.batches = WarehouseBatches(self, max_records, heap)
        # the current state's and the history's batches: delta-rs where it can (native.py),
        # which writes a local warehouse only: a remote one (s3a://, hdfs://) is Spark's
        self.local = "://" not in root or root.startswith("file:")
        self.native = NativeWriter(enabled=writer == "delta-rs")
        self.after_batch = list(after_batch)
        self._truncated: set[str] = set()
        # each Delta table's handle, kept while the columns it was checked for hold
        self._tables: dict[str, tuple[tuple[Column, ...], Any]] = {}
        # the Delta tables known to hold rows (only a reset empties one again)
        self._filled: set[str] = set()
        # per history: what it holds of each Kafka partition (read once, then kept)
        self._marks: dict[str, Marks] = {}
        # tables written at once: twice the cores, as much of a Delta write is driver work
        self.parallel = min(2 * (os.cpu_count() or 1), 8)

    def written_by_spark(self) -> dict[str, str]:
        return dict(self.native.refused)

    def write_batch(self, raw: Any, ctx: BatchContext) -> BatchOutcome:
        try:
            return self.batches.write(raw, ctx)
        except Exception as exc:  # a table missing a data file: said, with its mend
            if (broken := broken_table(self.spark, self.root, exc)) is None:
                raise
            raise broken from None

    def max_offsets(self, default: int) -> int:
        return self.batches.max_records  # fewer, larger Delta commits when catching up

    def take_views(self, views: Sequence[DerivedView]) -> None:
        self.after_batch = steps_of(views)  # its join views (steps.py)

    def prepare(self, tables: Iterable[Table]) -> None:
        for table in tables:
            self._ensure(table)
            self._history(table)

    def _known(self, path: str, table: Table) -> Any:
        """The handle of the Delta table at `path` once it is made for `table`'s columns
        as they are now (None: not yet); a handle always reads the table's latest
        version."""
        known = self._tables.get(path)
        return known[1] if known is not None and known[0] == table.columns else None

    def _ensure(self, table: Table) -> Any:
        """The table's live rows (SCD type 1), created or widened to its columns."""
        from pyspark.sql import types as T

        path = current_path(self.root, table.qualified)
        if (known := self._known(path, table)) is not None:
            return known
        return self._delta(
            path,
            [
                T.StructField("_cdc_offset", T.LongType()),
                T.StructField("_cdc_partition", T.IntegerType()),
                T.StructField("_cdc_lsn", T.LongType()),
                T.StructField("_cdc_commit_ts", T.TimestampType()),
                T.StructField("_cdc_commit_lsn", T.LongType()),
            ],
            table,
            clear_dropped=True,
        )

    def _history(self, table: Table) -> Any:
        """The table's history (SCD type 2), created or widened to its columns."""
        from pyspark.sql import types as T

        path = history_path(self.root, table.qualified)
        if (known := self._known(path, table)) is not None:
            return known
        if problem := reserved_problem([c.name for c in table.columns], ("warehouse",)):
            raise ConfigError(f"table {table.qualified} cannot be kept in the warehouse: {problem}")
        kinds = {
            "_cdc_op": T.StringType(),
            "_cdc_offset": T.LongType(),
            "_cdc_partition": T.IntegerType(),
            "_cdc_lsn": T.LongType(),
            "_cdc_commit_ts": T.TimestampType(),
            "_cdc_commit_lsn": T.LongType(),
        }
        return self._delta(
            path,
            [T.StructField(name, kinds[name]) for name in HISTORY_META],
            table,
            properties={KEY_PROPERTY: json.dumps(list(table.key))},
        )

    def _delta(
        self,
        path: str,
        meta: list[Any],
        table: Table,
        clear_dropped: bool = False,
        properties: dict[str, str] | None = None,
    ) -> Any:
        """The Delta table at `path` for `table`'s columns and `meta`, with `properties`.
        A column dropped in PostgreSQL stays in the Delta table (its history keeps what
        it held); with `clear_dropped` (the current state) no live row keeps a value in
        it."""
        from pyspark.sql import types as T

        fields = [T.StructField(c.name, spark_type(c)) for c in table.columns] + meta
        target = ensure_delta(self.spark, path, fields, properties=properties or {})
        older = set(target.toDF().columns) & set(_OLDER_LAYOUT)
        if older:
            raise StoreError(
                f"the warehouse table {path} is of an earlier layout (it has "
                f"{', '.join(sorted(older))}): run `cdc rebuild --store warehouse`"
            )
        if clear_dropped:
            clear_columns(target, dropped_columns(target, fields))
        self._tables[path] = (table.columns, target)
        return target

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        """Rows written before the TRUNCATE (position `before`) go; the history gets the
        TRUNCATE's row, which ends every version before it (once: a TRUNCATE applied
        again finds its row)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        commit, lsn = int(before[0]), int(before[1])
        cut = older_sql(POSITION, [str(commit), str(lsn)])
        target = self._ensure(table)
        retried(f"the TRUNCATE of {table.qualified}", lambda: target.delete(cut))
        history = self._history(table)
        held = history.toDF().where(
            f"_cdc_op = '{TRUNCATE_OP}' AND _cdc_commit_lsn = {commit} AND _cdc_lsn = {lsn}"
        )
        if not held.limit(1).count():
            row = self.spark.createDataFrame(
                [(TRUNCATE_OP, commit, lsn, int(commit_ms))],
                T.StructType(
                    [
                        T.StructField("_cdc_op", T.StringType()),
                        T.StructField("_cdc_commit_lsn", T.LongType()),
                        T.StructField("_cdc_lsn", T.LongType()),
                        T.StructField("ms", T.LongType()),
                    ]
                ),
            ).withColumn("_cdc_commit_ts", F.timestamp_millis("ms"))
            path = history_path(self.root, table.qualified)
            append_rows(history, path, row.drop("ms"), nulls=True)
            self._filled.add(path)
        self._truncated.add(table.qualified)  # its join views are rebuilt after the batch

    def reset(self, table: Table) -> None:
        """Every row of the table's current state and history goes (a Delta version of
        its own: time travel still reaches what was there). A table of the earlier layout
        is written anew, empty, in this one (`cdc rebuild` is how it is upgraded)."""
        for path in (current_path, history_path):
            where = path(self.root, table.qualified)
            if (frame := self._frame(where)) is not None and set(frame.columns) & set(
                _OLDER_LAYOUT
            ):
                empty = self.spark.createDataFrame([], frame.drop(*_OLDER_LAYOUT).schema)
                empty.write.format("delta").mode("overwrite").option(
                    "overwriteSchema", "true"
                ).save(where)
                self._tables.pop(where, None)
        self._ensure(table).delete()
        self._history(table).delete()
        self._filled.discard(current_path(self.root, table.qualified))
        self._filled.discard(history_path(self.root, table.qualified))
        self._marks.pop(history_path(self.root, table.qualified), None)
        self._truncated.add(table.qualified)

    def _empty(self, path: str, target: Any) -> bool:
        """The Delta table holds no row yet (a first load, or after a reset): a batch
        into it is a plain append, every change of it new to the table."""
        if path in self._filled:
            return False
        files = self.native.files(path)  # delta-rs reads the log faster than Spark starts
        if files == 0 or (files is None and is_empty(target)):
            return True
        self._filled.add(path)
        return False

    def _marks_of(self, table: Table, history: Any) -> Marks:
        """What the table's history holds of each Kafka partition (read once a process)."""
        path = history_path(self.root, table.qualified)
        if path not in self._marks:
            if self._empty(path, history):
                self._marks[path] = Marks()
            else:
                columns = ["_cdc_partition", "_cdc_commit_lsn", "_cdc_lsn", "_cdc_offset"]
                batches = self.native.batches(path, [*columns, "_cdc_op"])
                self._marks[path] = (
                    Marks.read(history) if batches is None else Marks.read_arrow(batches)
                )
        return self._marks[path]

    def _write_table(
        self,
        table: Table,
        events: Callable[[], Any],
        keep: set[Keep],
        toasted: bool,
        native: NativeWriter | None,
    ) -> tuple[float, float, Kept]:
        """A table's events of the batch into its history, then its current state; their
        seconds, and what the steps after the batch read of it (`keep`; steps.py Kept)."""
        from pyspark.sql import functions as F

        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        decoded, placeholders = self._decode(table, events(), toasted)
        try:
            history_s, current_s = self._write(table, decoded, placeholders, native)
            keys = created = versions = None
            if "keys" in keep:
                keys = (
                    decoded.select(*[F.col(q(f"_cdc_k_{k}")).alias(k) for k in table.key])
                    .distinct()
                    .localCheckpoint()
                )
            changes = decoded.where("_cdc_commit_lsn IS NOT NULL")  # tombstones are not changes
            if "created" in keep:  # an INSERT carries every value: no placeholder
                created = (
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
                versions = changes.select(
                    F.col(q(f"_cdc_k_{table.key[0]}")).alias("_cdc_ref"),
                    "_cdc_commit_lsn",
                    "_cdc_lsn",
                ).localCheckpoint()
            return history_s, current_s, Kept(keys, created, versions)
        finally:
            decoded.unpersist()

    def _decode(self, table: Table, events: Any, toasted: bool) -> tuple[Any, set[str]]:
        """A table's events of the batch, decoded and checkpointed (the caller unpersists
        them), and the flag columns of the values an unchanged TOASTed column left out
        (`toasted` false: no event of the batch carries a placeholder). Each event's
        placeholders are filled from the key's latest earlier event of the batch that
        carried the value (`_cdc_carried_<column>`)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        rows = events.where(F.col("table") == table.qualified)
        decoded = rows.select(
            # under names no column can take (cdc.core.catalog.reserved_problem)
            *[F.col(c).alias(f"_cdc_{c}") for c in _EVENT_META],
            *key_image(table),
            *typed_image(table, F.col("after"), placeholders=toasted),
        )
        # a key column's value comes from the event's key, never a placeholder
        placeholders = {
            c
            for c in decoded.columns
            if c.startswith(PLACEHOLDER_FLAG) and flagged(c) not in table.key
        }
        for flag in placeholders:
            # a create carrying a placeholder is a key change (an INSERT carries every
            # value): the value kept under this key belongs to another row, so it is
            # not known (NULL), never kept. A read (the snapshot, a backfill) carries
            # every value: one that looks like a placeholder is real (the value stays)
            c = flagged(flag)
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
            c = flagged(flag)
            # the key's latest known value of c in the batch up to this event: a real
            # value is known, a placeholder tells nothing, a delete forgets
            value = F.when(
                F.col("_cdc_op") == "d",
                F.struct(F.lit(None).cast(types[c]).alias("v"), F.lit(False).alias("known")),
            ).when(~F.col(q(flag)), F.struct(F.col(q(c)).alias("v"), F.lit(True).alias("known")))
            decoded = decoded.withColumn(
                f"_cdc_carried_{c}", F.last(value, ignorenulls=True).over(so_far)
            )
        # read by the summary, the history and the current state: computed once, and the
        # plans that read it start from its rows, not from the decoding of the Kafka
        # records (planning and generating code for those cost more than running them)
        return decoded.localCheckpoint(), placeholders

    def _write(
        self, table: Table, decoded: Any, placeholders: set[str], native: NativeWriter | None
    ) -> tuple[float, float]:
        """The batch's new versions into the history, then its keys' newest changes into
        the current state (module doc), by delta-rs where `native` can; their seconds."""

        target, history = self._ensure(table), self._history(table)
        current_at = current_path(self.root, table.qualified)
        summary = summarize(decoded)
        marks = self._marks_of(table, history)
        new = marks.new(summary)
        changes = decoded.where("_cdc_commit_lsn IS NOT NULL")
        tombstones = decoded.where("_cdc_commit_lsn IS NULL")
        # a change delivered twice is one version
        changes = changes.dropDuplicates(["_cdc_key", "_cdc_commit_lsn", "_cdc_lsn"])
        if new:
            versions, latest = changes, changes
        else:  # each key's newest version in the history: older changes are refused
            held = newest_held(table, history, changes, lowest_commit(summary))
            versions = held.where(~held_since(inclusive=True))
            latest = held.where(~held_since(inclusive=False))
            versions, latest = (
                f.drop("_cdc_held_commit", "_cdc_held_lsn") for f in (versions, latest)
            )
        fresh = self._empty(current_at, target)
        stored = None
        if placeholders and not fresh:  # values the history needs, read before the MERGE
            cut = any(p["cut"] for p in summary)
            stored = stored_values(table, target, history, decoded, placeholders, cut)
        started = time.monotonic()
        rows = version_rows(table, versions, placeholders, stored)
        try:
            # a column PostgreSQL dropped: NULL
            self._append(history, history_path(self.root, table.qualified), rows, native)
        except BaseException:
            self._marks.pop(history_path(self.root, table.qualified), None)  # read again
            raise
        self._filled.add(history_path(self.root, table.qualified))
        marks.add(summary)
        history_s = time.monotonic() - started
        started = time.monotonic()
        # every change an insert or a read (a snapshot's, a backfill's) new to the history,
        # and no key of the batch in the table (not even one whose delete the source never
        # published: a detached partition's)
        inserts_only = (
            new
            and not fresh
            and all(p["others"] == 0 for p in summary)
            and not holds_any(table, target, changes)
        )
        self._write_current(
            table, target, latest, tombstones, placeholders, fresh or inserts_only, native
        )
        if fresh or inserts_only:
            self._filled.add(current_at)
        return history_s, time.monotonic() - started

    def _write_current(
        self,
        table: Table,
        target: Any,
        changes: Any,
        tombstones: Any,
        placeholders: set[str],
        append: bool,
        native: NativeWriter | None = None,
    ) -> None:
        """Each key's newest change into the current state: one MERGE, or with `append`
        (the table holds none of the keys: it is empty, or every change is an insert new
        to it) one append of the rows inserted."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        newest = Window.partitionBy("_cdc_key").orderBy(
            F.col("_cdc_commit_lsn").desc_nulls_last(),
            F.col("_cdc_lsn").desc(),
            F.col("_cdc_offset").desc(),
        )
        source = (
            changes.where("_cdc_cut_ms IS NULL")  # what a later TRUNCATE emptied is history only
            .unionByName(tombstones)
            .withColumn("_cdc_rank", F.row_number().over(newest))
            .where("_cdc_rank = 1")
        )
        for flag in placeholders:
            c = flagged(flag)
            known = F.coalesce(F.col(q(f"_cdc_carried_{c}") + ".known"), F.lit(False))
            source = source.withColumn(
                c, F.when(known, F.col(q(f"_cdc_carried_{c}") + ".v")).otherwise(F.col(q(c)))
            ).withColumn(flag, F.col(q(flag)) & ~known)
        source = source.withColumn("_cdc_commit_ts", F.timestamp_millis("_cdc_commit_ms")).select(
            *[q(f"_cdc_k_{k}") for k in table.key],
            *[q(c.name) for c in table.columns if c.name not in table.key],
            *[q(flag) for flag in sorted(placeholders)],
            *[f"_cdc_{m}" for m in ("commit_lsn", "lsn", "offset", "partition", "op", "commit_ts")],
        )
        path = current_path(self.root, table.qualified)
        if append:
            live = source.where("_cdc_commit_lsn IS NOT NULL AND _cdc_op <> 'd'")
            inserted = current_values(table, placeholders, q)[1]
            rows = live.alias("s").selectExpr(*[f"{v} AS {c}" for c, v in inserted.items()])
            self._append(target, path, rows, native)
            return
        native_clauses = current_clauses(table, placeholders, datafusion_quoted)
        on = key_match(table)
        if native is not None and native.merge(path, source, on, native_clauses):
            return
        self._merge_spark(table, target, source, frozenset(placeholders))

    def _merge_spark(
        self, table: Table, target: Any, source: Any, placeholders: frozenset[str] = frozenset()
    ) -> None:
        """The current state's MERGE (`_current_clauses`) of `source` (a Spark frame), by
        Spark; run again on the newest version while it loses to another writer."""

        def merge() -> None:
            merger = target.alias("t").merge(
                source.alias("s"),
                " AND ".join(f"t.{q(k)} <=> s.{q('_cdc_k_' + k)}" for k in table.key),
            )
            for kind, condition, values in current_clauses(table, set(placeholders), q):
                if kind == "delete":
                    merger = merger.whenMatchedDelete(condition=condition)
                elif kind == "update":
                    merger = merger.whenMatchedUpdate(condition=condition, set=values)
                else:
                    merger = merger.whenNotMatchedInsert(condition=condition, values=values)
            merger.execute()

        retried(f"the MERGE into {table.qualified}'s current state", merge)

    def _append(self, target: Any, path: str, rows: Any, native: NativeWriter | None) -> None:
        """`rows` appended to the table at `path`, a column they lack NULL (a column
        PostgreSQL dropped): by delta-rs where it can, else by Spark."""
        aligned = aligned_rows(target, rows, nulls=True)
        if native is None or not native.append(path, aligned):
            aligned.write.format("delta").mode("append").save(path)

    def _write_arrow(
        self, table: Table, events: Any, keep: set[Keep], spark_path: Any
    ) -> tuple[float, float, Kept]:
        """A table's batch shaped on the driver in Arrow (`events`: its decoded events,
        `_decode_batch`; _arrow_batch.py) into its history, then its current state, each
        in one delta-rs commit; what `_write_table` returns. A batch with a change the
        history may hold already (one run again after a crash, Debezium's redelivery)
        takes the Spark path (`spark_path`), which reads its keys' versions back."""
        import pyarrow.compute as pc

        target, history = self._ensure(table), self._history(table)
        current_at = current_path(self.root, table.qualified)
        history_at = history_path(self.root, table.qualified)
        summary = arrow_batch.summarize(events)
        marks = self._marks_of(table, history)
        if not marks.new(summary):
            return spark_path()
        found = arrow_batch.changes(events)
        started = time.monotonic()
        try:
            self._append_arrow(history, history_at, arrow_batch.versions(table, found))
        except BaseException:
            self._marks.pop(history_at, None)  # read again
            raise
        self._filled.add(history_at)
        marks.add(summary)
        history_s = time.monotonic() - started
        started = time.monotonic()
        fresh = self._empty(current_at, target)
        tombstones = events.filter(pc.is_null(events.column("_cdc_commit_lsn")))
        latest = arrow_batch.newest(found, tombstones)
        # every change an insert or a read new to the history, and no key of the batch
        # in the table (not even one whose delete the source never published)
        if fresh or (
            all(p["others"] == 0 for p in summary)
            and not self.native.holds(current_at, list(table.key), arrow_batch.keys(table, events))
        ):
            self._append_arrow(target, current_at, arrow_batch.inserted(table, latest))
            self._filled.add(current_at)
        else:
            self._merge_arrow(table, target, current_at, arrow_batch.merge_source(table, latest))
        current_s = time.monotonic() - started
        # as Arrow tables: a step that needs a Spark frame makes one (steps.as_frame)
        return history_s, current_s, arrow_batch.kept(table, events, keep)

    def _append_arrow(self, target: Any, path: str, rows: Any) -> None:
        """`rows` (Arrow) appended to the table at `path`: by delta-rs, else by Spark."""
        if not self.native.append(path, rows):
            frame = self.spark.createDataFrame(rows)
            aligned_rows(target, frame, nulls=True).write.format("delta").mode("append").save(path)

    def _merge_arrow(self, table: Table, target: Any, path: str, source: Any) -> None:
        """The current state's MERGE of `source` (Arrow, arrow_batch.merge_source): by
        delta-rs, else by Spark."""
        on = key_match(table)
        if not self.native.merge(
            path, source, on, current_clauses(table, set(), datafusion_quoted)
        ):
            self._merge_spark(table, target, self.spark.createDataFrame(source))

    def _decode_batch(self, events: Any, tables: dict[str, Table]) -> dict[str, Any]:
        """The batch's events of `tables` decoded in one Spark job for them all, and
        collected: per table, an Arrow table of the events' `_cdc_<meta>` columns,
        `_cdc_commit_ts`, the key's (`_cdc_k_<column>`) and the row image's columns
        (with no TOAST placeholder: `write_frame` sends a batch that may hold one the
        Spark way)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        names = sorted(tables)
        frame = events.where(F.col("table").isin(names)).select(
            "table",
            *[F.col(c).alias(f"_cdc_{c}") for c in _EVENT_META],
            F.timestamp_millis("commit_ms").alias("_cdc_commit_ts"),
            *[
                F.when(
                    F.col("table") == name,
                    F.struct(
                        *key_image(tables[name]),
                        *typed_image(tables[name], F.col("after"), placeholders=False),
                    ),
                ).alias(f"_cdc_t{at}")
                for at, name in enumerate(names)
            ],
        )
        collected = frame.toArrow()
        meta = [f"_cdc_{c}" for c in _EVENT_META] + ["_cdc_commit_ts"]
        decoded = {}
        for at, name in enumerate(names):
            mine = collected.filter(pc.equal(collected.column("table"), name))
            image = mine.column(f"_cdc_t{at}").combine_chunks()
            columns = [mine.column(m) for m in meta]
            columns += [image.field(i) for i in range(image.type.num_fields)]
            decoded[name] = pa.Table.from_arrays(columns, names=meta + [f.name for f in image.type])
        return decoded

    def _driver_tables(
        self, names: list[str], toasted: set[str] | None, sizes: dict[str, int] | None
    ) -> list[str]:
        """The tables of a batch shaped on the driver (`_write_arrow`): those delta-rs
        writes, with no event that may hold a TOAST placeholder, whose events' row images
        add up to at most NATIVE_MAX_CHARS."""
        if not self.native.enabled or not self.local or toasted is None:
            return []
        chosen, total = [], 0
        for name in names:
            size = (sizes or {}).get(name, 0)
            if name in toasted or self._refused(name):
                continue
            if total + size > NATIVE_MAX_CHARS:
                continue
            chosen.append(name)
            total += size
        return chosen

    def _refused(self, name: str) -> bool:
        """Whether delta-rs refused one of the table's Delta tables in this process."""
        paths = (current_path(self.root, name), history_path(self.root, name))
        return any(p in self.native.refused for p in paths)

    def write_frame(
        self,
        tables: dict[str, Table],
        events: Any,
        present: set[str],
        toasted: set[str] | None = None,
        sizes: dict[str, int] | None = None,
        decoded: dict[str, Any] | None = None,
    ) -> None:
        """Each table's new changes of the batch into its history, and its keys' newest
        changes into its current state (`present`: the tables the batch has events of;
        `toasted`: those of them whose events may carry a TOAST placeholder, None: any;
        `cut_ms`, per event: the commit time of the TRUNCATE it came before, if any;
        `decoded`: per table, its events decoded already in Arrow, cdc/log/
        _arrow_events.py, and then `events` a function that makes the frame when the
        Spark path needs it).

        A TOAST placeholder in the last event is filled from the key's latest earlier
        event in the batch that carried the value (if none did, the stored value stays).

        The tables of the batch are written side by side, so the cores work while a Delta
        write's driver plans, reads a log or commits; each step after the batch (a join
        view) runs as soon as the tables it reads are written. Per table, the history is
        written before the current state: a crash between the two leaves a history
        ahead, and the batch run again finds its versions there (and writes the current
        state).
        """
        keep = frames_to_keep(self.after_batch)
        names = sorted(present & set(tables))
        truncated = set(self._truncated)
        frame = _made_once(events) if decoded is not None else (lambda: events)
        if decoded is None:
            driver = self._driver_tables(names, toasted, sizes)
            decoded = self._decode_batch(events, {n: tables[n] for n in driver}) if driver else {}
        else:  # a table delta-rs cannot write takes the Spark path
            decoded = {n: d for n, d in decoded.items() if not self._refused(n)}

        def spark_path(name: str) -> Any:
            return functools.partial(
                self._write_table,
                tables[name],
                frame,
                keep.get(name, set()),
                toasted is None or name in toasted,
                # a batch delta-rs writes is collected into the driver: a small one
                self.native
                if self.local and (sizes or {}).get(name, 0) <= NATIVE_MAX_CHARS
                else None,
            )

        with (
            ThreadPoolExecutor(self.parallel, thread_name_prefix="table") as each,
            ThreadPoolExecutor(max(len(self.after_batch), 1), thread_name_prefix="view") as after,
        ):
            writes = {
                n: each.submit(
                    self._write_arrow, tables[n], decoded[n], keep.get(n, set()), spark_path(n)
                )
                if n in decoded
                else each.submit(spark_path(n))
                for n in names
            }
            # each step as soon as the tables it reads are written, beside the others
            steps = [
                after.submit(self._refresh, step, tables, writes, truncated)
                for step in self.after_batch
            ]
            wait(writes.values())  # every write has ended before the batch does
            wait(steps)
        for name, write in writes.items():
            history_s, current_s, _ = write.result()  # the first failure raises
            log.info("warehouse %s: history %.1f s, current %.1f s", name, history_s, current_s)
        for step in steps:
            step.result()
        self._truncated -= truncated

    def _refresh(
        self,
        step: BatchStep,
        tables: dict[str, Table],
        writes: dict[str, Future[tuple[float, float, Kept]]],
        truncated: set[str],
    ) -> None:
        """A step after the batch, once the batch's writes of the tables it reads (those
        it keeps frames of) have ended; not run if one of them failed."""
        kept = {n: writes[n].result()[2] for n in step.keeps() if n in writes}
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.name)
        step.refresh(self.spark, self.root, tables, kept, truncated, self.native)


def _made_once(make: Callable[[], Any]) -> Callable[[], Any]:
    """`make`, called at most once, by whichever table's thread needs it first."""
    lock = threading.Lock()
    made: list[Any] = []

    def once() -> Any:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return once


def make(settings: Settings, spark: Any = None) -> WarehouseStore:
    """The warehouse, in `spark` or in a session of its own."""
    if spark is None:
        from cdc.core.spark import spark_session

        spark = spark_session(settings, f"cdc-{settings.pipeline.name}")
    own = warehouse_settings(settings)
    return WarehouseStore(
        spark,
        warehouse_root(settings),
        writer=writer_in_use(settings),
        max_records=own.max_offsets_per_trigger,
        heap=settings.spark.driver_memory,
    )
