"""The source database prepared for capture, idempotently and with least privilege
(what the apply job reads of it every batch: source_reader.py).

`prepare_source` creates or updates, in one transaction (so that a failure
leaves nothing half made): the pipeline's own schema (signal, heartbeat and
snapshot-state tables; a signal table from before, holding `data varchar(2048)`,
is widened to `text` first in a short transaction of its own), the replication
role, its grants on exactly the captured tables, the configured replica
identities, and the publication that holds exactly the captured tables plus the
signal, heartbeat and truncations tables, and a TRUNCATE trigger on every table
some pipeline captures (and on no other).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import errors, sql

from cdc.capture import pending
from cdc.capture.masks import read_salt, salt_statement
from cdc.capture.replica_identity import (
    apply_replica_identity,
    identity_trigger_statement,
    install_identity_trigger,
)
from cdc.capture.role import (
    EXPRESSIONS_FUNCTION,
    expression_grants,
    grant_statement,
    publication_comment,
    replication_password,
    role_statements,
    sync_grants,
)
from cdc.core.catalog import (
    HEARTBEAT_TABLE,
    OWN_SCHEMA,
    TRUNCATIONS_TABLE,
    WATERMARK_SCHEMA,
    Table,
    check_publishable,
    check_wal_level,
    pipeline_placeholder,
    published_tables,
    publishing_relations,
    reserved_problem,
    resolve_tables,
    toast_blind_columns,
)
from cdc.core.errors import SourceError
from cdc.core.identity import (
    acknowledge_all,
    current_relations,
    partitions_gone,
    placeholder_statement,
    record_captured,
)
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import PROJECT_ROOT, Settings
from cdc.core.topics import change_topic, check_names_apart, ever_written

__all__ = [
    "drop_publication",
    "prepare_source",
    "replication_dsn",
    "setup_sql",
    "signal_data_width",
    "sync_truncate_triggers",
    "widen_signal_table",
]

log = logging.getLogger(__name__)
SIGNAL_TABLE = f"{OWN_SCHEMA}.debezium_signal"
TRUNCATE_TRIGGER = "cdc_record_truncate"
SIGNAL_LOCK_TIMEOUT = "3s"  # how long widening the signal table may wait for its lock
SETUP_LOCK_TIMEOUT = "10s"  # how long the setup may wait for a captured table's lock


def replication_dsn(settings: Settings, replication: bool = False) -> str:
    """libpq DSN of the replication role (holds its password: never print it)."""
    pipe = settings.pipeline
    extra = {"replication": "database"} if replication else {}
    password = replication_password(settings)
    return settings.postgres.conninfo(pipe.replication_user, password, **extra)


def _sql_file(name: str) -> str:
    return (PROJECT_ROOT / "sql" / name).read_text()


def _check_storable(table: Table, settings: Settings) -> None:
    """Refuse a table whose columns a store cannot keep beside its own (the warehouse
    also refuses it as it starts: WarehouseStore._history)."""
    columns = [c.name for c in table.columns]
    if problem := reserved_problem(columns, settings.apply.stores):
        raise SourceError(f"table {table.qualified} cannot be captured: {problem}")


# what in the pipeline's own schema is not the setup user's (nor a superuser's): its
# tables, functions and triggers run or are written with the setup user's rights
_FOREIGN = """
WITH mine AS (SELECT oid FROM pg_roles WHERE rolname = current_user OR rolsuper),
ns AS (SELECT oid, nspowner FROM pg_namespace WHERE nspname = %(schema)s)
SELECT 'schema ' || %(schema)s, nspowner::regrole::text FROM ns
WHERE nspowner NOT IN (SELECT oid FROM mine)
UNION ALL
SELECT 'table ' || c.oid::regclass::text, c.relowner::regrole::text FROM pg_class c
WHERE c.relnamespace IN (SELECT oid FROM ns) AND c.relowner NOT IN (SELECT oid FROM mine)
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text, p.proowner::regrole::text FROM pg_proc p
WHERE p.pronamespace IN (SELECT oid FROM ns) AND p.proowner NOT IN (SELECT oid FROM mine)
AND p.proname <> %(expressions)s
UNION ALL
SELECT 'trigger ' || t.tgname || ' on ' || c.oid::regclass::text, p.proowner::regrole::text
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
WHERE c.relnamespace IN (SELECT oid FROM ns) AND NOT t.tgisinternal
AND p.proowner NOT IN (SELECT oid FROM mine)
LIMIT 1
"""


def check_own_schema(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """Refuse a `cdc` schema that holds another role's objects: made first by a database
    owner, say, its triggers would run with the administrator's rights whenever `cdc`
    writes its own tables. The same for `cdc_watermarks`, whose function the connector
    calls in place of pg_current_snapshot()."""
    found = None
    for schema in (OWN_SCHEMA, WATERMARK_SCHEMA):
        found = (
            found
            or conn.execute(
                _FOREIGN, {"schema": schema, "expressions": EXPRESSIONS_FUNCTION[1]}
            ).fetchone()
        )
    if found is None:
        return
    what, owner = found
    database = settings.postgres.database
    what = re.sub(r"^schema \S+", lambda m: f"{m[0]} of database {database}", what)
    raise SourceError(
        f"{what} belongs to "
        f"{owner}: the pipeline's own schema must be the setup user's alone (another "
        f"role's trigger or function would run with its rights); drop it, or give it to "
        f"{settings.postgres.user} (ALTER … OWNER TO)"
    )


def prepare_source(settings: Settings, before: dict[int, str] | None = None) -> list[Table]:
    """Make the source ready for the pipeline; returns the captured tables. With `before`
    (the relations it captured, OID -> name: `cdc setup`), what that owes (a cut, a
    backfill: pending.py) is recorded with the capture set; without (a snapshot, which
    reads every table), nothing is owed any more."""
    pipe = settings.pipeline
    # the names whose stores may hold rows from an earlier capture (pending.owed)
    written = ever_written(settings.kafka, pipe) if before is not None else set()
    with admin_connection(settings) as conn:
        check_own_schema(conn, settings)
        widen_signal_table(conn)  # before the setup's transaction: its lock is held briefly
        check_wal_level(conn)
        try:
            with conn.transaction():
                # a table a long transaction holds is not waited for (its writers would
                # queue behind the setup's locks)
                conn.execute(f"SET LOCAL lock_timeout = '{SETUP_LOCK_TIMEOUT}'")
                conn.execute(_sql_file("pipeline_schema.sql"))
                tables = resolve_tables(conn, pipe, as_published=False)
                check_names_apart([t.qualified for t in tables], pipe)
                apply_replica_identity(conn, tables, pipe.replica_identity)
                install_identity_trigger(conn, tables, pipe.replica_identity)
                for table in tables:
                    check_publishable(conn, table)
                    _check_storable(table, settings)
                for statement in role_statements(conn, settings):
                    conn.execute(statement)
                for statement in expression_grants(
                    conn, [t.regclass for t in tables if t.generated]
                ):
                    conn.execute(statement)
                revoked = sync_grants(
                    conn,
                    pipe.replication_user,
                    [(t.schema, t.name) for t in tables],
                    pipe.publication,
                    columns=_granted_columns(tables),
                )
                _check_filter_texts(conn, tables)
                published = set(published_tables(conn, pipe.publication))
                _publish(conn, pipe.publication, tables)
                _check_filters(conn, tables)
                # the first write of the transaction comes after the publication exists:
                # a consumer of the publication decodes each change with the catalog of
                # its moment, and fails on one made before the publication was
                conn.execute(placeholder_statement(pipe.name))  # before record_captured
                conn.execute(salt_statement(pipe))
                read_salt(conn, pipe)  # pipeline.mask_salt, if set, is the one in use
                placeholder = pipeline_placeholder(conn, pipe.name)
                tables = [replace(t, placeholder=placeholder) for t in tables]
                if before is None:  # a snapshot reads every table: it owes nothing
                    pending.clear(conn, pipe.name)
                    acknowledge_all(conn, pipe.name)
                else:  # a captured table out of the publication lost its changes since
                    chosen = [t.qualified for t in tables]
                    unpublished = set(before.values()) - published
                    now = current_relations(conn, chosen)
                    logged = [t for t in chosen if change_topic(pipe, t) in written]
                    shrunk = partitions_gone(conn, pipe.name)
                    work = pending.owed(before, now, chosen, unpublished, logged, shrunk)
                    pending.record(conn, pipe.name, work)
                record_captured(conn, pipe.name, tables)
                conn.execute(
                    sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                        sql.Identifier(pipe.publication),
                        sql.Literal(publication_comment(pipe.replication_user)),
                    )
                )
        except errors.LockNotAvailable:
            raise SourceError(
                f"a captured table stayed locked for {SETUP_LOCK_TIMEOUT} (a long transaction or "
                "a migration holds it); nothing was changed: run the command again when it ends"
            ) from None
        except errors.InsufficientPrivilege as exc:
            raise SourceError(
                f"PostgreSQL user {settings.postgres.user} lacks a privilege the setup needs "
                f"({exc.diag.message_primary}); run it as a superuser, or as a user with "
                "CREATEROLE that owns the captured tables"
            ) from None
        if revoked:
            log.info("SELECT revoked from %s on %s", pipe.replication_user, ", ".join(revoked))
        for table in tables:
            blind = toast_blind_columns(table)
            if blind and pipe.replica_identity.get(table.qualified) != "full":
                names = ", ".join(f"{c.name} ({c.type})" for c in blind)
                log.warning(
                    "table %s: an update that leaves %s unchanged sends it as NULL once it "
                    "is TOASTed (Debezium has no placeholder for these arrays), and the "
                    'stores would take the NULL; set pipeline.replica_identity."%s" = "full"',
                    table.qualified,
                    names,
                    table.qualified,
                )
        # outside the setup's transaction, and without waiting on a busy table (a long
        # transaction, or one the snapshot's slot waits for): `cdc snapshot` installs the
        # ones left when it has finished
        sync_truncate_triggers(conn, wait=False)
    return tables


def _member(table: Table) -> sql.Composable:
    """A table in the publication: its column list and row filter (pipeline.table)."""
    parts: list[sql.Composable] = [sql.Identifier(table.schema, table.name)]
    if table.column_list is not None:
        parts.append(
            sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Identifier, table.column_list)))
        )
    if table.row_filter is not None:
        parts.append(sql.SQL("WHERE ({})").format(sql.SQL(table.row_filter)))
    return sql.SQL(" ").join(parts)


# A partitioned table's changes are published as its root's (one table, one topic), never
# under each partition's name. PostgreSQL 18's `publish_generated_columns` stays off:
# Debezium 3.6 removes generated columns from the tables it decodes (PostgresSchema), so
# their published values would not reach the events; the apply job computes them on
# every major (cdc/log/generated_columns.py).
_OPTIONS = sql.SQL("publish_via_partition_root = true")


def _members(tables: list[Table], server_version: int) -> list[sql.Composable]:
    """What a pipeline's publication holds: its tables, and the pipeline's own three.
    Column lists and row filters are PostgreSQL 15's (pgoutput filters them)."""
    if server_version < 150000:
        chosen = [t.qualified for t in tables if t.column_list is not None or t.row_filter]
        if chosen:
            raise SourceError(
                f"{', '.join(chosen)}: a column choice or row filter (pipeline.table) needs "
                f"PostgreSQL 15 or later, and this server is {server_version // 10000}: "
                "capture these tables whole, or upgrade the server"
            )
    return [_member(t) for t in tables] + [
        sql.Identifier(*SIGNAL_TABLE.split(".")),
        sql.Identifier(*HEARTBEAT_TABLE.split(".")),
        sql.Identifier(*TRUNCATIONS_TABLE.split(".")),
    ]


