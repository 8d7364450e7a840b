"""A captured table is a relation, not a name.

PostgreSQL's publication holds a table by its OID: after `ALTER TABLE … RENAME`, `SET
SCHEMA` or `ALTER SCHEMA … RENAME` it still publishes the table's changes, under the new
name (the connector follows the publication, so they reach the new name's topic); a
table dropped and created again under the same name is a new relation that the
publication no longer holds. `cdc.captured` records, per pipeline, each relation it
captures with the name it is captured under; comparing it with the catalog tells what
happened to each (`cdc status`), and what `cdc setup` must do about it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from cdc.core.catalog import DEBEZIUM_PLACEHOLDER, Table

__all__ = [
    "CAPTURED_TABLE",
    "TableChanges",
    "acknowledge_all",
    "acknowledged",
    "current_relations",
    "partitions_gone",
    "placeholder_statement",
    "record_captured",
    "recorded",
    "recorded_since",
    "reused",
    "table_changes",
]

CAPTURED_TABLE = "cdc.captured"


@dataclass(frozen=True)
class TableChanges:
    """What happened to the pipeline's tables since it last recorded them."""

    renamed: list[tuple[str, str]] = field(default_factory=list)  # (captured as, now)
    dropped: list[str] = field(default_factory=list)  # the relation is gone
    uncaptured: list[str] = field(default_factory=list)  # selected, not in the publication
    # captured names another captured relation has now (two tables swapped, one renamed
    # onto a dropped one's name): the stores hold the old relation's rows under them
    reused: list[str] = field(default_factory=list)
    # partitioned tables with partitions detached or dropped since `cdc setup`: how many
    shrunk: dict[str, int] = field(default_factory=dict)
    # change topics of no captured table written since the record: (topic, its table)
    strays: list[tuple[str, str]] = field(default_factory=list)

    def problems(self, topic: Any) -> list[str]:
        """One line per table: what happened and what to run (`topic(name)`: its topic)."""
        lines = [
            f"table {old} was renamed to {new}: its changes since go to topic {topic(new)}, "
            f"which no store applies under the old name; name {new} in pipeline.tables "
            "(if a pattern does not) and run `cdc setup` (it backfills it under its new name)"
            for old, new in self.renamed
            if new not in self.reused
        ]
        lines += [
            f"table {old} was renamed to {new}, a name the pipeline captured another table "
            f"under (tables swapped?): the stores hold their batches, so as not to apply its "
            f"changes to the other table's rows; run `cdc setup` (it cuts {new} in every "
            "store and backfills it)"
            for old, new in self.renamed
            if new in self.reused
        ]
        lines += [
            f"table {name} was dropped: nothing of it is captured any more; "
            "remove it from pipeline.tables and run `cdc setup`"
            for name in self.dropped
            if name not in self.uncaptured
        ]
        lines += [
            f"table {name} is selected by pipeline.tables but not captured (created again, "
            "or new): its changes are not read; run `cdc setup` (it captures and backfills it)"
            for name in self.uncaptured
        ]
        lines += [
            f"table {name}: {count} partition(s) detached or dropped since `cdc setup`, "
            "which PostgreSQL publishes no delete for: their rows stay in every store; run "
            f"`cdc setup` (it cuts {name} in every store and backfills it)"
            for name, count in sorted(self.shrunk.items())
        ]
        targets = {new for _, new in self.renamed}
        lines += [
            f"topic {topic} holds changes made under the name {name}, which no captured "
            "table has now (a captured table renamed to it, and back?): no store applied "
            "them; backfill the table they belong to (`cdc backfill schema.table`), then "
            "run `cdc setup` (this line then goes)"
            for topic, name in self.strays
            if name not in targets
        ]
        return lines


