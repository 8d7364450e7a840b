"""The warehouse read back: what `cdc verify`, repair and `cdc get` read of a table's
current state and history, and every value in one comparable form."""

from __future__ import annotations

import functools
import json
import re
from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

from cdc.core.catalog import Table
from cdc.core.errors import QueryError, StoreError
from cdc.stores.base import Entry, RowForm, Rows, StoreReader, row_digest
from cdc.stores.warehouse.conflicts import retried
from cdc.stores.warehouse.history import TRUNCATE_OP, derived_history, history_key
from cdc.stores.warehouse.native import NativeWriter, key_match
from cdc.stores.warehouse.tables import current_path, history_path, view_path
from cdc.types.decode import decode_value
from cdc.types.keys import integer_values, key_text
from cdc.types.spark_types import quoted as q
from cdc.types.store_forms import row_form, warehouse_value

__all__ = ["WarehouseReader", "any_of", "broken_table"]


_REMOVE_BATCH = 1000  # keys per removal (a MERGE) of a many-column key


class WarehouseReader(StoreReader):
    """The reading half of WarehouseStore (its tables at `root`, read in `spark`)."""

    spark: Any
    root: str
    native: NativeWriter

    @abstractmethod
    def _ensure(self, table: Table) -> Any:
        """The table's current state as a DeltaTable, made if it is not there yet."""

    def rows(self, table: Table) -> Rows:
        return dict(self.held(table))

    def held(self, table: Table) -> Iterator[tuple[str, dict[str, Any]]]:
        return self.held_at(table, current_path(self.root, table.qualified), live=True)

    def holds(self, table: Table) -> bool:
        """Whether the table's current state is a Delta table yet (its log, not its data)."""
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, current_path(self.root, table.qualified)))

    def live_frame(self, table: Table) -> Any | None:
        """The table's live rows as a DataFrame; None while it has no Delta table."""
        return self._frame(current_path(self.root, table.qualified))

    def history_frame(self, table: Table) -> Any | None:
        """The table's history as versions with their ends (history.derived_history);
        None while it has none."""
        frame = self._frame(history_path(self.root, table.qualified))
        return None if frame is None else derived_history(self.spark, frame, list(table.key))

    def view_frame(self, name: str) -> Any | None:
        """A derived view's Delta table as a DataFrame; None while it has none."""
        return self._frame(view_path(self.root, name))

    def view_rows(self, view: Table, name: str) -> Rows:
        """The rows of the derived view `name` (`view`: its columns and key)."""
        return self.rows_at(view, view_path(self.root, name))

    def sql_names(self, tables: list[str], views: list[str]) -> dict[str, str]:
        """SQL name -> Delta path, for the tables and views the warehouse holds now:
        `<table>` (its live rows), `<table>_history` (its versions), each view by its
        name; a table name that two schemas share as `<schema>_<table>`."""
        from delta.tables import DeltaTable

        short = [t.split(".", 1)[1] for t in tables]
        names: dict[str, str] = {}
        for qualified in tables:
            schema, table = qualified.split(".", 1)
            name = table if short.count(table) == 1 else f"{schema}_{table}"
            names[name] = current_path(self.root, qualified)
            names[f"{name}_history"] = history_path(self.root, qualified)
        for view in views:
            names[view] = view_path(self.root, view)
        return {n: p for n, p in names.items() if DeltaTable.isDeltaTable(self.spark, p)}

    def register_for_sql(
        self, tables: list[str], views: list[str], as_of: str | None = None
    ) -> dict[str, str]:
        """Each table and view (sql_names) as a temporary view of its SQL name, as of a
        Delta version (digits) or a timestamp; a history with each version's
        `valid_from` and `valid_to` derived as it is read (history.derived_history)."""
        names = self.sql_names(tables, views)
        for name, path in names.items():
            reader = self.spark.read.format("delta")
            if as_of is not None:
                option = "versionAsOf" if as_of.isdigit() else "timestampAsOf"
                reader = reader.option(option, as_of)
            try:
                frame = reader.load(path)
            except Exception as exc:  # a version or time the table does not have
                line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                raise QueryError(f"{name} has no state as of {as_of}: {line}") from None
            if name.endswith("_history") and path.endswith("/history"):
                key = history_key(self.spark, path)
                if not key:
                    raise QueryError(
                        f"{name} is of the warehouse's earlier layout: run "
                        "`cdc rebuild --store warehouse`"
                    )
                frame = derived_history(self.spark, frame, key)
            # one identifier, whatever it holds: a table named `we.ird` is not two parts
            frame.createOrReplaceTempView("`" + name.replace("`", "``") + "`")
        return names

    def _frame(self, path: str) -> Any | None:
        """The Delta table at `path` as a DataFrame; None while there is none."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self.spark, path):
            return None
        return self.spark.read.format("delta").load(path)

    def rows_at(self, table: Table, path: str, live: bool = False) -> Rows:
        """The rows of the Delta table at `path` with `table`'s columns (a current state,
        or a join view's; `live`: a current state, whose columns PostgreSQL dropped must
        hold no value)."""
        return dict(self.held_at(table, path, live))

    def held_at(
        self, table: Table, path: str, live: bool = False
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """rows_at, a row at a time (read by delta-rs a file at a time)."""
        try:
            yield from self._held_at(table, path, live)
        except Exception as exc:
            if (said := self.unreadable(table, exc)) is None:
                raise
            raise said from None

    def _held_at(self, table: Table, path: str, live: bool) -> Iterator[tuple[str, dict[str, Any]]]:
        held = self.native.snapshot(path)
        if held is not None:  # read by delta-rs, in this process: no Spark job
            names, gone = _read_columns(table, held.schema.names, live)
            return _held(table, names, gone, held.to_batches(columns=names + gone))
        frame = self._frame(path)
        if frame is None:
            return iter(())
        names, gone = _read_columns(table, frame.columns, live)
        # as Arrow: one job, no Row objects (timestamps come with their UTC zone)
        arrow = frame.select(*[q(n) for n in names + gone]).toArrow()
        return _held(table, names, gone, arrow.to_batches())

    def unreadable(self, table: Table, exc: BaseException) -> StoreError | None:
        return broken_table(self.spark, self.root, exc, table.qualified)

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return warehouse_form(table, row)

    def source_form(self) -> RowForm:
        return warehouse_form

    def digest_frame(self, spark: Any, table: Table, parts: int, shipped: Any) -> Any:
        """The table's current state read by Spark (spread over `parts` tasks at least),
        each row hashed on the executors."""
        frame = self._frame(current_path(self.root, table.qualified))
        if frame is None:
            return spark.createDataFrame([], _DIGESTS)
        names, gone = _read_columns(table, frame.columns, live=True)
        frame = frame.select(*[q(n) for n in names + gone])
        if frame.rdd.getNumPartitions() < parts:
            frame = frame.repartition(parts)
        return frame.mapInArrow(functools.partial(_digests, table, names, gone), _DIGESTS)

    def remove(self, table: Table, keys: list[str]) -> None:
        """The rows go from the current state (the history keeps what it recorded)."""
        target = self._ensure(table)
        # the Delta values of the keys to remove (a key's text is not its Delta value;
        # integers' are read from the texts, where every other key is found by reading
        # the table's keys)
        live = target.toDF().select(*[q(k) for k in table.key])
        values = integer_values(table, keys)
        if values is None:
            wanted = set(keys)
            values = [
                row.asDict()
                for row in live.toLocalIterator()
                if key_text(table, row.asDict()) in wanted
            ]
        if not values:
            return
        path = current_path(self.root, table.qualified)
        what = f"the repair's removal from {table.qualified}"
        for condition in _conditions(table, values):
            # by delta-rs where it writes the table: a commit in a tenth of a second, where
            # Spark's DELETE takes seconds and loses every commit conflict to a table
            # written as often as the apply writes it
            source = live.where(condition).select(*[_as_source_key(k) for k in table.key])
            on = key_match(table)
            if not self.native.merge(path, source, on, [("delete", None, None)]):
                retried(what, functools.partial(target.delete, condition))

    def get(self, table: Table, key: str) -> Entry | None:
        """The key's live row; for a deleted key, its delete as the history holds it."""
        try:
            return self._get(table, key)
        except Exception as exc:
            if (said := self.unreadable(table, exc)) is None:
                raise
            raise said from None

    def _get(self, table: Table, key: str) -> Entry | None:
        from pyspark.sql import functions as F

        raw = json.loads(key)
        match = F.lit(True)
        for name in table.key:
            value = decode_value(table.column(name), raw.get(name))
            match = match & F.col(q(name)).eqNullSafe(F.lit(value))
        current = self._frame(current_path(self.root, table.qualified))
        found = [] if current is None else current.where(match).collect()
        if found:
            return Entry(found[0].asDict(), False)
        history = self._frame(history_path(self.root, table.qualified))
        newest = (
            []
            if history is None
            else history.where(match & (F.col("_cdc_op") != TRUNCATE_OP))
            .orderBy(F.col("_cdc_commit_lsn").desc(), F.col("_cdc_lsn").desc())
            .limit(1)
            .collect()
        )
        if newest and newest[0]["_cdc_op"] == "d":
            return Entry(newest[0].asDict(), True)
        return None