def setup_sql(settings: Settings) -> str:
    """The SQL `cdc setup` runs on the source, for a DBA to read and run (psql -1 -f):
    nothing is changed here. The catalog is read as the configured user (any user that
    sees the captured tables); the role's password appears only as its SCRAM verifier."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        tables = resolve_tables(conn, pipe, as_published=False)
        check_names_apart([t.qualified for t in tables], pipe)
        _check_filter_texts(conn, tables)
        unchecked = _check_printed_filters(conn, tables, pipe)
        composed: list[sql.Composable] = []
        for table in tables:
            identity = pipe.replica_identity.get(table.qualified)
            for qualified in (
                [table.qualified, *publishing_relations(conn, table)] if identity else []
            ):
                composed.append(
                    sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
                        sql.Identifier(*qualified.split(".", 1)), sql.SQL(str(identity).upper())
                    )
                )
        if any(pipe.replica_identity.get(t.qualified) == "full" for t in tables if t.partitioned):
            composed.append(identity_trigger_statement())  # a superuser's (see its module)
        composed += role_statements(conn, settings)
        composed += expression_grants(conn, [t.regclass for t in tables if t.generated])
        role = sql.Identifier(pipe.replication_user)
        for schema in sorted({t.schema for t in tables}):
            composed.append(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role)
            )
        granted = _granted_columns(tables)
        for table in tables:
            composed.append(grant_statement(table.schema, table.name, role, granted))
        publication = sql.Identifier(pipe.publication)
        composed += [
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(
                publication,
                sql.SQL(", ").join(_members(tables, conn.info.server_version)),
                _OPTIONS,
            ),
            sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                publication, sql.Literal(publication_comment(pipe.replication_user))
            ),
        ]
        composed.append(placeholder_statement(pipe.name))  # before cdc.captured changes
        if pipe.mask_salt is None:  # a random one, made by PostgreSQL (never printed)
            composed.append(salt_statement(pipe))
        else:
            composed.append(
                sql.SQL(
                    "-- pipeline.mask_salt is set: INSERT INTO cdc.mask_salts (pipeline, salt) "
                    "VALUES ({}, '<the salt>')"
                ).format(sql.Literal(pipe.name))
            )
        composed.append(
            sql.SQL("DELETE FROM cdc.captured WHERE pipeline = {}").format(sql.Literal(pipe.name))
        )
        composed += [
            sql.SQL(
                "INSERT INTO cdc.captured (pipeline, relid, table_name) "
                "VALUES ({}, {}::regclass, {})"
            ).format(sql.Literal(pipe.name), sql.Literal(t.regclass), sql.Literal(t.qualified))
            for t in tables
        ]
        composed += [
            sql.SQL(
                "CREATE TRIGGER {} AFTER TRUNCATE ON {} FOR EACH STATEMENT "
                "EXECUTE FUNCTION cdc.record_truncate()"
            ).format(sql.Identifier(TRUNCATE_TRIGGER), sql.Identifier(t.schema, t.name))
            for t in tables
        ]
        rendered = [c.as_string(conn) + ";" for c in composed]
        conn.rollback()
    header = (
        f"-- cdc setup of pipeline {pipe.name} on database {settings.postgres.database}: "
        f"{len(tables)} tables\n-- run it as a superuser, or a role with CREATEROLE that owns "
        "the tables (RDS/Cloud SQL: rds_superuser / cloudsqlsuperuser; Azure: azure_pg_admin)"
    )
    if unchecked:
        header += (
            f"\n-- the row filters and column lists were not checked against the replica "
            f"identity (user {settings.postgres.user} may not try the publication: {unchecked}); "
            "`cdc setup` checks them as it runs"
        )
    body = "\n\n".join([_sql_file("pipeline_schema.sql").strip(), *rendered])
    return f"{header}\n{body}\n"


def _check_printed_filters(
    conn: psycopg.Connection[Any], tables: list[Table], pipe: Any
) -> str | None:
    """Refuse, as `cdc setup` would, a row filter or column list under which PostgreSQL
    would reject the table's UPDATEs and DELETEs: the replica identity and a publication
    tried in a savepoint that is rolled back. None, or why it could not be tried (a user
    who may not alter the tables or create a publication)."""
    if not any(t.row_filter is not None or t.column_list is not None for t in tables):
        return None
    try:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{SETUP_LOCK_TIMEOUT}'")
            apply_replica_identity(conn, tables, pipe.replica_identity)
            _publish(conn, f"cdc_check_{pipe.publication}"[:63], tables)
            _check_filters(conn, tables)
            raise psycopg.Rollback()
    except (errors.InsufficientPrivilege, errors.LockNotAvailable) as exc:
        return str(exc.diag.message_primary or type(exc).__name__)
    return None


def _granted_columns(tables: list[Table]) -> dict[tuple[str, str], list[str]]:
    """The columns the replication role may read of each table whose columns are chosen
    (with ctid, by which the snapshot splits a table): it reads no other."""
    return {(t.schema, t.name): ["ctid", *(c.name for c in t.columns)] for t in tables if t.listed}


def _check_filter_texts(conn: psycopg.Connection[Any], tables: list[Table]) -> None:
    """Refuse a row filter that is not one boolean expression on the table (planned in a
    savepoint, never run); the publication refuses what it may not hold (a mutable or
    user-defined function, a subquery) in its own words."""
    for table in tables:
        if table.row_filter is None:
            continue
        query = sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE ({})").format(
            sql.Identifier(table.schema, table.name), sql.SQL(table.row_filter)
        )
        try:
            with conn.transaction():
                conn.execute(query)
        except psycopg.errors.LockNotAvailable:
            raise
        except psycopg.Error as exc:
            raise SourceError(
                f'pipeline.table."{table.qualified}".where is not a valid filter on '
                f"{table.qualified}: {str(exc).strip().splitlines()[0]}"
            ) from None


def _check_filters(conn: psycopg.Connection[Any], tables: list[Table]) -> None:
    """Refuse a row filter or column list under which PostgreSQL would reject the
    table's UPDATEs and DELETEs (its columns must be in the replica identity): planned,
    never run, inside the setup's transaction, which rolls back on refusal."""
    for table in tables:
        if table.row_filter is None and table.column_list is None:
            continue
        name, key = sql.Identifier(table.schema, table.name), sql.Identifier(table.key[0])
        for statements in (
            # a key GENERATED ALWAYS AS IDENTITY is only ever set to DEFAULT
            (
                "EXPLAIN UPDATE {0} SET {1} = {1} WHERE false",
                "EXPLAIN UPDATE {0} SET {1} = DEFAULT WHERE false",
            ),
            ("EXPLAIN DELETE FROM {0} WHERE false",),
        ):
            try:
                for statement in statements:
                    try:
                        with conn.transaction():
                            conn.execute(sql.SQL(statement).format(name, key))
                        break
                    except psycopg.errors.GeneratedAlways:
                        if statement == statements[-1]:
                            raise
            except psycopg.errors.InvalidColumnReference as exc:
                raise SourceError(_filter_refusal(table, exc.diag.message_detail or "")) from None


