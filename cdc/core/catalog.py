"""What the PostgreSQL catalog says about the captured tables."""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from cdc.core.errors import ConfigError, SourceError
from cdc.core.postgres_client import admin_connection
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.store_declarations import declared
from cdc.core.streamed_types import streamed, type_name

if TYPE_CHECKING:
    from cdc.core.settings import Settings

__all__ = [
    "HEARTBEAT_TABLE",
    "OWN_SCHEMA",
    "TRUNCATIONS_TABLE",
    "Column",
    "Table",
    "captured_table",
    "check_publishable",
    "check_wal_level",
    "describe_table",
    "published_tables",
    "publishing_relations",
    "reserved_problem",
    "resolve_tables",
    "selected_tables",
    "toast_blind_columns",
    "unstreamed_note",
]

# our own bookkeeping (signal, heartbeat, snapshot state) is never captured as data
OWN_SCHEMA = "cdc"
# only cdc_watermarks.pg_current_snapshot(), a read-only backfill's watermark
# (sql/pipeline_schema.sql): the connector's sessions search it before pg_catalog
WATERMARK_SCHEMA = "cdc_watermarks"
# a TRUNCATE of a captured table, recorded as a row by a trigger (sql/pipeline_schema.sql)
TRUNCATIONS_TABLE = f"{OWN_SCHEMA}.truncations"
# a row per pipeline that Debezium's heartbeat writes (now()) every heartbeat interval:
# captured to a topic of its own, its commit time tells how far the capture has come
HEARTBEAT_TABLE = f"{OWN_SCHEMA}.heartbeat"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # format_type(): "numeric(12,2)", "timestamp(3) with time zone", "text[]"
    base: str  # the base type's name after domains and arrays: "numeric", "timestamptz"
    category: str  # pg_type.typcategory of the base type (N numeric, S string, E enum, ...)
    is_array: bool
    precision: int | None  # fractional-second digits of time types, when declared
    not_null: bool
    has_default: bool = False  # a DEFAULT, or a value rows from before ADD COLUMN read
    # GENERATED ALWAYS AS (expression) STORED: the expression (pg_get_expr) and the
    # columns it reads; PostgreSQL 15 publishes no value for it (cdc/log/generated_columns.py)
    generated: str | None = None
    inputs: tuple[str, ...] = ()
    # an enum's labels in their order: `ALTER TYPE … RENAME VALUE` changes every value
    # holding the old label without a change event (cdc/capture/rewrites.py)
    labels: tuple[str, ...] = ()


# Debezium's default placeholder for an unchanged TOASTed value the WAL did not carry
DEBEZIUM_PLACEHOLDER = "__debezium_unavailable_value"


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # primary key, or the configured key columns
    replica_identity: str  # d(efault), f(ull), i(ndex), n(othing)
    pages: int  # of its largest partition, for a partitioned table
    estimated_rows: int
    partitioned: bool = False  # a partitioned table, captured through its root
    # the text its change events carry for an unchanged TOASTed value: the pipeline's
    # connector's `unavailable.value.placeholder` (cdc.placeholders; cdc/core/identity.py)
    placeholder: str = field(default=DEBEZIUM_PLACEHOLDER, repr=False)  # a secret
    # what pipeline.table leaves in PostgreSQL: the columns not captured (excluded, or
    # added since `cdc setup` named the publication's columns), and the row filter
    excluded: tuple[str, ...] = ()
    row_filter: str | None = None
    listed: bool = False  # its columns are chosen: the publication names them
    # columns the settings capture that the publication does not name yet (added to the
    # table since `cdc setup`): `cdc setup` captures them, and a backfill fills them
    pending: tuple[str, ...] = ()
    # the columns that leave masked: (column, "hash" or "redact", the redacted text or
    # None for NULL), and the pipeline whose salt hashes them (cdc.mask_salts)
    masks: tuple[tuple[str, str, str | None], ...] = ()
    pipeline: str = ""
    # the columns not captured because Debezium's events do not carry their type's
    # values (cdc.core.streamed_types), each with its type: ("b", "box")
    unstreamed: tuple[tuple[str, str], ...] = ()

    @property
    def regclass(self) -> str:
        """The table as a regclass literal (quoted identifiers)."""
        return ".".join('"' + part.replace('"', '""') + '"' for part in (self.schema, self.name))

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def generated(self) -> tuple[Column, ...]:
        """Its generated columns, which change events lack."""
        return tuple(c for c in self.columns if c.generated is not None)

    def column(self, name: str) -> Column:
        return self._columns[name]

    @functools.cached_property
    def _columns(self) -> dict[str, Column]:
        """The columns by name (made once: verify asks for a key's column every row)."""
        return {c.name: c for c in self.columns}

    def mask(self, name: str) -> tuple[str, str | None] | None:
        """How column `name` leaves PostgreSQL masked: (mode, redacted text), or None."""
        return next(((m, v) for c, m, v in self.masks if c == name), None)

    @property
    def column_list(self) -> tuple[str, ...] | None:
        """The publication's column list for it (None: every column). PostgreSQL 15
        publishes no generated column, and refuses one in a column list."""
        if not self.listed:
            return None
        return tuple(c.name for c in self.columns if c.generated is None)

    def source(self, alias: str | None = None) -> sql.Composable:
        """The table in a FROM clause as the pipeline captures it: its rows that the row
        filter holds for (`alias` names it; default its own name)."""
        name = sql.Identifier(self.schema, self.name)
        if self.row_filter is None:
            if alias is None:
                return name
            return sql.SQL("{} AS {}").format(name, sql.Identifier(alias))
        return sql.SQL("(SELECT * FROM {} WHERE ({})) AS {}").format(
            name, sql.SQL(self.row_filter), sql.Identifier(alias or self.name)
        )