def _has_records(conn: psycopg.Connection[Any]) -> bool:
    """Whether the source has cdc.captured (a setup of this version made it)."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (CAPTURED_TABLE,)).fetchone()
    return bool(exists and exists[0])


def recorded(conn: psycopg.Connection[Any], pipeline: str) -> dict[int, str] | None:
    """The relations `pipeline` captures (OID -> the name captured under), or None for a
    pipeline set up before they were recorded."""
    if not _has_records(conn):
        return None
    rows = conn.execute(
        "SELECT relid::bigint, table_name FROM cdc.captured WHERE pipeline = %s", (pipeline,)
    ).fetchall()
    return {int(oid): name for oid, name in rows} or None


def recorded_since(conn: psycopg.Connection[Any], pipeline: str) -> int | None:
    """When `pipeline`'s relations were recorded (ms since the epoch), or None."""
    if not _has_records(conn):
        return None
    try:
        with conn.transaction():  # a savepoint: the caller's transaction goes on
            row = conn.execute(
                "SELECT (extract(epoch FROM min(recorded_at)) * 1000)::bigint FROM cdc.captured "
                "WHERE pipeline = %s",
                (pipeline,),
            ).fetchone()
    except psycopg.errors.UndefinedColumn:  # recorded before the time was (`cdc setup` adds it)
        return None
    return int(row[0]) if row and row[0] is not None else None


def current_relations(conn: psycopg.Connection[Any], qualified: Sequence[str]) -> dict[int, str]:
    """The OID of each existing table among `qualified` ("schema.table")."""
    pairs = [name.split(".", 1) for name in qualified]
    rows = conn.execute(
        "SELECT c.oid::bigint, n.nspname || '.' || c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([p[0] for p in pairs], [p[1] for p in pairs]),
    ).fetchall()
    return {int(oid): name for oid, name in rows}


def record_captured(conn: psycopg.Connection[Any], pipeline: str, tables: Sequence[Table]) -> None:
    """Record the relations `pipeline` captures now, with a partitioned table's partitions
    (in the caller's transaction). A relation captured under the same name keeps the time
    it was first recorded (the changes of no captured name written since are reported
    until a backfill: another setup does not hide them); a name no longer captured is
    acknowledged through now (its changes until now were its table's)."""
    now = current_relations(conn, [t.qualified for t in tables])
    conn.execute(
        "INSERT INTO cdc.acknowledged (pipeline, table_name) SELECT pipeline, table_name "
        "FROM cdc.captured WHERE pipeline = %s AND NOT (table_name = ANY(%s)) "
        "ON CONFLICT (pipeline, table_name) DO UPDATE SET through = now()",
        (pipeline, list(now.values())),
    )
    conn.execute(
        "DELETE FROM cdc.captured WHERE pipeline = %s AND NOT (relid = ANY(%s::oid[]))",
        (pipeline, list(now)),
    )
    for oid, name in now.items():
        conn.execute(
            "INSERT INTO cdc.captured (pipeline, relid, table_name, partitions) "
            f"VALUES (%s, %s, %s, ({_PARTITIONS})) "
            "ON CONFLICT (pipeline, relid) DO UPDATE SET table_name = EXCLUDED.table_name, "
            "partitions = EXCLUDED.partitions, recorded_at = CASE WHEN "
            "cdc.captured.table_name = EXCLUDED.table_name THEN cdc.captured.recorded_at "
            "ELSE now() END",
            (pipeline, oid, name, oid, oid),
        )


def acknowledged(conn: psycopg.Connection[Any], pipeline: str) -> dict[str, int]:
    """Per name ('*': every name), the time (ms since the epoch) through which changes of
    no captured table written under it are accounted for."""
    if conn.execute("SELECT to_regclass('cdc.acknowledged') IS NULL").fetchone()[0]:  # type: ignore[index]
        return {}
    rows = conn.execute(
        "SELECT table_name, (extract(epoch FROM through) * 1000)::bigint "
        "FROM cdc.acknowledged WHERE pipeline = %s",
        (pipeline,),
    ).fetchall()
    return {str(name): int(ms) for name, ms in rows}