def _filter_refusal(table: Table, detail: str) -> str:
    where = f'pipeline.table."{table.qualified}"'
    if "WHERE" in detail:
        return (
            f"{where}.where reads a column outside the replica identity of "
            f"{table.qualified}, so PostgreSQL would refuse every UPDATE and DELETE of it: "
            f"filter on its key columns ({', '.join(table.key)}), or set "
            f'pipeline.replica_identity."{table.qualified}" = "full" (and capture every column)'
        )
    return (
        f"{where} leaves out a column of the replica identity of {table.qualified}, so "
        f"PostgreSQL would refuse every UPDATE and DELETE of it: capture it ({detail.strip()})"
    )


def _publish(conn: psycopg.Connection[Any], publication: str, tables: list[Table]) -> None:
    try:
        with conn.transaction():
            _set_publication(conn, publication, tables)
    except (psycopg.errors.InvalidObjectDefinition, psycopg.errors.FeatureNotSupported) as exc:
        filtered = [f'pipeline.table."{t.qualified}"' for t in tables if t.row_filter]
        raise SourceError(
            f"the publication refuses {' or '.join(filtered) or 'the tables'}: "
            f"{exc.diag.message_primary} ({(exc.diag.message_detail or '').strip()}); "
            "a row filter may use the table's columns, constants and built-in immutable "
            "functions only"
        ) from None