def published_tables(conn: psycopg.Connection[Any], publication: str) -> list[str]:
    """The captured tables a publication holds ("schema.table"), without the pipeline's own:
    the tables put in it (a partitioned table's root, never its partitions)."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_publication_rel r "
        "JOIN pg_publication p ON p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE p.pubname = %s AND n.nspname <> %s ORDER BY 1, 2",
        (publication, OWN_SCHEMA),
    ).fetchall()
    return [f"{schema}.{name}" for schema, name in rows]


def publishing_relations(conn: psycopg.Connection[Any], table: Table) -> list[str]:
    """The partitions of a partitioned table, at every level (each has its own replica
    identity); none for another table."""
    if not table.partitioned:
        return []
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_partition_tree(%s::regclass) t "
        "JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE t.relid <> %s::regclass ORDER BY t.level, 1, 2",
        (table.regclass, table.regclass),
    ).fetchall()
    return [f"{schema}.{name}" for schema, name in rows]


def check_publishable(conn: psycopg.Connection[Any], table: Table) -> None:
    """Refuse a table whose UPDATEs and DELETEs PostgreSQL would reject once published: a
    relation (the table, or a partition) with REPLICA IDENTITY NOTHING, one whose identity
    index is gone, or DEFAULT without a primary key. Capturing it would break the
    application's writes."""
    _check_no_inheritance_children(conn, table)
    for qualified in publishing_relations(conn, table) or [table.qualified]:
        schema, name = qualified.split(".", 1)
        row = conn.execute(
            "SELECT c.relreplident, c.relkind, "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
        if row is None or row[1] == "p":  # a partitioned table holds no rows itself
            continue
        identity, _, has_primary_key, has_identity_index = row
        if identity == "n":
            why = "has REPLICA IDENTITY NOTHING"
        elif identity == "i" and not has_identity_index:
            why = "has REPLICA IDENTITY USING INDEX, and that index is gone"
        elif identity == "d" and not has_primary_key:
            why = "has REPLICA IDENTITY DEFAULT but no primary key"
        else:
            continue
        of = f"{qualified} (a partition of {table.qualified})" if table.partitioned else qualified
        raise SourceError(
            f"table {of} {why}: once published, PostgreSQL would refuse its UPDATEs and "
            f"DELETEs; run ALTER TABLE {qualified} REPLICA IDENTITY DEFAULT (with a primary "
            f'key) or FULL, or set pipeline.replica_identity."{table.qualified}" = "full"'
        )


def _check_no_inheritance_children(conn: psycopg.Connection[Any], table: Table) -> None:
    """Refuse a table other tables inherit from (INHERITS, not partitioning): reading it
    (the snapshot, a backfill, verify) includes its children's rows, while PostgreSQL
    publishes their changes under the children's own names, so the table's stores would
    keep child rows that were changed or deleted since."""
    if table.partitioned:
        return
    children = [
        r[0]
        for r in conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE i.inhparent = %s::regclass ORDER BY 1",
            (table.regclass,),
        ).fetchall()
    ]
    if children:
        named = ", ".join(children[:3]) + (
            f" and {len(children) - 3} more" if len(children) > 3 else ""
        )
        raise SourceError(
            f"table {table.qualified} has inheritance children ({named}): reading it includes "
            "their rows, but their changes are published under their own names, so its "
            "stores would keep rows changed or deleted in a child; capture the children on "
            f'their own and leave it out (pipeline.exclude_tables = ["{table.qualified}"]), '
            "or make it a partitioned table"
        )


