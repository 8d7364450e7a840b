"""The replication role: its password, its grants, and its removal.

The role Debezium and the snapshot readers use logs in, replicates logically, reads
exactly the tables some pipeline captures, and writes only the pipeline's own tables.
It is a member of REPLICATION_GROUP, which the local stack's pg_hba.conf admits to the
pipeline's database only (no physical replication). Its password is the configured one,
else a random one kept in `<data_dir>/secrets/<role>.password` (0600); PostgreSQL only
ever receives its SCRAM verifier, computed by libpq on this side.

Generated columns' expressions (written by whoever owns a captured table) are evaluated
by the apply job through EXPRESSIONS_FUNCTION, a SECURITY DEFINER function owned by
EXPRESSIONS_ROLE: a role that cannot log in and holds nothing but USAGE on the schemas
those expressions name. Inside it no code can take another role (PostgreSQL refuses SET
ROLE in a security-definer function), so an expression runs with no privilege at all.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import SecretStr

from cdc.core.catalog import OWN_SCHEMA, TRUNCATIONS_TABLE, WATERMARK_SCHEMA
from cdc.core.files import private_folder, write_file
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir

__all__ = [
    "EXPRESSIONS_FUNCTION",
    "EXPRESSIONS_ROLE",
    "REPLICATION_GROUP",
    "drop_role",
    "expression_grants",
    "generated_secret",
    "other_pipelines",
    "password_file",
    "publication_comment",
    "replication_password",
    "role_statements",
    "sync_grants",
    "write_secret",
]

REPLICATION_GROUP = "cdc_replicators"
EXPRESSIONS_ROLE = "cdc_expressions"
EXPRESSIONS_FUNCTION = (OWN_SCHEMA, "generated_values")
_OWN_TABLES_WRITTEN = ("debezium_signal", "heartbeat", "snapshots")


def password_file(settings: Settings) -> Path:
    return settings.data_dir / "secrets" / f"{settings.pipeline.replication_user}.password"


def write_secret(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only (its folder 0700), never through a
    link another user left there (cdc.core.files)."""
    folder = private_folder(path.parent)
    owner = None
    if os.geteuid() == 0 and (folder.st_uid, folder.st_gid) != (0, 0):
        # the folder of a component that runs as the service user: it reads the file
        owner = (folder.st_uid, folder.st_gid)
    write_file(path, text, 0o600, owner)


def replication_password(settings: Settings) -> SecretStr:
    """The configured password, else the generated one (made on first use)."""
    configured = settings.pipeline.replication_password
    if configured is not None:
        return configured
    return SecretStr(generated_secret(settings, password_file(settings)))


