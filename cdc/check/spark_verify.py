"""Verify's comparison of one table on Spark's executors.

The source is read in slices of its pages (CTID ranges), one task each, every task in
the one snapshot the driver exports and holds open (`pg_export_snapshot`, `SET
TRANSACTION SNAPSHOT`); each store is read by tasks of its own (StoreReader's
`digest_frame`: the cache's hashes by name, the index's sliced scroll, the warehouse's
Delta table). Every side brings each row to the store's comparison form and hashes it
with the functions verify uses in the `cdc` process (the stores' `form`, row_digest), so
what counts as equal is the same. The hashes are joined by key in Spark, and only the
keys that differ, with each side's row count, come back to the driver.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc.check.source_read import read_rows, selected_columns
from cdc.core.catalog import Table
from cdc.core.errors import StoreUnavailableError, carried_message
from cdc.core.settings import Settings
from cdc.stores.base import DigestReader, RowForm, row_digest
from cdc.stores.registry import executor_settings
from cdc.types.keys import key_text
from cdc.types.store_forms import read_as_text

__all__ = ["Compared", "compare_in_spark", "heap_pages", "source_ranges"]

_BATCH = 10_000  # rows per Arrow batch a source task yields
# suspects up to this many are joined as a broadcast list; more by a shuffle
_BROADCAST_KEYS = 200_000


@dataclass
class Compared:
    """One store's comparison with the source for one table, by key text."""

    source_rows: int
    store_rows: int
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    different: list[str] = field(default_factory=list)


def heap_pages(conn: psycopg.Connection[Any], table: Table) -> tuple[int, int]:
    """The table's heap in bytes (every partition's) and the pages of its largest
    partition (itself, for a table that is not partitioned): what a CTID range spans."""
    # the table and its partition tree (which has no row for a table not partitioned; a
    # partitioned table's own relation has no pages)
    name = sql.Identifier(table.schema, table.name).as_string(conn)
    row = conn.execute(
        "SELECT coalesce(sum(pg_relation_size(relid)), 0), "
        "coalesce(max(pg_relation_size(relid)), 0) / current_setting('block_size')::int "
        "FROM (SELECT %s::regclass AS relid UNION SELECT relid FROM pg_partition_tree(%s)) t",
        (name, name),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def source_ranges(pages: int, parts: int) -> list[tuple[int, int | None]]:
    """`pages` split into `parts` CTID ranges [first, end); the last is open-ended (the
    table may have grown since its size was read)."""
    size = max(1, math.ceil(pages / max(1, parts)))
    count = max(1, math.ceil(pages / size))
    firsts = [i * size for i in range(count)]
    return list(zip(firsts, [*firsts[1:], None], strict=True))


def _range_clause(first: int, end: int | None) -> sql.Composable:
    parts: list[sql.Composable] = []
    if first > 0:
        parts.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({first},0)")))
    if end is not None:
        parts.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def _slice_query(table: Table, first: int, end: int | None) -> sql.Composed:
    """The captured rows (row filter) of `table` in pages [first, end), as stored."""
    where = _range_clause(first, end)
    if table.row_filter:
        where = sql.SQL("{} AND ({})").format(where, sql.SQL(table.row_filter))
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(
        selected_columns(table), sql.Identifier(table.schema, table.name), where
    )


def _source_digests(
    shipped: Settings,
    ca_pem: str | None,
    snapshot: str,
    table: Table,
    forms: list[RowForm],
    every: list[tuple[int, int | None]],
    batches: Iterator[Any],
) -> Iterator[Any]:
    """On an executor: the CTID ranges of `every` numbered in `batches`, each one's rows
    at the exported `snapshot`: each row's key text and content hash in each store's form
    (column `s<i>` for `forms[i]`)."""
    import pyarrow as pa

    ranges = [every[n] for batch in batches for n in batch.column(0).to_pylist()]
    if not ranges:
        return
    names = ["key", *[f"s{i}" for i in range(len(forms))]]
    types = [pa.string(), *[pa.binary()] * len(forms)]
    with tempfile.TemporaryDirectory() as folder:
        postgres = shipped.postgres
        if ca_pem is not None:  # an executor on another machine: the CA as its text
            ca = Path(folder) / "ca.pem"
            ca.write_text(ca_pem)
            os.chmod(ca, 0o600)
            postgres = postgres.model_copy(update={"ca_file": ca})
        with psycopg.connect(postgres.dsn()) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            read_as_text(conn)
            for first, end in ranges:
                columns: list[list[Any]] = [[] for _ in names]
                for values in read_rows(conn, table, _slice_query(table, first, end)):
                    columns[0].append(key_text(table, values))
                    for i, form in enumerate(forms, 1):
                        columns[i].append(row_digest(form(table, values)))
                    if len(columns[0]) >= _BATCH:
                        yield _batch(columns, names, types)
                        columns = [[] for _ in names]
                yield _batch(columns, names, types)
            conn.rollback()


def _batch(columns: list[list[Any]], names: list[str], types: list[Any]) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(c, t) for c, t in zip(columns, types, strict=True)], names
    )