_DIGESTS = "key string, digest binary"

# a data file a Delta log names and the storage lacks, as delta-rs (FileNotFoundError:
# "Object at location … not found") and Spark (java.io.FileNotFoundException) say it:
# its name, and the table whose folder (<schema>/<table>/current or history) holds it
_FILE = re.compile(r"([^\s/'\"]+\.parquet)")
_TABLE = re.compile(r"/([^/\s'\"]+)/([^/\s'\"]+)/(?:current|history)/[^/\s'\"]+\.parquet")


def broken_table(
    spark: Any, root: str, exc: BaseException, table: str | None = None
) -> StoreError | None:
    """`exc` as the warehouse says it when it means a data file that the latest version
    of a table's Delta log names is gone, with what writes the table again (`table`: the
    table read; else the one whose folder the file is in); None for any other error, and
    for a file a VACUUM removed while an older version of the table was read (read it
    again: the latest version does not name it)."""
    text = str(exc)
    if not isinstance(exc, FileNotFoundError) and "FileNotFoundException" not in text:
        return None
    found = _FILE.search(text)
    if table is None and (folder := _TABLE.search(text)) is not None:
        table = f"{folder.group(1)}.{folder.group(2)}"
    if found is None or table is None or not _named(spark, root, table, found.group(1)):
        return None
    return StoreError(
        f"the warehouse's copy of {table} cannot be read: a data file its Delta log "
        f"names is missing ({found.group(1)}): `cdc rebuild --store warehouse --table "
        f"{table} --yes` writes it again from the log"
    )