def _set_publication(conn: psycopg.Connection[Any], publication: str, tables: list[Table]) -> None:
    names = _members(tables, conn.info.server_version)
    exists = conn.execute(
        "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
    ).fetchone()
    # a partitioned table's changes are published as its root's (one table, one topic),
    # never under each partition's name
    if exists:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
                sql.Identifier(publication), sql.SQL(", ").join(names)
            )
        )
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET ({})").format(sql.Identifier(publication), _OPTIONS)
        )
    else:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(
                sql.Identifier(publication),
                sql.SQL(", ").join(names),
                _OPTIONS,
            )
        )


def drop_publication(settings: Settings) -> bool:
    with admin_connection(settings) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.pipeline.publication,)
        ).fetchone()
        if exists:
            conn.execute(
                sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(settings.pipeline.publication))
            )
            sync_truncate_triggers(conn)
            conn.commit()
        return bool(exists)


def sync_truncate_triggers(conn: psycopg.Connection[Any], wait: bool = True) -> list[str]:
    """A TRUNCATE trigger on exactly the tables a pipeline's publication holds.

    The trigger records the TRUNCATE as a row of cdc.truncations (see
    sql/pipeline_schema.sql); a table no pipeline captures any more loses it.
    CREATE TRIGGER locks the table against writes: with wait=False a table that
    stays busy for 3 s is left for later. Returns the tables left.
    """
    wanted = {
        (r[0], r[1])
        for r in conn.execute(
            "SELECT p.schemaname, p.tablename FROM pg_publication_tables p "
            "WHERE p.pubname IN (SELECT pubname FROM pg_publication_tables "
            "  WHERE schemaname = %s AND tablename = 'truncations') AND p.schemaname <> %s",
            (OWN_SCHEMA, OWN_SCHEMA),
        )
    }
    have = {
        (r[0], r[1])
        for r in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.tgname = %s",
            (TRUNCATE_TRIGGER,),
        )
    }
    trigger = sql.Identifier(TRUNCATE_TRIGGER)
    changes = [
        (
            f"{schema}.{name}",
            sql.SQL(
                "CREATE TRIGGER {} AFTER TRUNCATE ON {} FOR EACH STATEMENT "
                "EXECUTE FUNCTION cdc.record_truncate()"
            ).format(trigger, sql.Identifier(schema, name)),
        )
        for schema, name in sorted(wanted - have)
    ] + [
        (
            f"{schema}.{name}",
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                trigger, sql.Identifier(schema, name)
            ),
        )
        for schema, name in sorted(have - wanted)
    ]
    busy = []
    for table, statement in changes:
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{'30s' if wait else '3s'}'")
                conn.execute(statement)
        except errors.LockNotAvailable:
            busy.append(table)
    if busy:
        log.warning("TRUNCATE trigger left for later on busy tables: %s", ", ".join(busy))
    return busy