# array element types whose unchanged TOASTed value Debezium 3.6 sends with a placeholder
# (cdc.types.decode.PLACEHOLDER_ARRAYS); for any other it sends NULL
_ARRAYS_WITH_PLACEHOLDER = {"text", "varchar", "bpchar", "json", "jsonb", "bytea", "uuid"}
_ARRAYS_WITH_PLACEHOLDER |= {"int4", "int8", "date"}


def toast_blind_columns(table: Table) -> list[Column]:
    """The columns whose unchanged TOASTed value would reach the stores as NULL: arrays
    Debezium sends no placeholder for, unless the table's replica identity is FULL (the
    old row is then logged whole, and Debezium takes the value from it)."""
    if table.replica_identity == "f":
        return []
    return [
        c
        for c in table.columns
        if c.is_array and c.base not in _ARRAYS_WITH_PLACEHOLDER and c.name not in table.key
    ]


def check_wal_level(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SHOW wal_level").fetchone()
    if not row or row[0] != "logical":
        raise SourceError(
            f"PostgreSQL has wal_level={row[0] if row else '?'}; change data capture needs "
            "wal_level=logical: set it in postgresql.conf (ALTER SYSTEM SET wal_level = logical) "
            "and restart PostgreSQL"
        )


def _existing_tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema', %s) "
        "AND n.nspname NOT LIKE 'pg_toast%%' ORDER BY 1, 2",
        (OWN_SCHEMA,),
    ).fetchall()
    return [f"{schema}.{name}" for schema, name in rows]


def selected_tables(conn: psycopg.Connection[Any], pipeline: PipelineSettings) -> list[str]:
    """The existing tables pipeline.tables selects (a name that matches none is skipped)."""
    existing = _existing_tables(conn)
    return [
        t
        for t in existing
        if any(fnmatch.fnmatchcase(t, p) for p in pipeline.tables)
        and not any(fnmatch.fnmatchcase(t, p) for p in pipeline.exclude_tables)
    ]


def resolve_tables(
    conn: psycopg.Connection[Any], pipeline: PipelineSettings, *, as_published: bool = True
) -> list[Table]:
    """The tables the pipeline captures, each checked: it exists and has a key.
    `as_published`: see describe_table."""
    existing = _existing_tables(conn)
    chosen: list[str] = []
    for pattern in pipeline.tables:
        if "." not in pattern:
            raise SourceError(f"table {pattern!r} needs its schema: write it as schema.table")
        matches = [t for t in existing if fnmatch.fnmatchcase(t, pattern)]
        if not matches:
            if renamed := _renamed_to(conn, pipeline.name, pattern):
                raise SourceError(
                    f"table {pattern} was renamed to {renamed} (the same table, which the "
                    f"pipeline still captures): name {renamed} in pipeline.tables in its "
                    "place and run `cdc setup`"
                )
            close = [t for t in existing if t.split(".")[1] == pattern.split(".")[1]]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise SourceError(
                f"table {pattern} does not exist in database "
                f"{conn.info.dbname}{hint}; create it or fix pipeline.tables"
            )
        chosen += [t for t in matches if t not in chosen]
    chosen = [
        t for t in chosen if not any(fnmatch.fnmatchcase(t, p) for p in pipeline.exclude_tables)
    ]
    if not chosen:
        raise SourceError("pipeline.tables selects no table: name at least one schema.table")
    if stray := [t for t in pipeline.table if t not in chosen]:
        raise SourceError(
            f'pipeline.table."{stray[0]}" names a table the pipeline does not capture: '
            "fix the name, or add the table to pipeline.tables"
        )
    return [describe_table(conn, t, pipeline, as_published=as_published) for t in chosen]