def generated_secret(settings: Settings, path: Path) -> str:
    """The secret kept at `path` under data_dir, made (random, 0600) on first use."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if not text:
        text = secrets.token_urlsafe(24)
        make_state_dir(settings, path.parent, 0o700)  # marked: `cdc down --purge` removes it
        write_secret(path, text + "\n")
    return text


def _scram_verifier(conn: psycopg.Connection[Any], role: str, password: SecretStr) -> str:
    """The password as PostgreSQL stores it (SCRAM-SHA-256), computed by libpq here: the
    statement that sets it never carries the password, so no log can show it."""
    verifier = conn.pgconn.encrypt_password(
        password.get_secret_value().encode(), role.encode(), b"scram-sha-256"
    )
    return verifier.decode()


def role_statements(conn: psycopg.Connection[Any], settings: Settings) -> list[sql.Composed]:
    """The statements that create or update the role (idempotent), in order."""
    role_name = settings.pipeline.replication_user
    role, group = sql.Identifier(role_name), sql.Identifier(REPLICATION_GROUP)
    verifier = _scram_verifier(conn, role_name, replication_password(settings))
    own = [sql.Identifier(OWN_SCHEMA, name) for name in _OWN_TABLES_WRITTEN]
    return [
        _create_if_missing(REPLICATION_GROUP, "NOLOGIN"),
        _create_if_missing(role_name, "LOGIN REPLICATION"),
        sql.SQL("ALTER ROLE {} WITH LOGIN REPLICATION NOSUPERUSER PASSWORD {}").format(
            role, sql.Literal(verifier)
        ),
        sql.SQL("GRANT {} TO {}").format(group, role),
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(settings.postgres.database), role
        ),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(OWN_SCHEMA), role),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
            sql.SQL(", ").join(own), role
        ),
        sql.SQL("GRANT SELECT ON {} TO {}").format(
            sql.Identifier(*TRUNCATIONS_TABLE.split(".", 1)), role
        ),
        # the snapshot hashes masked columns with the pipeline's salt, which it never reads
        sql.SQL("GRANT EXECUTE ON FUNCTION cdc.mask_hash(text, text) TO {}").format(role),
        # a read-only backfill's watermark (sql/pipeline_schema.sql)
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(WATERMARK_SCHEMA), role),
        sql.SQL("GRANT EXECUTE ON FUNCTION {}.pg_current_snapshot() TO {}").format(
            sql.Identifier(WATERMARK_SCHEMA), role
        ),
        *_expression_statements(role),
    ]


def _expression_statements(role: sql.Identifier) -> list[sql.Composed]:
    """EXPRESSIONS_ROLE and EXPRESSIONS_FUNCTION, which only `role` may call."""
    function = sql.Identifier(*EXPRESSIONS_FUNCTION)
    owner = sql.Identifier(EXPRESSIONS_ROLE)
    return [
        _create_if_missing(EXPRESSIONS_ROLE, "NOLOGIN"),
        sql.SQL(
            "ALTER ROLE {} WITH NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
        ).format(owner),
        # the query is the apply job's own (generated.compute): the expressions of a
        # table's generated columns over VALUES, each row's number and its results
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(query text) RETURNS TABLE (n int, v text) "
            "LANGUAGE plpgsql SECURITY DEFINER AS $f$ BEGIN RETURN QUERY EXECUTE query; END $f$"
        ).format(function),
        # a setup user that is no superuser (a managed service's admin) may give the
        # function to a role it is a member of only
        sql.SQL("GRANT {} TO CURRENT_USER").format(owner),
        sql.SQL("ALTER FUNCTION {}(text) OWNER TO {}").format(function, owner),
        sql.SQL("REVOKE ALL ON FUNCTION {}(text) FROM PUBLIC").format(function),
        sql.SQL("GRANT EXECUTE ON FUNCTION {}(text) TO {}").format(function, role),
    ]


_EXPRESSION_SCHEMAS = """
SELECT DISTINCT n.nspname FROM (
  SELECT p.pronamespace AS ns FROM pg_attrdef d
  JOIN pg_depend x ON x.classid = 'pg_attrdef'::regclass AND x.objid = d.oid
  JOIN pg_proc p ON x.refclassid = 'pg_proc'::regclass AND p.oid = x.refobjid
  WHERE d.adrelid = ANY(%(tables)s::regclass[])
  UNION
  SELECT t.typnamespace FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
  WHERE a.attrelid = ANY(%(tables)s::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped
  UNION
  SELECT c.relnamespace FROM pg_class c WHERE c.oid = ANY(%(tables)s::regclass[])
) s JOIN pg_namespace n ON n.oid = s.ns
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
ORDER BY 1
"""


def expression_grants(conn: psycopg.Connection[Any], tables: Iterable[str]) -> list[sql.Composed]:
    """USAGE for EXPRESSIONS_ROLE on the schemas the generated columns of `tables`
    (regclass texts) need: of the functions their expressions call, of their columns'
    types, and their own. Nothing else: an expression that reads a table, or calls
    a function that does, fails, and its value is read back from the source's row."""
    names = list(tables)
    if not names:
        return []
    rows = conn.execute(_EXPRESSION_SCHEMAS, {"tables": names}).fetchall()
    return [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(r[0]), sql.Identifier(EXPRESSIONS_ROLE)
        )
        for r in rows
    ]


def _create_if_missing(name: str, options: str) -> sql.Composed:
    return sql.SQL(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {literal}) THEN "
        "CREATE ROLE {role} WITH {options}; END IF; END $$"
    ).format(literal=sql.Literal(name), role=sql.Identifier(name), options=sql.SQL(options))


def publication_comment(role: str) -> str:
    """What a pipeline's publication says about the role it streams as."""
    return f"cdc pipeline; replication role {role}"


def _kept(
    conn: psycopg.Connection[Any], role: str, publication: str | None
) -> set[tuple[str, str]]:
    """The tables the role's other pipelines capture (their publications name the role)."""
    rows = conn.execute(
        "SELECT t.schemaname, t.tablename FROM pg_publication p "
        "JOIN pg_publication_tables t ON t.pubname = p.pubname "
        "WHERE obj_description(p.oid, 'pg_publication') = %s "
        "AND p.pubname IS DISTINCT FROM %s AND t.schemaname <> %s",
        (publication_comment(role), publication, OWN_SCHEMA),
    )
    return {(r[0], r[1]) for r in rows}