def _ca_text(settings: Settings) -> str | None:
    """PostgreSQL's CA as its text, for executors on other machines (spark.master not
    local), which do not have the file; None where the executors read the file."""
    ca = settings.postgres.ca_file
    if ca is None or settings.spark.master.startswith("local"):
        return None
    return Path(ca).read_text()


def compare_in_spark(
    settings: Settings,
    spark: Any,
    table: Table,
    readers: dict[str, DigestReader],
    parts: int,
    only: dict[str, list[str]] | None = None,
) -> dict[str, Compared]:
    """Each of `readers` compared with the source for `table` on Spark's executors, in
    about `parts` tasks per side; `only`: per store, the only keys to compare (a
    comparison again of what differed)."""
    from pyspark.sql import functions as F

    stores = list(readers)
    if only is not None:
        stores = [s for s in stores if s in only]
    if not stores:
        return {}
    forms = [readers[s].source_form() for s in stores]
    sides = [f"s{i}" for i in range(len(stores))]
    held = [f"t{i}" for i in range(len(stores))]
    nothing = F.lit(None).cast("binary")
    with psycopg.connect(settings.postgres.dsn()) as conn:
        _, pages = heap_pages(conn, table)
        conn.rollback()
        # the one snapshot every task of the source reads in, held until they are done
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        shipped = executor_settings(settings, None, keep=("postgres",))
        every = source_ranges(pages, parts)
        # a range a task: numbers in partitions of one each (a repartition of so few rows
        # puts several in one task, and one core reads them in turn)
        ranges = spark.range(0, len(every), 1, numPartitions=len(every))
        source = ranges.mapInArrow(
            functools.partial(
                _source_digests, shipped, _ca_text(settings), row[0], table, forms, every
            ),
            ", ".join(["key string", *[f"{s} binary" for s in sides]]),
        )
        frames = [source.select("key", *sides, *[nothing.alias(t) for t in held])]
        for i, name in enumerate(stores):
            store = readers[name].digest_frame(
                spark, table, parts, executor_settings(settings, name)
            )
            frames.append(
                store.select(
                    "key",
                    *[nothing.alias(s) for s in sides],
                    *[
                        (F.col("digest") if j == i else nothing).alias(t)
                        for j, t in enumerate(held)
                    ],
                )
            )
        rows = functools.reduce(lambda a, b: a.unionByName(b), frames)
        if only is not None:
            wanted = sorted({k for s in stores for k in only[s]})
            keys = spark.createDataFrame([(k,) for k in wanted], "key string")
            if len(wanted) <= _BROADCAST_KEYS:
                keys = F.broadcast(keys)
            rows = rows.join(keys, "key")
        keyed = rows.groupBy("key").agg(*[F.max(c).alias(c) for c in sides + held])
        counts = [F.count(sides[0]).alias("source_rows")]
        for s, t in zip(sides, held, strict=True):
            mine, theirs = F.col(s), F.col(t)
            counts += [
                F.count(t).alias(f"rows_{t}"),
                F.collect_list(F.when(mine.isNotNull() & theirs.isNull(), F.col("key"))).alias(
                    f"missing_{t}"
                ),
                F.collect_list(F.when(mine.isNull() & theirs.isNotNull(), F.col("key"))).alias(
                    f"extra_{t}"
                ),
                F.collect_list(F.when(mine != theirs, F.col("key"))).alias(f"different_{t}"),
            ]
        try:
            (result,) = keyed.agg(*counts).collect()
        except Exception as exc:  # a store that stopped answering, said by its task
            said = carried_message(exc, StoreUnavailableError)
            if said is not None:
                raise StoreUnavailableError(said) from None
            for reader in readers.values():  # or a store's copy of the table broken
                if (broken := reader.unreadable(table, exc)) is not None:
                    raise broken from None
            raise
        conn.rollback()
    compared = {}
    for name, t in zip(stores, held, strict=True):
        mine_only = None if only is None else set(only[name])

        def kept(keys: list[str], mine_only: set[str] | None = mine_only) -> list[str]:
            return sorted(keys if mine_only is None else (k for k in keys if k in mine_only))

        compared[name] = Compared(
            result["source_rows"],
            result[f"rows_{t}"],
            kept(result[f"missing_{t}"]),
            kept(result[f"extra_{t}"]),
            kept(result[f"different_{t}"]),
        )
    return compared
