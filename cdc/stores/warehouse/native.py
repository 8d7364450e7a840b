"""The warehouse's batch writes (current state, history, views) through delta-rs.

`[stores.warehouse] writer` chooses it (the default) or Spark alone.

A Delta MERGE run by Spark costs about 1.3 s here whatever its size (planning, several
jobs, the commit); delta-rs runs the same MERGE of a batch's changes in well under a
tenth of that, in Rust, beside the JVM. Spark still decodes the batch: its rows are
collected as Arrow and handed over. The tables stay the Delta tables Spark made: one log,
the same protocol, read by Spark, delta-rs and the Iceberg publisher alike.

A table delta-rs cannot write goes on being written by Spark, for the rest of the
process: one that is column-mapped (a column named with a character Parquet cannot
hold), one not on the local filesystem, or one delta-rs refused or failed to write (a
value its statistics cannot hold, such as PostgreSQL's `infinity` date).

Other engines write these tables too (an OPTIMIZE, a VACUUM, a user's DELETE, `cdc
verify --repair`: docs/stores.md). A commit is ours only when it is ours: each write
carries an app transaction of its own (Delta's `txn` action, `WRITER_ID` and a number
no other write of ours uses), and a write that raised counts as written only when the
table's newest version holds that number (it committed, then a hook failed). A write
that lost a commit conflict to another writer is run again on the table's newest
version (the write rule makes the MERGE right on any version), up to
`CONFLICT_RETRIES` times, then handed to Spark; any other failure is retried by Spark
for the rest of the process. So a batch is never written twice, and never counted as
written when it was not.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from cdc.core.catalog import Table

__all__ = ["NativeWriter", "datafusion_quoted", "key_match", "null_safe_match"]

log = logging.getLogger(__name__)

# a checkpoint every this many versions, as Spark writes one: its readers replay at most
# this many JSON commits
CHECKPOINT_EVERY = 10
# the app id of the pipeline's own delta-rs commits (Delta's `txn` action, as Spark's
# txnAppId): each commit carries it with a number of its own (`_commit`)
WRITER_ID = "cdc-apply"
# how many times a write that lost a commit conflict to another writer is run again on the
# table's newest version before it is handed to Spark
CONFLICT_RETRIES = 5


def datafusion_quoted(name: str) -> str:
    """A column name for delta-rs's SQL (DataFusion): in double quotes, one doubled."""
    return '"' + name.replace('"', '""') + '"'


def null_safe_match(pairs: list[tuple[str, str]]) -> str:
    """A MERGE's condition for delta-rs: each target column `t.<a>` equal to the source's
    `s.<b>`, NULL to NULL, for each (a, b) of `pairs`. Each comparison is in parentheses:
    DataFusion's parser reads `x IS NOT DISTINCT FROM y AND z` as `x IS NOT DISTINCT FROM
    (y AND z)`, which fails to plan on any table of more than one key column."""
    return " AND ".join(
        f"(t.{datafusion_quoted(a)} IS NOT DISTINCT FROM s.{datafusion_quoted(b)})"
        for a, b in pairs
    )


def key_match(table: Table) -> str:
    """The condition a MERGE into a table's current state matches a row of the batch by
    (`t.<key>` against `s._cdc_k_<key>`, null_safe_match's form): a key column PostgreSQL
    holds NOT NULL (every primary key's) compared with `=`, which delta-rs turns into a
    range of the batch's keys that prunes the files it reads; a nullable one (keyed by
    pipeline.key_columns) NULL to NULL, which reads every file. The two agree where the
    table's column holds no NULL."""
    pairs = []
    for name in table.key:
        target, source = f"t.{datafusion_quoted(name)}", f"s.{datafusion_quoted('_cdc_k_' + name)}"
        same = "=" if table.column(name).not_null else "IS NOT DISTINCT FROM"
        pairs.append(f"({target} {same} {source})")
    return " AND ".join(pairs)


def _local(path: str) -> str | None:
    """The table's local path, or None: a remote filesystem's (Spark's, with its settings)."""
    if path.startswith("file:"):
        return "/" + path[len("file:") :].lstrip("/")
    return None if "://" in path else path


