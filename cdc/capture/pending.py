"""What `cdc setup` owes a streaming pipeline once it has recorded what it captures.

A setup compares the relations the pipeline captured (`cdc.captured`) with those it
captures now: a table new to it (added, renamed) is backfilled. It is cut first (every
store drops the rows it held under its name, as a TRUNCATE would) when the stores may
hold rows under its name that are not its own as captured: a table dropped and created
again under a captured name; two captured tables swapped, or one renamed onto a captured
name (the stores hold the other relation's rows); a partitioned table a partition was
detached or dropped from (PostgreSQL publishes no delete for its rows); a table whose
change topic was written before (removed from the pipeline and added back, renamed away
and back: the deletes made meanwhile were not captured); a captured table taken out of
the publication by someone else (likewise). The work is recorded in `cdc.pending` in the
transaction that records the new capture set, and each row is removed once its work is
done, so a setup that stops halfway is finished by the next one (`cdc setup` reruns what
is pending). A snapshot reads every table: it owes nothing, and clears what was pending.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from cdc.core.catalog import TRUNCATIONS_TABLE
from cdc.core.identity import reused

__all__ = ["BACKFILL", "CUT", "Owed", "clear", "cut", "done", "owed", "pending", "record"]

CUT, BACKFILL = "cut", "backfill"


@dataclass(frozen=True)
class Owed:
    """A setup's comparison of what was captured with what is captured now."""

    renamed: list[tuple[str, str]] = field(default_factory=list)  # (captured as, now)
    recreated: list[str] = field(default_factory=list)  # dropped and created again: cut
    added: list[str] = field(default_factory=list)  # new to the pipeline: backfilled
    unpublished: list[str] = field(default_factory=list)  # put back in the publication: cut
    # another relation's name (swapped), or a name whose topic was written before: cut
    reused: list[str] = field(default_factory=list)

    @property
    def cuts(self) -> list[str]:
        return sorted({*self.recreated, *self.unpublished, *self.reused})


def owed(
    before: dict[int, str],
    now: dict[int, str],
    names: Sequence[str],
    unpublished: Collection[str] = (),
    logged: Collection[str] = (),
    shrunk: Collection[str] = (),
) -> Owed:
    """What a setup owes (`before`: the relations captured, OID -> name; `now`: those of
    `names` that exist; `unpublished`: captured tables the publication no longer held
    when the setup began, whose changes since were not captured; `logged`: the names
    whose change topic was ever written to; `shrunk`: the partitioned tables a partition
    left, detached or dropped, without a delete event for its rows). A pipeline that
    captured nothing before owes nothing: its snapshot reads every table."""
    if not before:
        return Owed()
    renamed = sorted(
        (before[oid], name) for oid, name in now.items() if before.get(oid, name) != name
    )
    recreated = sorted(
        name for oid, name in now.items() if oid not in before and name in before.values()
    )
    oids = {name: oid for oid, name in now.items()}
    back = [t for t in names if before.get(oids.get(t, -1)) == t and t in unpublished]
    left = [t for t in names if t in shrunk]
    added = [t for t in names if before.get(oids.get(t, -1)) != t or t in back or t in left]
    swapped = [t for t in reused(before, now) if t not in recreated]
    again = [t for t in added if t in logged and t not in {*recreated, *back, *swapped}]
    return Owed(renamed, recreated, added, back, sorted({*swapped, *again, *left}))


def record(conn: psycopg.Connection[Any], pipeline: str, work: Owed) -> None:
    """Record `work` as pending (in the caller's transaction, with the capture set)."""
    rows = [(t, CUT) for t in work.cuts] + [(t, BACKFILL) for t in work.added]
    for table, kind in rows:
        conn.execute(
            "INSERT INTO cdc.pending (pipeline, table_name, work) VALUES (%s, %s, %s) "
            "ON CONFLICT DO NOTHING",
            (pipeline, table, kind),
        )


def pending(conn: psycopg.Connection[Any], pipeline: str) -> list[tuple[str, str]]:
    """The pipeline's pending work, (table, CUT | BACKFILL), oldest first, each table's
    cut before its backfill."""
    rows = conn.execute(
        "SELECT table_name, work FROM cdc.pending WHERE pipeline = %s "
        "ORDER BY since, table_name, work = 'backfill'",
        (pipeline,),
    ).fetchall()
    return [(str(table), str(work)) for table, work in rows]


def done(conn: psycopg.Connection[Any], pipeline: str, table: str, work: str) -> None:
    """One piece of work done (in the caller's transaction)."""
    conn.execute(
        "DELETE FROM cdc.pending WHERE pipeline = %s AND table_name = %s AND work = %s",
        (pipeline, table, work),
    )


def cut(conn: psycopg.Connection[Any], table: str) -> int:
    """A cut of `table` in the log, read by every store as a TRUNCATE of it: a row of
    cdc.truncations, in the caller's transaction (uncommitted); returns its id. Once
    committed it sits in the log after every change committed before it: every store
    drops the rows it held of `table` until then."""
    row = conn.execute(
        sql.SQL("INSERT INTO {} (table_name) VALUES (%s) RETURNING id").format(
            sql.Identifier(*TRUNCATIONS_TABLE.split("."))
        ),
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def clear(conn: psycopg.Connection[Any], pipeline: str) -> None:
    """Nothing is owed any more (a snapshot reads every table; the pipeline is dropped)."""
    conn.execute("DELETE FROM cdc.pending WHERE pipeline = %s", (pipeline,))