def _renamed_to(conn: psycopg.Connection[Any], pipeline: str, name: str) -> str | None:
    """The name now of the relation `pipeline` captured as `name`, if it was renamed."""
    exists = conn.execute("SELECT to_regclass('cdc.captured') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        return None
    row = conn.execute(
        "SELECT n.nspname || '.' || c.relname FROM cdc.captured k "
        "JOIN pg_class c ON c.oid = k.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE k.pipeline = %s AND k.table_name = %s",
        (pipeline, name),
    ).fetchone()
    return str(row[0]) if row and row[0] != name else None


# the stores' own columns and fields (positions, flags), and every helper column, alias
# and field of the pipeline's own SQL, Spark frames and Arrow tables beside a table's
# columns: no column may start with it, so no column name meets one of them
RESERVED_PREFIX = "_cdc_"


def reserved_problem(columns: list[str], stores: Collection[str] = ()) -> str | None:
    """Why a table with these columns cannot be kept (in `stores` too): a column named
    like one every store adds to every row, or one a store in `stores` reserves, or
    columns a store in `stores` cannot keep side by side (None: nothing)."""
    declarations = declared()
    for column in columns:
        name = column if column.isprintable() else json.dumps(column)  # one line, always
        if column.startswith(RESERVED_PREFIX):
            return (
                f"its column {name} starts with {RESERVED_PREFIX}, which every store keeps "
                "for its own columns; rename the column"
            )
        for store in stores:
            declaration = declarations.get(store)
            why = declaration.reserved(column) if declaration and declaration.reserved else None
            if why:
                return (
                    f"its column {name} {why}; rename the column, or leave the table out "
                    "(pipeline.exclude_tables)"
                )
    for store in stores:
        declaration = declarations.get(store)
        why = declaration.clashes(columns) if declaration and declaration.clashes else None
        if why:
            return f"{why}; rename one, or leave the table out (pipeline.exclude_tables)"
    return None


def describe_table(
    conn: psycopg.Connection[Any],
    qualified: str,
    pipeline: PipelineSettings,
    *,
    as_published: bool = True,
) -> Table:
    """The table as the pipeline captures it: its columns less those pipeline.table
    leaves out and, `as_published`, less those the publication does not name yet (a
    column added since `cdc setup`; the setup itself reads the settings' choice)."""
    schema, name = qualified.split(".", 1)
    head = conn.execute(_HEAD, (schema, name)).fetchone()
    if head is None:
        raise SourceError(f"table {qualified} does not exist; create it or fix pipeline.tables")
    oid, replident, pages, reltuples, relkind = head
    columns = tuple(
        Column(
            name=r[0],
            type=r[1],
            base=r[2],
            category=r[3],
            is_array=r[4],
            precision=r[5],
            not_null=r[6],
            has_default=r[7],
            generated=r[8],
            inputs=tuple(r[9] or ()),
            labels=tuple(r[10] or ()),
        )
        for r in conn.execute(_COLUMNS, (oid,)).fetchall()
    )
    primary_key = tuple(
        r[0]
        for r in conn.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
            (oid,),
        ).fetchall()
    )
    configured = tuple(pipeline.key_columns.get(qualified, ()))
    wanted_identity = pipeline.replica_identity.get(qualified)
    if not primary_key and not configured:
        raise SourceError(
            f"table {qualified} has no primary key, so its changes cannot be keyed: add one "
            f"(ALTER TABLE {qualified} ADD PRIMARY KEY (...)), or set "
            f'pipeline.replica_identity."{qualified}" = "full" and '
            f'pipeline.key_columns."{qualified}" = [columns that identify a row]'
        )
    if configured:
        unknown = [c for c in configured if c not in {col.name for col in columns}]
        if unknown:
            raise SourceError(
                f"pipeline.key_columns for {qualified} names columns it does not have: "
                f"{', '.join(unknown)}"
            )
        if not primary_key and (wanted_identity or _IDENTITY[replident]) != "full":
            raise SourceError(
                f"table {qualified} has no primary key: keying it by {', '.join(configured)} "
                f'needs pipeline.replica_identity."{qualified}" = "full" so that updates and '
                "deletes carry those columns"
            )
    excluded, pending = _choose_columns(
        conn, oid, qualified, columns, configured or primary_key, pipeline, as_published
    )
    wanted_full = (wanted_identity or _IDENTITY[replident]) == "full"
    if excluded and wanted_full:
        raise SourceError(
            f'pipeline.table."{qualified}" leaves columns out, but the table\'s replica '
            "identity is full (every column), which a PostgreSQL 15 publication must "
            "carry whole: capture every column, or give the table a primary key and "
            "replica identity default"
        )
    columns = tuple(c for c in columns if c.name not in excluded)
    unstreamed = _unstreamed(qualified, columns, configured or primary_key)
    left_out = {name for name, _ in unstreamed}
    columns = tuple(c for c in columns if c.name not in left_out)
    choice = pipeline.table.get(qualified)
    if problem := reserved_problem([c.name for c in columns]):
        raise SourceError(f"table {qualified} cannot be captured: {problem}")
    generated_key = [
        c.name for c in columns if c.generated and c.name in (configured or primary_key)
    ]
    if generated_key:
        raise SourceError(
            f"table {qualified} is keyed by the generated column {generated_key[0]}, which "
            "PostgreSQL 15 does not publish, so its changes cannot be keyed: set "
            f'pipeline.key_columns."{qualified}" to other columns that identify a row (with '
            f'pipeline.replica_identity."{qualified}" = "full")'
        )
    return Table(
        schema=schema,
        name=name,
        columns=columns,
        key=configured or primary_key,
        replica_identity=replident,
        pages=max(int(pages), 0),
        estimated_rows=max(int(reltuples), 0),
        partitioned=relkind == "p",
        placeholder=pipeline_placeholder(conn, pipeline.name),
        excluded=excluded,
        row_filter=choice.where if choice else None,
        listed=bool(choice and (choice.columns is not None or choice.exclude_columns)),
        pending=pending,
        masks=_choose_masks(qualified, columns, configured or primary_key, choice),
        pipeline=pipeline.name,
        unstreamed=unstreamed,
    )


