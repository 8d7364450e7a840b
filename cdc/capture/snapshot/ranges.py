"""The CTID ranges of the snapshot's read: the pages each reader reads, and what a
resumed run must still write of a table (the rows outside the ranges recorded, those
written since) and whether the relation it wrote is still the one captured
(initial.py, module doc)."""

from __future__ import annotations

import math
from typing import Any

from cdc.capture.snapshot.record import ReadRange
from cdc.core.catalog import Table
from cdc.core.errors import SnapshotError


def page_ranges(pages: int, pages_per_reader: int) -> list[tuple[int, int | None]]:
    """A table's pages split into ranges [first, end) of `pages_per_reader` pages.

    The last range is open-ended (end None): relpages is an estimate and the table may
    have grown."""
    count = max(1, math.ceil(pages / pages_per_reader))
    firsts = [i * pages_per_reader for i in range(count)]
    return list(zip(firsts, [*firsts[1:], None], strict=True))


def ctid_clause(first: int, end: int | None) -> str:
    """The WHERE clause of the rows in pages [first, end)."""
    parts = [f"ctid >= '({first},0)'::tid"] if first > 0 else []
    parts += [f"ctid < '({end},0)'::tid"] if end is not None else []
    return " AND ".join(parts) or "true"


def unread_rows(read: list[tuple[int, int | None]], xmin: int) -> str | None:
    """The filter of the rows an interrupted snapshot did not write: those outside the
    page ranges `read`, and every row version a transaction at or after `xmin` (the
    snapshot's oldest in progress, an xid8) wrote, as an UPDATE may have moved a row
    into a range read. None: nothing to read (every page was); "true": everything.

    A row version's xmin is a 32-bit xid: it counts as newer when it is less than 2^31
    ahead of the snapshot's, modulo 2^32, which holds for every xid written since (a
    version frozen over 2^31 xids ago may count too, and is only read again)."""
    done = _written(read)
    if done is None:
        return "true"
    if done == "true":
        return None
    return f"(NOT ({done}) OR {newer_rows(xmin)})"


def unchanged_unread_rows(read: list[tuple[int, int | None]], xmin: int) -> str | None:
    """The rows of unread_rows that no transaction wrote since the snapshot: outside the
    page ranges `read`, and not newer_rows. Each is as the snapshot saw it (it was
    there, committed, and nothing changed it since), so it is read now as the snapshot's
    row. None: there are none."""
    done = _written(read)
    if done == "true":
        return None
    return f"NOT {newer_rows(xmin)}" + (f" AND NOT ({done})" if done else "")


def newer_rows(xmin: int) -> str:
    """The filter of the row versions a transaction at or after `xmin` (an xid8) wrote."""
    return f"(((xmin::text::bigint - {xmin % 2**32} + 4294967296) % 4294967296) < 2147483648)"


def _written(read: list[tuple[int, int | None]]) -> str | None:
    """The filter of the rows in the page ranges `read`: None when there are none,
    "true" when they cover every page."""
    merged: list[list[Any]] = []
    for first, end in sorted(read, key=lambda r: r[0]):
        if merged:
            last = merged[-1]
            if last[1] is None:  # read to the end already
                continue
            if first <= last[1]:
                last[1] = None if end is None else max(last[1], end)
                continue
        merged.append([first, end])
    if not merged:
        return None
    if merged == [[0, None]]:
        return "true"
    return " OR ".join(f"({ctid_clause(first, end)})" for first, end in merged)


def _partitions(files: str) -> set[int] | None:
    """The relations a table's files (relation_identity) name, or None for files recorded before
    they named them (one number per relation: which ones is unknown)."""
    if ":" not in files:
        return None
    return {int(part.split(":", 1)[0]) for part in files.split(",")}


def relation_kept(recorded: list[ReadRange], files: str, truncate_logged: bool) -> bool:
    """Whether every row an interrupted snapshot wrote of a table is still one of its rows
    or left it through the log, so that its backfill needs no cut first. `recorded` are
    its ranges under the relation the table is now, `files` its files now (relation_identity),
    `truncate_logged` whether a TRUNCATE of it since the snapshot is in the log.

    Not kept: no range names its relation (created again: the rows written were another
    relation's; or none recorded, yet a group may be in Kafka unrecorded); a partition
    recorded with its ranges is no longer one of its partitions (PostgreSQL publishes no
    delete for a detached or dropped partition's rows); its files changed, which a
    TRUNCATE also does, and a TRUNCATE would not be in the log."""
    if not recorded:
        return False
    now = _partitions(files)
    for read in recorded:
        then = _partitions(read.files)
        if now is None or then is None or not then <= now:
            return False
    return truncate_logged or all(r.files == files for r in recorded)


def relation_identity(conn: Any, table: Table) -> tuple[int, str]:
    """The table's relation and its files: `relid:filenode` of each relation in its
    partition tree (the table alone when it has no partitions), by relid. A rewrite
    (VACUUM FULL, CLUSTER, pg_repack, ALTER TABLE … TYPE, TRUNCATE) gives a relation new
    files; a partition attached, detached or dropped changes the list."""
    # (pg_partition_tree has no row for a table that is not partitioned)
    row = conn.execute(
        "SELECT c.oid, (SELECT string_agg(t.relid::oid::text || ':' || "
        "coalesce(pg_relation_filenode(t.relid), 0)::text, ',' ORDER BY t.relid) "
        "FROM (SELECT c.oid::regclass AS relid "
        "UNION SELECT relid FROM pg_partition_tree(c.oid)) t) "
        "FROM pg_class c WHERE c.oid = to_regclass(%s)",
        (table.regclass,),
    ).fetchone()
    if row is None:
        raise SnapshotError(
            f"table {table.qualified} was dropped while the snapshot read it: run `cdc "
            "snapshot` again (it resumes; take the table out of pipeline.tables if it names it)"
        )
    return int(row[0]), str(row[1])