def signal_data_width(conn: psycopg.Connection[Any], table: str = SIGNAL_TABLE) -> int | None:
    """How many characters the signal table's data column holds: None for any (text)."""
    schema, name = table.split(".", 1)
    row = conn.execute(
        "SELECT character_maximum_length FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s AND column_name = 'data'",
        (schema, name),
    ).fetchone()
    return None if row is None else row[0]


def widen_signal_table(conn: psycopg.Connection[Any], table: str = SIGNAL_TABLE) -> bool:
    """The signal table's data column as text, so that a signal carries a filter of any length.

    Pipelines set up before held it as varchar(2048) (the width Debezium's docs show),
    too short for a backfill of more than about 190 keys. varchar to text rewrites
    nothing, but ALTER TABLE takes the table's exclusive lock: it waits at most
    SIGNAL_LOCK_TIMEOUT for it (Debezium's watermark writes queue behind it meanwhile;
    the application never touches this table), and gives up rather than wait longer.
    Idempotent. Returns whether the column is now text (or the table does not exist yet).
    """
    with conn.transaction():
        if signal_data_width(conn, table) is None:
            return True
        previous = conn.execute("SELECT current_setting('lock_timeout')").fetchone()[0]  # type: ignore[index]
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (SIGNAL_LOCK_TIMEOUT,))
                conn.execute(
                    sql.SQL("ALTER TABLE {} ALTER COLUMN data TYPE text").format(
                        sql.Identifier(*table.split(".", 1))
                    )
                )
        except errors.LockNotAvailable:
            log.warning(
                "%s.data left as it is: the table stayed locked for %s", table, SIGNAL_LOCK_TIMEOUT
            )
            return False
        except errors.InsufficientPrivilege:
            log.warning("%s.data left as it is: only the table's owner can widen it", table)
            return False
        finally:
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (previous,))
    log.info("%s.data widened to text", table)
    return True
