"""Generated columns, computed as the apply job reads the log.

PostgreSQL publishes no value for a `GENERATED ALWAYS AS (…) STORED` column (18 can,
but Debezium 3.6 drops generated columns from what it decodes: cdc/capture/source_setup.py),
so Debezium's events lack it (its backfills too: the connector's column filter makes them
select its schema's columns). The snapshot reads it like any other column. Every other
event whose `after` image lacks a generated column gets it here, before any store
sees the batch: PostgreSQL evaluates the column's expression (immutable, over the
row's own columns) on the event's values, handed back as input text
(cdc/types/postgres_text.py), and encodes the result as the log encodes the column's type
(cdc/capture/snapshot/events.py). So every store, the history included, holds the value the
source stored with that change.

One case cannot be computed from the event: an input that is an unchanged TOASTed
value (Debezium's placeholder). Then the generated values are read from the source's
row as it is now (a later state of the key, whose own events follow in the log), or
kept as stored when the row is gone. So is an expression that fails on the event's
values, or runs longer than EXPRESSION_TIMEOUT.

The expressions are the table owner's code: they run as no one. The job connects as
the replication role (never the administrator: the connection string travels to
Spark's Python workers), in a read-only transaction, and evaluates them through
cdc.capture.role.EXPRESSIONS_FUNCTION, which runs them as a role without privileges.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
from psycopg import sql

from cdc.capture.role import EXPRESSIONS_FUNCTION
from cdc.capture.source_setup import replication_dsn
from cdc.core.catalog import Column, Table
from cdc.core.errors import ConfigError, SourceUnavailableError, ValueDecodeError
from cdc.core.settings import Settings
from cdc.types.debezium_sql import column_json
from cdc.types.decode import is_unavailable, placeholder_forms
from cdc.types.postgres_text import postgres_text

__all__ = ["computing_generated", "expressions_connection", "expressions_dsn", "with_generated"]

log = logging.getLogger(__name__)

_OPS = ("c", "u", "r")
_PARAMS = 20000  # values per statement
EXPRESSION_TIMEOUT = "10s"  # per chunk of rows: longer, and the rows are read back
_EVALUATE = sql.SQL("SELECT n, v FROM {}(%s)").format(sql.Identifier(*EXPRESSIONS_FUNCTION))


def expressions_dsn(settings: Settings) -> str:
    """Where the expressions are evaluated: as the replication role (its password, never
    the administrator's, is what travels to the workers)."""
    return replication_dsn(settings)


def expressions_connection(dsn: str) -> psycopg.Connection[Any]:
    """A connection whose every transaction is read-only and every statement ends after
    EXPRESSION_TIMEOUT, set once rather than per chunk."""
    conn = psycopg.connect(
        dsn, autocommit=True, options=f"-c statement_timeout={EXPRESSION_TIMEOUT}"
    )
    conn.read_only = True  # its transactions begin READ ONLY
    return conn


def _read_only(conn: Any, query: sql.Composable, params: list[Any]) -> list[Any]:
    with conn.transaction():  # BEGIN READ ONLY (expressions_connection)
        return list(conn.execute(query, params).fetchall())


def _encoded(table: Table) -> sql.Composable:
    """'[<json of g1>,<json of g2>,…]' of the generated columns, named as the table names them."""
    parts = sql.SQL(" || ',' || ").join(column_json(c) for c in table.generated)
    return sql.SQL("'[' || {} || ']'").format(parts)


def _inputs(table: Table) -> list[Column]:
    names = {name for c in table.generated for name in c.inputs}
    return [c for c in table.columns if c.name in names]


def _unavailable(table: Table, inputs: list[Column], after: dict[str, Any]) -> set[str]:
    """The inputs the event does not carry: unchanged TOASTed values (or none at all)."""
    forms = placeholder_forms(table.placeholder)
    return {
        c.name for c in inputs if c.name not in after or is_unavailable(c, after[c.name], forms)
    }


def _input_text(column: Column, after: dict[str, Any], missing: set[str]) -> str | None:
    """An input's value as PostgreSQL's input text; one that is not what its column's
    encoding can be is added to `missing` (each store dead-letters the record for it)."""
    if column.name in missing:
        return None
    try:
        return postgres_text(column, after[column.name])
    except ValueDecodeError:
        missing.add(column.name)
        return None


def compute(conn: Any, table: Table, afters: list[dict[str, Any]]) -> None:
    """Add the table's generated columns to each `after` image, in place."""
    inputs = _inputs(table)
    names = [c.name for c in table.generated]
    rows = max(1, _PARAMS // (len(inputs) + 1))
    unknown: list[tuple[dict[str, Any], list[str]]] = []
    for start in range(0, len(afters), rows):
        chunk = afters[start : start + rows]
        missing: list[set[str]] = []
        rows_sql = []
        for number, after in enumerate(chunk):
            missing.append(_unavailable(table, inputs, after))
            texts = [_input_text(c, after, missing[-1]) for c in inputs]
            rows_sql.append(
                sql.SQL("({})").format(
                    sql.SQL(", ").join(
                        [
                            sql.SQL("{}::int").format(sql.Literal(number)),
                            *(
                                sql.SQL("{}::{}").format(sql.Literal(t), sql.SQL(c.type))
                                for t, c in zip(texts, inputs, strict=True)
                            ),
                        ]
                    )
                )
            )
        values = sql.SQL(", ").join(rows_sql)
        slots = [f"i{n}" for n in range(len(inputs))]
        # the expressions name the table's columns: innermost, each input under its name;
        # each result is cast to its column's type, as PostgreSQL stores it
        query = sql.SQL(
            "SELECT v.n, (SELECT {encoded} FROM (SELECT {exprs} FROM (SELECT {renamed}) AS t) AS t)"
            " FROM (VALUES {values}) AS v({header})"
        ).format(
            encoded=_encoded(table),
            exprs=sql.SQL(", ").join(
                sql.SQL("({})::{} AS {}").format(
                    sql.SQL(c.generated or "NULL"),
                    sql.SQL(c.type),
                    sql.Identifier(c.name),
                )
                for c in table.generated
            ),
            renamed=sql.SQL(", ").join(
                [
                    sql.SQL("{} AS {}").format(sql.Identifier("v", s), sql.Identifier(c.name))
                    for s, c in zip(slots, inputs, strict=True)
                ]
                or [sql.SQL("1 AS {}").format(sql.Identifier("__no_input"))]
            ),
            values=values,
            header=sql.SQL(", ").join(sql.Identifier(h) for h in ["n", *slots]),
        )
        text = query.as_string(None)  # the function takes one query text, values in it
        try:
            results = _read_only(conn, _EVALUATE, [text])
        except psycopg.errors.QueryCanceled as exc:  # longer than EXPRESSION_TIMEOUT
            log.warning("%s: generated columns read back: %s", table.qualified, _line(exc))
            unknown += [(after, names) for after in chunk]  # no row again: each would wait
            continue
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise  # PostgreSQL went away (computing_generated says so)
        except psycopg.Error as exc:
            if _unset(exc):
                raise ConfigError(
                    f"{'.'.join(EXPRESSIONS_FUNCTION)} is missing or not granted to the "
                    "replication role: run `cdc setup`"
                ) from None
            # an expression that fails on these values (e.g. NULL for a NOT NULL domain's
            # missing input: an integrity error; a division by zero: a data error; a
            # function that reads or writes a table: no privilege, a read-only transaction)
            if len(chunk) > 1:  # each row again: only the failing ones are read back
                for after in chunk:
                    compute(conn, table, [after])
                continue
            log.warning("%s: generated columns read back: %s", table.qualified, _line(exc))
            unknown += [(after, names) for after in chunk]
            continue
        for number, encoded in results:
            after, lacking = chunk[number], missing[number]
            later = []
            for column, value in zip(table.generated, orjson.loads(encoded), strict=True):
                if lacking.isdisjoint(column.inputs):
                    after[column.name] = value
                else:
                    later.append(column.name)
            if later:
                unknown.append((after, later))
    for after, later in unknown:
        _read_back(conn, table, after, names, later)


def _line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or ["failed"])[0]


def _unset(exc: psycopg.Error) -> bool:
    """Whether the evaluating function itself is missing or not granted (a pipeline set
    up before it existed), not something an expression calls."""
    if not isinstance(exc, psycopg.errors.UndefinedFunction | psycopg.errors.InsufficientPrivilege):
        return False
    text = str(exc)
    return f"function {EXPRESSIONS_FUNCTION[1]}" in text or (
        f"function {'.'.join(EXPRESSIONS_FUNCTION)}(" in text
    )


def _read_back(
    conn: Any, table: Table, after: dict[str, Any], names: list[str], wanted: list[str]
) -> None:
    """Generated values the event cannot give (an input is an unchanged TOASTed value):
    those of the source's row as it is now, or kept as stored when the row is gone."""
    key = [table.column(k) for k in table.key]
    query = sql.SQL("SELECT {} FROM {} WHERE ({}) = ({})").format(
        _encoded(table),
        sql.Identifier(table.schema, table.name),
        sql.SQL(", ").join(sql.Identifier(c.name) for c in key),
        sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(c.type)) for c in key),
    )
    found = _read_only(conn, query, [postgres_text(c, after.get(c.name)) for c in key])
    values = orjson.loads(found[0][0]) if found else [table.placeholder] * len(names)
    after.update((n, v) for n, v in zip(names, values, strict=True) if n in wanted)


