"""The configured replica identities, on a partitioned table's partitions too, now and later.

PostgreSQL does not pass `REPLICA IDENTITY` down to partitions, and it checks a
partition's UPDATE and DELETE against the partition's own identity, even under
`publish_via_partition_root`. `cdc setup` sets the configured identity on the root and on
every partition that exists; a partition created or attached afterwards would keep
DEFAULT, and then its UPDATEs fail in the application (a row filter on a non-key column,
`key_columns` without a primary key) or its unchanged TOASTed arrays reach the stores as
NULL. So the setup also installs an event trigger (`cdc_follow_root_identity`, see
sql/pipeline_schema.sql) that gives a new partition of a captured root with REPLICA
IDENTITY FULL that identity, in the transaction that makes it. Creating an event trigger
takes a superuser; without one, `cdc setup` says so, and `cdc status` names every
partition whose identity differs from the configured one (`cdc setup` sets it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors, sql

from cdc.core.catalog import Table, publishing_relations

__all__ = [
    "IDENTITY_TRIGGER",
    "apply_replica_identity",
    "identity_problems",
    "identity_trigger_statement",
    "install_identity_trigger",
]

log = logging.getLogger(__name__)
IDENTITY_TRIGGER = "cdc_follow_root_identity"
_NAMES = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


def identity_trigger_statement() -> sql.Composed:
    """The event trigger that gives new partitions of a captured FULL root its identity."""
    return sql.SQL(
        "CREATE EVENT TRIGGER {} ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE') "
        "EXECUTE FUNCTION cdc.follow_root_identity()"
    ).format(sql.Identifier(IDENTITY_TRIGGER))


def _identities(conn: psycopg.Connection[Any], table: Table) -> dict[str, str]:
    """The replica identity of the table and of each of its partitions, by name."""
    found = {}
    for qualified in [table.qualified, *publishing_relations(conn, table)]:
        schema, name = qualified.split(".", 1)
        row = conn.execute(
            "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
        if row:
            found[qualified] = _NAMES.get(row[0], row[0])
    return found


def apply_replica_identity(
    conn: psycopg.Connection[Any], tables: list[Table], wanted: Mapping[str, str]
) -> None:
    """The configured replica identities, on a partitioned table's partitions too (it
    does not pass down, and a partition's own is the one its changes are published with)."""
    for table in tables:
        identity = wanted.get(table.qualified)
        if not identity:
            continue
        for qualified, now in _identities(conn, table).items():
            if now != identity:
                conn.execute(
                    sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
                        sql.Identifier(*qualified.split(".", 1)), sql.SQL(identity.upper())
                    )
                )
                log.info("replica identity of %s set to %s", qualified, identity)


def install_identity_trigger(
    conn: psycopg.Connection[Any], tables: list[Table], wanted: Mapping[str, str]
) -> bool:
    """Install the event trigger once (in a savepoint of the caller's transaction).

    Returns whether it is installed. Without the privilege (only a superuser creates an
    event trigger) it says, for each partitioned table with a configured FULL identity,
    that partitions made later need the identity set by hand."""
    present = conn.execute(
        "SELECT evtenabled <> 'D' FROM pg_event_trigger WHERE evtname = %s", (IDENTITY_TRIGGER,)
    ).fetchone()
    if present is not None:
        if not present[0]:
            log.warning(
                "event trigger %s is disabled: partitions created later keep REPLICA "
                "IDENTITY DEFAULT (ALTER EVENT TRIGGER %s ENABLE)",
                IDENTITY_TRIGGER,
                IDENTITY_TRIGGER,
            )
        return bool(present[0])
    try:
        with conn.transaction():
            conn.execute(identity_trigger_statement())
        return True
    except errors.InsufficientPrivilege:
        pass
    for table in tables:
        if table.partitioned and wanted.get(table.qualified) == "full":
            log.warning(
                "table %s is partitioned and its replica identity is FULL, but only a superuser "
                "can install the event trigger that gives a new partition that identity: "
                "create partitions with ALTER TABLE … REPLICA IDENTITY FULL (or run `cdc setup` "
                "after adding one); `cdc status` names those that differ",
                table.qualified,
            )
    return False


def identity_problems(
    conn: psycopg.Connection[Any], tables: list[Table], wanted: Mapping[str, str]
) -> list[str]:
    """One line per captured table whose root or partitions lack the configured
    identity (`cdc status`; `cdc setup` sets it)."""
    lines = []
    for table in tables:
        identity = wanted.get(table.qualified)
        if not identity:
            continue
        differ = {name: now for name, now in _identities(conn, table).items() if now != identity}
        if differ:
            which = ", ".join(f"{name} ({now.upper()})" for name, now in sorted(differ.items()))
            lines.append(
                f"table {table.qualified}: pipeline.replica_identity asks for "
                f"{identity.upper()}, but {which} differ (a partition made after the setup?): "
                "its UPDATEs and DELETEs may fail in the application or lose values; run "
                "`cdc setup` (it sets the identity)"
            )
    return lines
