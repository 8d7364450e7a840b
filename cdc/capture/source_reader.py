"""The source side as the apply job reads it, every micro-batch: the captured tables as
the catalog describes them now, and the WAL position (`read_source`, or `SourceReader`,
which keeps one connection and describes a table again only when its catalog rows
changed); the source's lineage (system identifier and timeline). The apply job reads it
through capture/source_view.py."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import psycopg

from cdc.core.catalog import Table, describe_table, published_tables
from cdc.core.errors import SourceUnavailableError
from cdc.core.identity import recorded, reused
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings

__all__ = ["SourceReader", "captured_tables", "read_source", "source_lineage"]


def captured_tables(settings: Settings) -> dict[str, Table]:
    """The pipeline's tables as the catalog describes them now."""
    return read_source(settings)[0]


# what a captured table's description depends on, per table: its pg_class row, its
# columns' pg_attribute rows, their types and defaults, its primary key's index, its
# publications' rows (their column lists). Every
# DDL that changes a description writes one of these rows (a new xmin); the statistics
# ANALYZE and VACUUM keep (pages, tuples) are updated in place and change none.
_FINGERPRINT = """
SELECT c.oid::bigint, n.nspname || '.' || c.relname,
  c.oid::text || '/' || c.xmin::text || '/' || n.nspname || '.' || c.relname || '/' ||
  coalesce((SELECT string_agg(a.attnum || ':' || a.xmin || ':' || t.xmin || ':' ||
                              coalesce(d.xmin::text, '') || ':' ||
                              coalesce((SELECT string_agg(e.xmin::text, '.' ORDER BY e.oid)
                                        FROM pg_enum e
                                        WHERE e.enumtypid IN (t.oid, t.typelem, t.typbasetype)),
                                       ''), ',' ORDER BY a.attnum)
            FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = c.oid AND a.attnum > 0), '') || '/' ||
  coalesce((SELECT string_agg(i.indexrelid || ':' || i.xmin, ',' ORDER BY i.indexrelid)
            FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), '') || '/' ||
  coalesce((SELECT string_agg(r.oid || ':' || r.xmin, ',' ORDER BY r.oid)
            FROM pg_publication_rel r WHERE r.prrelid = c.oid), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
ORDER BY 3
"""


class SourceReader:
    """read_source for a process that asks every micro-batch (the apply job): one
    connection kept (opened again after PostgreSQL went away), and each table described
    again only when its catalog rows changed (one query tells), so a batch costs the
    source a few cheap queries, not a login and a dozen catalog reads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._conn: psycopg.Connection[Any] | None = None
        self._seen: tuple[str, ...] | None = None
        self._tables: dict[str, Table] = {}
        # the source's system identifier and timeline, as the last read found them
        self.lineage: tuple[str, int | None] | None = None
        # captured names another captured relation has now (identity.reused), as the
        # last read found them: their changes are not to be applied until `cdc setup`
        self.reused: list[str] = []
        # the published tables' relations (OID -> name now), as the last read found them
        self.relations: dict[int, str] = {}
        # tables renamed since `cdc setup` (name now -> the name captured under)
        self.renamed: dict[str, str] = {}

    def read(self) -> tuple[dict[str, Table], int]:
        """The pipeline's tables and the source's WAL position, as read_source."""
        pipe = self.settings.pipeline
        try:
            if self._conn is None or self._conn.closed:
                self._conn = admin_connection(self.settings)
                self._conn.autocommit = True
                self.lineage = None
            conn = self._conn
            if self.lineage is None or self.lineage[1] is None:
                # a primary changes timeline only through a restart, which ends this
                # connection: read once per connection (a standby's, every batch)
                self.lineage = source_lineage(conn)
            names = published_tables(conn, pipe.publication)
            pairs = [n.split(".", 1) for n in names]
            rows = conn.execute(
                _FINGERPRINT, ([p[0] for p in pairs], [p[1] for p in pairs])
            ).fetchall()
            seen = tuple(r[2] for r in rows)
            self.relations = {int(r[0]): str(r[1]) for r in rows}
            before = recorded(conn, pipe.name) or {}
            self.reused = reused(before, self.relations)
            self.renamed = {
                name: before[oid]
                for oid, name in self.relations.items()
                if before.get(oid, name) != name and before[oid] not in self.relations.values()
            }
            if seen != self._seen or list(self._tables) != names:
                self._tables = {name: describe_table(conn, name, pipe) for name in names}
                self._seen = seen
            return self._as_captured(), _wal_position(conn)
        except psycopg.OperationalError as exc:  # the connection went (a restart)
            self.close()
            pg = self.settings.postgres
            raise SourceUnavailableError(
                f"PostgreSQL at {pg.host}:{pg.port} does not answer ({str(exc).strip()[:120]})"
            ) from None

    def _as_captured(self) -> dict[str, Table]:
        """The tables under the names they are captured under: one renamed since `cdc
        setup` keeps its old name, so the changes made under it that the store had not
        applied yet are (its old topic's tail), and its new name's topic waits for `cdc
        setup`, which captures and backfills it there."""
        tables = dict(self._tables)
        for now, captured in self.renamed.items():
            table = tables.pop(now, None)
            if table is not None:
                schema, name = captured.split(".", 1)
                tables[captured] = replace(table, schema=schema, name=name)
        return tables

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def source_lineage(conn: psycopg.Connection[Any]) -> tuple[str, int | None]:
    """The database cluster's system identifier and the timeline it writes on (None on a
    standby): a restore to a point in time, or a promoted standby, writes on a new
    timeline, which forked from its parent at a position its history file records."""
    row = conn.execute(
        "SELECT (SELECT system_identifier FROM pg_control_system())::text, "
        "CASE WHEN pg_is_in_recovery() THEN NULL "
        "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END"
    ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1], 16) if row[1] else None


def _wal_position(conn: psycopg.Connection[Any]) -> int:
    """Where the source's next change will be written, or a standby has replayed to."""
    row = conn.execute(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
        "ELSE pg_current_wal_lsn() END) - '0/0'::pg_lsn"
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def read_source(settings: Settings) -> tuple[dict[str, Table], int]:
    """The pipeline's tables as the catalog describes them now (read every batch, so a
    schema change reaches the stores without a restart), and the source's WAL position
    (where its next change will be written, or a standby has replayed to)."""
    pipe = settings.pipeline
    try:
        with admin_connection(settings) as conn:
            names = published_tables(conn, pipe.publication)
            tables = {name: describe_table(conn, name, pipe) for name in names}
            return tables, _wal_position(conn)
    except psycopg.OperationalError as exc:  # the connection went (a restart)
        pg = settings.postgres
        raise SourceUnavailableError(
            f"PostgreSQL at {pg.host}:{pg.port} does not answer ({str(exc).strip()[:120]})"
        ) from None
