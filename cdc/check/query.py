"""Reading the derived stores: Spark SQL over the store with the "sql" ability (the
warehouse), text search over the one with "search" (the index), and a row from any
store (the cache by default).

The SQL store registers its tables by name (the warehouse: `<table>` for its live rows,
`<table>_history` for its versions with `valid_from` and `valid_to`, each join view and
window aggregate by its name; a table name two schemas share as `<schema>_<table>`). A
name that is not a plain SQL identifier (a dot, a space) is queried in backquotes:
SELECT * FROM `we.ird`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cdc.core.catalog import Table
from cdc.core.errors import QueryError
from cdc.core.settings import Settings
from cdc.stores.base import SqlReader, StoreReader, TextSearcher
from cdc.stores.registry import make_reader, reach, reader_with
from cdc.types.store_forms import INTEGER_TYPES

__all__ = [
    "QueryResult",
    "key_json",
    "run_query",
    "search_table",
    "store_entry",
]


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def run_query(
    settings: Settings, sql: str, tables: list[str], as_of: str | None = None
) -> QueryResult:
    """Run Spark SQL over the SQL store's tables; `as_of` a version (digits) or a time."""
    from pyspark.errors import AnalysisException, ParseException

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "cdc-query")
    store = reader_with(settings, "sql", spark)
    assert isinstance(store, SqlReader)
    views = [v.name for v in [*settings.apply.joins, *settings.apply.windows]]
    names = store.register_for_sql(tables, views, as_of)
    try:
        result = spark.sql(sql)
        rows = [tuple(r) for r in result.collect()]
    except ParseException as exc:
        raise QueryError(f"the SQL does not parse: {_first_line(exc)}") from None
    except AnalysisException as exc:
        raise QueryError(_explain(exc, names, store.name)) from None
    return QueryResult(result.columns, rows)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s+", " ", text)[:300]


def _explain(exc: Any, names: dict[str, str], store: str) -> str:
    """One line for an analysis error: what is missing, and what there is."""
    condition = (exc.getCondition() or "") if hasattr(exc, "getCondition") else ""
    parameters = exc.getMessageParameters() or {}
    if condition.startswith("TABLE_OR_VIEW_NOT_FOUND"):
        wanted = parameters.get("relationName", "?").replace("`", "")
        return f"no table {wanted} in the {store}; tables: {', '.join(sorted(names)) or 'none'}"
    if condition.startswith("UNRESOLVED_COLUMN"):
        wanted = parameters.get("objectName", "?").replace("`", "")
        proposal = parameters.get("proposal", "").replace("`", "")
        hint = f"; did you mean one of {proposal}" if proposal else ""
        return f"no column {wanted}{hint}"
    return _first_line(exc)


def search_table(settings: Settings, table: Table, text: str, limit: int = 10) -> QueryResult:
    """Documents of `table` matching `text` (simple query string over every field)."""
    store = reader_with(settings, "text_search")
    assert isinstance(store, TextSearcher) and isinstance(store, StoreReader)
    try:
        reach(store)
        found = store.find(table, text, limit)
    finally:
        store.close()
    if found is None:
        raise QueryError(f"no {store.name} index for {table.qualified} yet: run `cdc apply`")
    columns = ["_score", *(c.name for c in table.columns)]
    rows = [
        (round(score, 3), *(document.get(c.name) for c in table.columns))
        for score, document in found
    ]
    return QueryResult(columns, rows)


def key_json(table: Table, key: str) -> str:
    """The key as the change events carry it (Debezium's compact JSON, key columns in
    order): from a JSON object, or from a bare value for a single-column key."""
    try:
        given = json.loads(key)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json parses
        given = key
    if not isinstance(given, dict):
        if len(table.key) != 1:
            raise QueryError(
                f"{table.qualified} has a composite key ({', '.join(table.key)}): give it as "
                "JSON, e.g. '{\"" + table.key[0] + "\": ...}'"
            )
        column = table.column(table.key[0])
        if column.base in INTEGER_TYPES:
            if not isinstance(given, int):
                raise QueryError(f"{column.name} of {table.qualified} is an integer, not {key!r}")
        else:  # text, uuid, numeric (carried as text) ...
            given = str(key)
        given = {table.key[0]: given}
    missing = [k for k in table.key if k not in given]
    if missing:
        raise QueryError(f"the key of {table.qualified} needs {', '.join(missing)}")
    return json.dumps({k: given[k] for k in table.key}, separators=(",", ":"), ensure_ascii=False)


def store_entry(settings: Settings, store: str, table: Table, key: str) -> dict[str, Any]:
    """What `store` holds for the row with `key` (its fields: the columns and the store's
    metadata)."""
    target = make_reader(settings, store)
    wanted = key_json(table, key)
    try:
        reach(target)
        entry = target.get(table, wanted)
    finally:
        target.close()
    if entry is None:
        raise QueryError(f"no {store} entry for {table.qualified} key {wanted}")
    if entry.deleted:
        raise QueryError(
            f"{table.qualified} key {wanted} was deleted; the {store} keeps its marker (with "
            "its position) to refuse a stale write"
        )
    return entry.fields