def grant_statement(
    schema: str,
    name: str,
    role: sql.Composable,
    columns: Mapping[tuple[str, str], list[str]],
) -> sql.Composed:
    """SELECT on the table, or on only the columns `columns` names for it."""
    table = sql.Identifier(schema, name)
    chosen = columns.get((schema, name))
    if chosen is None:
        return sql.SQL("GRANT SELECT ON {} TO {}").format(table, role)
    return sql.SQL(
        "REVOKE SELECT ON {table} FROM {role}; GRANT SELECT ({cols}) ON {table} TO {role}"
    ).format(table=table, role=role, cols=sql.SQL(", ").join(map(sql.Identifier, chosen)))


def sync_grants(
    conn: psycopg.Connection[Any],
    role: str,
    tables: Iterable[tuple[str, str]],
    publication: str | None = None,
    *,
    columns: Mapping[tuple[str, str], list[str]] | None = None,
) -> list[str]:
    """SELECT on exactly `tables` and the tables the role's other pipelines capture (USAGE
    on their schemas); what the role holds beyond that is revoked. Returns the tables
    revoked. `publication` is this pipeline's, left out of the others. `columns`: the
    only columns the role may read of a table (a table another pipeline of the role
    captures keeps SELECT on every column)."""
    kept = _kept(conn, role, publication)
    wanted = set(tables) | kept
    chosen = {t: c for t, c in (columns or {}).items() if t not in kept}
    role_id = sql.Identifier(role)
    held_whole = _holding(conn, role, "pg_class c", "c.relacl")
    held = held_whole | _holding(
        conn, role, "pg_attribute t JOIN pg_class c ON c.oid = t.attrelid", "t.attacl"
    )
    schemas = {
        r[0]
        for r in conn.execute(
            "SELECT n.nspname FROM pg_namespace n, aclexplode(n.nspacl) a "
            "WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = %s) "
            "AND a.privilege_type = 'USAGE' AND n.nspname NOT IN (%s, %s)",
            (role, OWN_SCHEMA, WATERMARK_SCHEMA),
        )
    }
    for schema in sorted({s for s, _ in wanted} - schemas):
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role_id)
        )
    # a table whose columns are chosen gets its column grants anew (its choice may have
    # changed); REVOKE on a table takes its column grants too
    for schema, name in sorted((wanted - held_whole - set(chosen)) | (set(chosen) & wanted)):
        conn.execute(grant_statement(schema, name, role_id, chosen))
    revoked = sorted(held - wanted)
    for schema, name in revoked:
        conn.execute(
            sql.SQL("REVOKE SELECT ON {} FROM {}").format(sql.Identifier(schema, name), role_id)
        )
    for schema in sorted(schemas - {s for s, _ in wanted}):
        conn.execute(
            sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(sql.Identifier(schema), role_id)
        )
    return [f"{schema}.{name}" for schema, name in revoked]


def _holding(
    conn: psycopg.Connection[Any], role: str, relation: str, acl: str
) -> set[tuple[str, str]]:
    """The tables (outside the pipeline's own schema) on which the ACL column `acl` of
    `relation` gives the role SELECT."""
    query = sql.SQL(
        "SELECT DISTINCT n.nspname, c.relname FROM {relation} "
        "JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode({acl}) a "
        "WHERE a.grantee = (SELECT oid FROM pg_roles WHERE rolname = %s) "
        "AND a.privilege_type = 'SELECT' AND n.nspname <> %s"
    ).format(relation=sql.SQL(relation), acl=sql.SQL(acl))
    return {(r[0], r[1]) for r in conn.execute(query, (role, OWN_SCHEMA))}


def other_pipelines(conn: psycopg.Connection[Any], role: str) -> list[str]:
    """The publications of pipelines still set up on this database that stream as the
    role, and the sessions it still has open."""
    rows = conn.execute(
        "SELECT pubname FROM pg_publication WHERE obj_description(oid, 'pg_publication') = %s "
        "UNION ALL SELECT 'a session from ' || coalesce(host(client_addr), 'local') "
        "FROM pg_stat_activity WHERE usename = %s",
        (publication_comment(role), role),
    )
    return sorted(r[0] for r in rows)


def drop_role(conn: psycopg.Connection[Any], settings: Settings) -> bool:
    """Drop the replication role and what it was granted; its generated password goes too.
    Returns whether it existed."""
    role = settings.pipeline.replication_user
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if exists:
        # DROP OWNED revokes its grants in this database; it owns nothing else
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    password_file(settings).unlink(missing_ok=True)
    return bool(exists)