def _unstreamed(
    qualified: str, columns: tuple[Column, ...], key: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """The columns of `columns` Debezium's events do not carry (cdc.core.streamed_types),
    with their types, and the generated columns computed from one of them (the apply job
    computes a generated column from the event's values); a key column among them
    cannot be captured."""
    left = {
        c.name: type_name(c.base, c.is_array)
        for c in columns
        if not streamed(c.base, c.category, c.is_array)
    }
    for column in columns:
        inputs = [n for n in column.inputs if n in left]
        if column.generated and column.name not in left and inputs:
            left[column.name] = f"generated from {inputs[0]}"
    if lost := [n for n in key if n in left]:
        raise SourceError(
            f"table {qualified} is keyed by {lost[0]} ({left[lost[0]]}), a type Debezium "
            "does not stream, so its changes cannot be keyed: key it by other columns "
            f'(pipeline.key_columns."{qualified}", with replica identity full), or change '
            "the column's type"
        )
    return tuple((c.name, left[c.name]) for c in columns if c.name in left)


def unstreamed_note(table: Table) -> str | None:
    """One line on the table's columns that are not captured because Debezium does not
    stream their types, or None."""
    if not table.unstreamed:
        return None
    named = ", ".join(f"{name} ({why})" for name, why in table.unstreamed)
    return (
        f"{table.qualified}: not captured, as Debezium does not stream their types: {named}; "
        "to capture such a value, keep it in a column of a type it streams (text, jsonb), "
        f'or leave the column out (pipeline.table."{table.qualified}".exclude_columns) to '
        "quiet this"
    )


# the types whose change events carry the value's text, which a hash or a redacting
# text replaces (citext is an extension's, by name)
MASKABLE_TEXT = {"text", "varchar", "bpchar", "citext"}


def _choose_masks(
    qualified: str, columns: tuple[Column, ...], key: tuple[str, ...], choice: Any
) -> tuple[tuple[str, str, str | None], ...]:
    """pipeline.table's masks of the table, each checked against the captured columns."""
    if choice is None or not choice.mask:
        return ()
    setting = f'pipeline.table."{qualified}".mask'
    names = {c.name: c for c in columns}
    if unknown := [n for n in choice.mask if n not in names]:
        raise SourceError(
            f"{setting} names columns table {qualified} does not capture: {', '.join(unknown)}"
        )
    generated = [c for c in columns if c.generated]
    for name, mode in choice.mask.items():
        column = names[name]
        to_null = mode == "redact" and choice.redact_with is None
        if column.generated:
            why = "a generated column is computed by the apply job; leave it out instead"
        elif inputs := [g.name for g in generated if name in g.inputs]:
            why = f"the generated column {inputs[0]} is computed from it; leave that out too"
        elif mode == "redact" and name in key:
            why = "it is in the key, whose rows a constant would merge; hash it instead"
        elif mode == "hash" and name in key and generated:
            why = "the table has generated columns, read back by the key; do not hash the key"
        elif to_null and column.not_null:
            why = "it is NOT NULL; redact it with a text (redact_with), or leave it out"
        elif not to_null and (column.is_array or column.base not in MASKABLE_TEXT):
            why = (
                f"its type {column.type} is not text, which only a hash or a text replaces; "
                "redact it to NULL, or leave it out"
            )
        else:
            continue
        raise SourceError(f"{setting}.{name} = {mode!r} cannot be: {why}")
    return tuple(
        (name, mode, choice.redact_with if mode == "redact" else None)
        for name, mode in choice.mask.items()
    )


def _choose_columns(
    conn: psycopg.Connection[Any],
    oid: int,
    qualified: str,
    columns: tuple[Column, ...],
    key: tuple[str, ...],
    pipeline: PipelineSettings,
    as_published: bool,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns left out of the capture (pipeline.table's choice, and columns the
    publication does not name yet), and those of them the settings capture (pending)."""
    choice = pipeline.table.get(qualified)
    if choice is None or (choice.columns is None and not choice.exclude_columns):
        return (), ()
    setting = f'pipeline.table."{qualified}".' + (
        "columns" if choice.columns is not None else "exclude_columns"
    )
    names = [c.name for c in columns]
    given = choice.columns if choice.columns is not None else choice.exclude_columns
    unknown = [n for n in given if n not in names]
    if unknown:
        raise SourceError(
            f"{setting} names columns table {qualified} does not have: {', '.join(unknown)}"
        )
    keep = set(choice.columns) if choice.columns is not None else set(names) - set(given)
    excluded = [n for n in names if n not in keep]
    identity_index = [
        r[0]
        for r in conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s AND i.indisreplident",
            (oid,),
        ).fetchall()
    ]
    for needed, what in ((key, "the key"), (identity_index, "the replica identity index")):
        if lost := [n for n in needed if n in excluded]:
            raise SourceError(
                f"{setting} leaves out {', '.join(lost)}, which {what} of {qualified} "
                "holds: every change must carry it; capture it"
            )
    for column in columns:
        lost = [n for n in column.inputs if n in excluded]
        if column.generated and column.name in keep and lost:
            raise SourceError(
                f"{setting} leaves out {', '.join(lost)}, which the generated column "
                f"{column.name} of {qualified} is computed from: leave {column.name} "
                "out too, or capture them"
            )
    if commas := [n for n in excluded if "," in n]:
        raise SourceError(
            f"{setting} leaves out {commas[0]!r}, whose comma Debezium's column filter "
            "cannot hold: rename the column, or capture it"
        )
    pending: list[str] = []
    if as_published:
        row = conn.execute(
            "SELECT t.attnames FROM pg_publication_tables t WHERE t.pubname = %s "
            "AND t.schemaname = %s AND t.tablename = %s",
            (pipeline.publication, *qualified.split(".", 1)),
        ).fetchone()
        if row is not None and row[0] is not None:
            published = set(row[0])
            pending = [
                c.name
                for c in columns
                if c.name in keep and c.generated is None and c.name not in published
            ]
    return tuple(excluded + pending), tuple(pending)


PLACEHOLDERS_TABLE = "cdc.placeholders"


def pipeline_placeholder(conn: psycopg.Connection[Any], pipeline: str) -> str:
    """The text the pipeline's connector writes for an unchanged TOASTed value: a secret
    of its own (`cdc setup` makes it, cdc/core/identity.py), or Debezium's default for a
    pipeline set up before there was one (its topics hold that)."""
    found = conn.execute(  # a user who only reads the catalog (`cdc setup --sql`) may not
        "SELECT CASE WHEN to_regclass(%s) IS NULL THEN false "
        "ELSE has_table_privilege(%s, 'SELECT') END",
        (PLACEHOLDERS_TABLE, PLACEHOLDERS_TABLE),
    ).fetchone()
    if not found or not found[0]:
        return DEBEZIUM_PLACEHOLDER
    row = conn.execute(
        "SELECT placeholder FROM cdc.placeholders WHERE pipeline = %s", (pipeline,)
    ).fetchone()
    return str(row[0]) if row else DEBEZIUM_PLACEHOLDER


# a partitioned table: its partitions' figures (a CTID range reads each partition's pages)
_HEAD = """
SELECT c.oid, c.relreplident,
       CASE WHEN c.relkind = 'p' THEN (
           SELECT coalesce(max(l.relpages), 0) FROM pg_partition_tree(c.oid) t
           JOIN pg_class l ON l.oid = t.relid WHERE t.isleaf)
       ELSE c.relpages END,
       (CASE WHEN c.relkind = 'p' THEN (
           SELECT coalesce(sum(greatest(l.reltuples, 0)), 0) FROM pg_partition_tree(c.oid) t
           JOIN pg_class l ON l.oid = t.relid WHERE t.isleaf)
       ELSE c.reltuples END)::bigint,
       c.relkind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


_IDENTITY = {"d": "default", "f": "full", "i": "index", "n": "nothing"}

_COLUMNS = """
SELECT a.attname,
       format_type(a.atttypid, a.atttypmod),
       bt.typname,
       bt.typcategory,
       t.typcategory = 'A' OR (t.typtype = 'd' AND dt.typcategory = 'A'),
       CASE WHEN bt.typname IN ('timestamp', 'timestamptz', 'time', 'timetz', 'interval')
                 AND a.atttypmod >= 0
            THEN (CASE WHEN bt.typname = 'interval' THEN a.atttypmod & 65535 ELSE a.atttypmod END)
       END,
       a.attnotnull,
       a.atthasdef OR a.atthasmissing,
       CASE WHEN a.attgenerated = 's' THEN pg_get_expr(d.adbin, d.adrelid) END,
       CASE WHEN a.attgenerated = 's' THEN ARRAY(
           SELECT i.attname FROM pg_attribute i
           WHERE i.attrelid = a.attrelid AND i.attnum IN (
             SELECT p.refobjsubid FROM pg_depend p
             WHERE p.refobjid = a.attrelid AND p.refobjsubid NOT IN (0, a.attnum)
               -- the expression's (15+), or the column's own (14)
               AND ((p.classid = 'pg_attrdef'::regclass AND p.objid = d.oid)
                 OR (p.classid = 'pg_class'::regclass AND p.objid = a.attrelid
                     AND p.objsubid = a.attnum)))
           ORDER BY i.attnum) END,
       CASE WHEN bt.typtype = 'e' THEN ARRAY(
           SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = bt.oid
           ORDER BY e.enumsortorder) END
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type dt ON dt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype END
JOIN pg_type bt ON bt.oid = CASE
        WHEN t.typtype = 'd' AND dt.typelem <> 0 AND dt.typcategory = 'A' THEN dt.typelem
        WHEN t.typtype = 'd' THEN t.typbasetype
        WHEN t.typcategory = 'A' THEN t.typelem
        ELSE t.oid END
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def captured_table(settings: Settings, name: str) -> Table:
    """A table `settings`' pipeline captures, by `schema.table`, or by its bare name when
    that is unique; ConfigError, in one line, naming what is captured, otherwise."""
    with admin_connection(settings) as conn:
        names = published_tables(conn, settings.pipeline.publication)
        matches = [n for n in names if n == name or n.split(".", 1)[1] == name]
        if len(matches) != 1:
            what = "ambiguous" if matches else "not captured"
            raise ConfigError(
                f"table {name} is {what} in pipeline {settings.pipeline.name}; "
                f"captured: {', '.join(names) or 'none'}"
            )
        return describe_table(conn, matches[0], settings.pipeline)