class NativeWriter:
    """Writes a batch's rows with delta-rs where it can (module doc); `False` from a
    write: the caller writes them with Spark."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        # tables delta-rs does not write in this process: their path, and why
        self.refused: dict[str, str] = {}

    def _table(self, path: str) -> Any | None:
        """The delta-rs handle of the table at `path`, or None: Spark writes it."""
        if not self.enabled or path in self.refused:
            return None
        local = _local(path)
        if local is None:
            self.refused[path] = "not on the local filesystem"
            return None
        from deltalake import DeltaTable

        table = DeltaTable(local)
        if table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
            self.refused[path] = "column-mapped"
            return None
        return table

    def append(self, path: str, rows: Any, transaction: tuple[str, int] | None = None) -> bool:
        """Append `rows` (a Spark frame in the table's columns and types, or an Arrow table
        of the table's columns, any it lacks NULL: `aligned`). With
        `transaction` (a writer's id, its batch's number), once: Delta keeps each writer's
        last number (`txn`, as Spark's `txnAppId`/`txnVersion` do), and a batch whose
        number is not above it is not written again."""
        table = self._table(path)
        if table is None:
            return False
        if transaction is not None:
            done = table.transaction_version(transaction[0])
            if done is not None and done >= transaction[1]:
                return True
        data = aligned(table, rows) if _is_arrow(rows) else rows.toArrow()
        if data.num_rows == 0:
            return True
        from deltalake import Transaction, write_deltalake

        def run(table: Any, commit: Any) -> None:
            write_deltalake(table, data, mode="append", commit_properties=commit, **_hooks())

        return self._commit(
            path, table, run, [] if transaction is None else [Transaction(*transaction)]
        )

    def merge(
        self,
        path: str,
        source: Any,
        on: str,
        clauses: list[tuple[str, str | None, dict[str, str] | None]],
    ) -> bool:
        """MERGE `source` (a Spark frame or an Arrow table, aliased `s`; the table `t`) on
        `on`, with `clauses` in order: ("delete" | "update" | "insert", condition,
        values); values None in an update or insert: every column, from the source's of
        its name."""
        table = self._table(path)
        if table is None:
            return False
        data = source if _is_arrow(source) else source.toArrow()
        if data.num_rows == 0:
            return True

        def run(table: Any, commit: Any) -> None:
            merger = table.merge(
                data,
                on,
                source_alias="s",
                target_alias="t",
                streamed_exec=False,  # the batch is in memory: its keys prune the files read
                commit_properties=commit,
                **_hooks(),
            )
            for kind, condition, values in clauses:
                if kind == "delete":
                    merger = merger.when_matched_delete(condition)
                elif kind == "update" and values is None:
                    merger = merger.when_matched_update_all(condition)
                elif kind == "update":
                    merger = merger.when_matched_update(values, condition)
                elif values is None:
                    merger = merger.when_not_matched_insert_all(condition)
                else:
                    merger = merger.when_not_matched_insert(values, condition)
            merger.execute()

        return self._commit(path, table, run)

    def dataset(self, path: str) -> Any | None:
        """The table at `path` as a pyarrow dataset, read by delta-rs (its latest version);
        None where delta-rs does not write it (Spark reads it)."""
        from deltalake.exceptions import TableNotFoundError

        try:
            table = self._table(path)
        except TableNotFoundError:  # not made yet
            return None
        return None if table is None else table.to_pyarrow_dataset()

    def snapshot(self, path: str) -> Any | None:
        """The latest version of the table at `path` as a pyarrow dataset, for reading
        it whole; None where delta-rs cannot read it (not made yet, not written here, a
        feature it lacks: Spark reads it)."""
        try:
            return self.dataset(path)
        except Exception as exc:  # a table delta-rs cannot read: Spark reads it
            log.info("warehouse: delta-rs cannot read %s: %s", path, exc)
            return None

    def files(self, path: str) -> int | None:
        """How many data files the table at `path` has in its latest version; None when
        delta-rs cannot tell (Spark then reads it)."""
        try:
            table = self._table(path)
            return None if table is None else len(table.file_uris())
        except Exception as exc:  # a table delta-rs cannot read: Spark's answer
            log.info("warehouse: delta-rs cannot list the files of %s: %s", path, exc)
            return None

    def batches(self, path: str, columns: list[str]) -> Any | None:
        """The table's `columns` as Arrow record batches, read a file at a time; None
        when delta-rs cannot read it."""
        try:
            table = self._table(path)
            return None if table is None else table.to_pyarrow_dataset().to_batches(columns=columns)
        except Exception as exc:  # a table delta-rs cannot read: Spark reads it
            log.info("warehouse: delta-rs cannot read %s: %s", path, exc)
            return None

    def holds(self, path: str, key: list[str], wanted: set[tuple[Any, ...]]) -> bool:
        """Whether the table at `path` holds a row of one of the keys `wanted` (tuples of
        the `key` columns' values, arrow_batch.canonical); True when delta-rs cannot tell
        (the caller then MERGEs, which is right either way)."""
        table = self._table(path)
        if table is None:
            return True
        if not wanted:
            return False
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        from cdc.stores.warehouse.write._arrow_batch import canonical

        try:
            dataset = table.to_pyarrow_dataset()
            first = dataset.schema.field(key[0])
            values = pc.cast(pa.array([k[0] for k in wanted]), first.type)
            # only the files whose statistics may hold a wanted key's first column
            kept = _files_in_range(table, first, values)
            if kept is not None:
                fragments = [f for f in dataset.get_fragments() if _relative(f.path) in kept]
                if not fragments:
                    return False
                dataset = ds.FileSystemDataset(
                    fragments, dataset.schema, dataset.format, dataset.filesystem
                )
            found = dataset.to_table(columns=key, filter=ds.field(key[0]).isin(values))
        except Exception as exc:  # a type delta-rs or Arrow cannot filter on: MERGE
            log.info("warehouse: delta-rs cannot look up the keys of %s: %s", path, exc)
            return True
        held = zip(*[found.column(k).to_pylist() for k in key], strict=True)
        return any(canonical(k) in wanted for k in held)

    def _commit(self, path: str, table: Any, write: Any, also: list[Any] | None = None) -> bool:
        """Run `write(table, commit_properties)`; whether the batch is written (module doc).
        `also`: further app transactions its commit records (a view's batch number)."""
        from deltalake import CommitProperties, DeltaTable, Transaction

        for attempt in range(CONFLICT_RETRIES + 1):
            before = table.version()
            # a number no other write of ours takes (nanoseconds, one after the other)
            mine = Transaction(WRITER_ID, _next_number())
            try:
                write(table, CommitProperties(app_transactions=[mine, *(also or [])]))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # delta-rs's errors; a panic (pyo3's is a BaseException)
                latest = DeltaTable(_local(path) or path)
                if latest.transaction_version(WRITER_ID) == mine.version:
                    log.warning("warehouse: delta-rs wrote %s, then failed: %s", path, exc)
                    return True
                said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if latest.version() != before:  # another writer committed meanwhile
                    if attempt == CONFLICT_RETRIES:
                        break
                    log.warning(
                        "warehouse: %s: another writer committed version %d while delta-rs "
                        "wrote (%s); writing the batch again on it (attempt %d of %d)",
                        path,
                        latest.version(),
                        said,
                        attempt + 1,
                        CONFLICT_RETRIES,
                    )
                    # a pause, so that two writers that keep meeting fall out of step
                    time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
                    table = latest
                    continue
                self.refused[path] = said
                log.warning(
                    "warehouse: delta-rs cannot write %s (%s); Spark writes it from now on",
                    path,
                    said,
                )
                return False
            table.update_incremental()
            if table.version() % CHECKPOINT_EVERY == 0:
                table.create_checkpoint()
            return True
        log.warning(
            "warehouse: %s: other writers won %d commits in a row; Spark writes this batch",
            path,
            CONFLICT_RETRIES + 1,
        )
        return False


_last_number = 0
_numbering = threading.Lock()


def _next_number() -> int:
    """A number above every one this process gave before, and above the clock's
    nanoseconds: no two commits of ours carry the same one."""
    global _last_number
    with _numbering:
        _last_number = max(_last_number + 1, time.time_ns())
        return _last_number


def _relative(path: str) -> str:
    """A data file's name in its table's folder (a fragment's path ends with it)."""
    return path.rsplit("/", 1)[-1]


def _files_in_range(table: Any, field: Any, values: Any) -> set[str] | None:
    """The data files of `table` (delta-rs's handle) whose statistics of the column
    `field` hold a value between some of `values`' (its names, as _relative gives
    them), or None: they cannot tell (not a number or a date, whose statistics Delta
    keeps whole; a NULL wanted). A file without statistics of the column is kept. With
    keys above every key the table holds (a serial key's inserts) no file is read."""
    import bisect
    from urllib.parse import unquote

    import pyarrow as pa

    kind = field.type
    if not (pa.types.is_integer(kind) or pa.types.is_date(kind)) or values.null_count:
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    low, high = f"min.{field.name}", f"max.{field.name}"
    if low not in actions.column_names or high not in actions.column_names:
        return None
    wanted = sorted(values.to_pylist())
    kept = set()
    for path, first, last in zip(
        actions.column("path").to_pylist(),
        actions.column(low).to_pylist(),
        actions.column(high).to_pylist(),
        strict=True,
    ):
        at = bisect.bisect_left(wanted, first) if first is not None else 0
        if first is None or last is None or (at < len(wanted) and wanted[at] <= last):
            kept.add(_relative(unquote(path)))
    return kept


def _is_arrow(rows: Any) -> bool:
    import pyarrow as pa

    return isinstance(rows, pa.Table)


def aligned(table: Any, rows: Any) -> Any:
    """`rows` (an Arrow table) in the columns of the Delta table `table` (delta-rs's
    handle), in its order; a column `rows` lacks (one PostgreSQL dropped) NULL."""
    import pyarrow as pa

    schema = pa.schema(table.schema().to_arrow())
    names = set(rows.column_names)
    return pa.Table.from_arrays(
        [
            rows.column(f.name) if f.name in names else pa.nulls(rows.num_rows, f.type)
            for f in schema
        ],
        names=schema.names,
    )


def _hooks() -> dict[str, Any]:
    from deltalake import PostCommitHookProperties

    # checkpoints as Spark writes them (NativeWriter._commit); old logs expire as Spark's do
    return {"post_commithook_properties": PostCommitHookProperties(create_checkpoint=False)}