def acknowledge_all(conn: psycopg.Connection[Any], pipeline: str) -> None:
    """Every change written under a name no captured table has is accounted for, through
    now (a backfill was asked for: what it reads supersedes them)."""
    if conn.execute("SELECT to_regclass('cdc.acknowledged') IS NULL").fetchone()[0]:  # type: ignore[index]
        return
    conn.execute(
        "INSERT INTO cdc.acknowledged (pipeline, table_name) VALUES (%s, '*') "
        "ON CONFLICT (pipeline, table_name) DO UPDATE SET through = now()",
        (pipeline,),
    )


# a relation's partitions at every level (none for a table that is not partitioned)
_PARTITIONS = (
    "SELECT array_agg(t.relid ORDER BY t.relid) FROM pg_partition_tree(%s::oid::regclass) t "
    "WHERE t.relid <> %s::oid::regclass"
)


def partitions_gone(conn: psycopg.Connection[Any], pipeline: str) -> dict[str, int]:
    """Per captured partitioned table (the name it is captured under), how many of the
    partitions recorded with it are no longer among its partitions (detached, dropped)."""
    try:
        with conn.transaction():  # a savepoint: the caller's transaction goes on
            rows = conn.execute(
                "SELECT c.table_name, (SELECT count(*) FROM unnest(c.partitions) p "
                "  WHERE p NOT IN (SELECT t.relid FROM pg_partition_tree(c.relid) t)) "
                "FROM cdc.captured c JOIN pg_class r ON r.oid = c.relid "
                "WHERE c.pipeline = %s AND c.partitions IS NOT NULL",
                (pipeline,),
            ).fetchall()
    except psycopg.errors.UndefinedColumn:  # recorded before partitions were
        return {}
    return {str(name): int(n) for name, n in rows if n}


def table_changes(
    conn: psycopg.Connection[Any], pipeline: str, published: Sequence[str], selected: Sequence[str]
) -> TableChanges:
    """Compare what `pipeline` recorded with the catalog: `published` are the names its
    publication holds now, `selected` the existing tables its settings select."""
    before = recorded(conn, pipeline) or {}
    now: dict[int, str] = {}
    if before:
        rows = conn.execute(
            "SELECT c.oid::bigint, n.nspname || '.' || c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])",
            (list(before),),
        ).fetchall()
        now = {int(oid): name for oid, name in rows}
    renamed = [(name, now[oid]) for oid, name in before.items() if oid in now and now[oid] != name]
    dropped = [name for oid, name in before.items() if oid not in now]
    uncaptured = [name for name in selected if name not in published]
    return TableChanges(
        sorted(renamed),
        sorted(dropped),
        sorted(uncaptured),
        reused(before, now),
        partitions_gone(conn, pipeline) if before else {},
    )


def reused(before: dict[int, str], now: dict[int, str]) -> list[str]:
    """The names of `now` (OID -> name) that `before` (the relations captured, OID -> the
    name captured under) holds for another relation: two captured tables swapped, or one
    renamed onto a captured name whose table was dropped. Under such a name the stores
    hold the other relation's rows, which its changes must not be applied to."""
    taken = set(before.values())
    return sorted(name for oid, name in now.items() if name in taken and before.get(oid) != name)


def placeholder_statement(pipeline: str) -> sql.Composed:
    """The statement that gives `pipeline` its placeholder for an unchanged TOASTed value
    (cdc.placeholders), once: a random one, or Debezium's default for a pipeline set up
    before (its relations are recorded already: its topics hold that one). Run it before
    record_captured, in the setup's transaction."""
    name = sql.Literal(pipeline)
    return sql.SQL(
        "INSERT INTO cdc.placeholders (pipeline, placeholder) SELECT {}, CASE WHEN EXISTS "
        "(SELECT 1 FROM cdc.captured WHERE pipeline = {}) THEN {} ELSE {} END "
        "ON CONFLICT (pipeline) DO NOTHING"
    ).format(
        name,
        name,
        sql.Literal(DEBEZIUM_PLACEHOLDER),
        sql.Literal("__cdc_unchanged_" + secrets.token_hex(16)),
    )