def _missing(names: list[str], after: Any) -> bool:
    return isinstance(after, dict) and any(name not in after for name in names)


def computing_generated(
    dsn: str, by_topic: dict[str, Table]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function mapInArrow runs on each partition of a raw Kafka batch: values of
    `by_topic`'s change events that lack a generated column get it; every other record
    passes unchanged, in its order."""
    generated = {topic: [c.name for c in table.generated] for topic, table in by_topic.items()}

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        conn = None
        try:
            for batch in batches:
                topics = batch.column("topic").to_pylist()
                values = batch.column("value").to_pylist()
                found: dict[str, list[tuple[int, dict[str, Any]]]] = {}
                for i, (topic, value) in enumerate(zip(topics, values, strict=True)):
                    names = generated.get(topic)
                    if names is None or value is None:
                        continue
                    try:
                        envelope = orjson.loads(value)
                    except orjson.JSONDecodeError:
                        continue  # the writers dead-letter it
                    if (
                        isinstance(envelope, dict)
                        and envelope.get("op") in _OPS
                        and _missing(names, envelope.get("after"))
                    ):
                        found.setdefault(topic, []).append((i, envelope))
                if found:
                    try:
                        if conn is None:
                            conn = expressions_connection(dsn)
                        for topic, events in found.items():
                            compute(conn, by_topic[topic], [e["after"] for _, e in events])
                    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                        # the apply job waits for PostgreSQL and writes the batch again
                        why = str(exc).strip().splitlines()[0] if str(exc).strip() else "gone"
                        raise SourceUnavailableError(
                            f"PostgreSQL does not answer (generated columns): {why}"
                        ) from None
                    for events in found.values():
                        for i, envelope in events:
                            values[i] = orjson.dumps(envelope)
                    index = batch.schema.get_field_index("value")
                    batch = batch.set_column(
                        index, batch.schema.field(index), pa.array(values, pa.binary())
                    )
                yield batch
        finally:
            if conn is not None:
                conn.close()

    return run


def with_generated(
    batch: Any, settings: Settings, topics: dict[str, str], tables: dict[str, Table]
) -> Any:
    """The micro-batch with generated columns computed (unchanged when no captured table
    has one; only then is the expressions' DSN made: expressions_dsn)."""
    by_topic = {t: tables[n] for t, n in topics.items() if n in tables and tables[n].generated}
    if not by_topic:
        return batch
    return batch.mapInArrow(computing_generated(expressions_dsn(settings), by_topic), batch.schema)