def _named(spark: Any, root: str, table: str, file: str) -> bool:
    """Whether the latest version of the table's current state or history names `file`
    (read from its Delta log alone)."""
    for path in (current_path(root, table), history_path(root, table)):
        try:
            names = spark.read.format("delta").load(path).inputFiles()
        except Exception:  # no such table (yet): it names nothing
            continue
        if any(name.endswith("/" + file) for name in names):
            return True
    return False


def warehouse_form(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """A source row in the warehouse's comparison form (WarehouseReader.form)."""
    return row_form(table, row, warehouse_value, _CONVERTED)


_CONVERTED = frozenset({"interval", "float4"})  # whose str or int warehouse_value converts


def _read_columns(table: Table, columns: list[str], live: bool) -> tuple[list[str], list[str]]:
    """The table's columns, and of the Delta table's `columns` those PostgreSQL dropped
    (of a current state, `live`: a value left in one is drift, as a field left in the
    cache or the index is)."""
    names = [c.name for c in table.columns]
    gone = [n for n in columns if live and n not in names and not n.startswith("_cdc")]
    return names, gone


def _held(
    table: Table, names: list[str], gone: list[str], batches: Iterator[Any]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each row of the Arrow `batches` (columns `names`, then `gone`): its key text and
    its comparison form, with a value left in a dropped column."""
    for batch in batches:
        for record in batch.to_pylist():
            values = dict(zip(names + gone, record.values(), strict=True))
            row = warehouse_form(table, values)
            row.update({n: values[n] for n in gone if values[n] is not None})
            yield key_text(table, values), row


def _digests(
    table: Table, names: list[str], gone: list[str], batches: Iterator[Any]
) -> Iterator[Any]:
    """On an executor: each row's key text and content hash (row_digest)."""
    import pyarrow as pa

    for batch in batches:
        keys, digests = [], []
        for key, row in _held(table, names, gone, iter([batch])):
            keys.append(key)
            digests.append(row_digest(row))
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.string()), pa.array(digests, pa.binary())], ["key", "digest"]
        )


def _conditions(table: Table, values: list[dict[str, Any]]) -> list[Any]:
    """Spark conditions that together match the rows of the keys `values`: one IN list
    (Spark makes it a hash set), or a condition per _REMOVE_BATCH keys."""
    from pyspark.sql import functions as F

    column = table.key[0]
    if len(table.key) == 1 and all(v[column] is not None for v in values):
        return [F.col(q(column)).isin([v[column] for v in values])]
    return [
        _matching(table, values[at : at + _REMOVE_BATCH])
        for at in range(0, len(values), _REMOVE_BATCH)
    ]


def _as_source_key(column: str) -> Any:
    """The key column `column` under the name a MERGE's source gives it (`_cdc_k_<column>`)."""
    from pyspark.sql import functions as F

    return F.col(q(column)).alias(f"_cdc_k_{column}")


def _matching(table: Table, values: list[dict[str, Any]]) -> Any:
    """A Spark condition: the row's key is one of `values` (NULL matching NULL: a key
    column may hold NULL, pipeline.key_columns)."""
    from pyspark.sql import functions as F

    matches = []
    for value in values:
        match = F.lit(True)
        for column in table.key:
            match = match & F.col(q(column)).eqNullSafe(F.lit(value[column]))
        matches.append(match)
    return any_of(matches)


def any_of(conditions: list[Any]) -> Any:
    """OR of the conditions as a balanced tree (a chain of thousands is too deep for Spark)."""
    while len(conditions) > 1:
        pairs = [conditions[i : i + 2] for i in range(0, len(conditions), 2)]
        conditions = [p[0] | p[1] if len(p) == 2 else p[0] for p in pairs]
    return conditions[0]
