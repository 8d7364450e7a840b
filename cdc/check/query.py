"""Reading the derived stores: Spark SQL over the warehouse, text search over the index,
and a row from any store (the cache by default).

Warehouse tables are registered for SQL by name: `<table>` (its live rows),
`<table>_history` (its versions, each with the `valid_from` and `valid_to` derived as
it is read: cdc/stores/warehouse/history.py), and each join view and window
aggregate by its name. A table name that two schemas share is registered as
`<schema>_<table>` instead. A name that is not a plain SQL identifier (a dot, a space)
is queried in backquotes: SELECT * FROM `we.ird`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cdc.core.catalog import Table
from cdc.core.errors import QueryError, StoreUnavailableError
from cdc.core.settings import Settings
from cdc.stores.base import StoreReader
from cdc.stores.registry import make_reader
from cdc.stores.warehouse.history import derived_history, history_key
from cdc.types.store_forms import INTEGER_TYPES

__all__ = [
    "QueryResult",
    "key_json",
    "run_query",
    "search_table",
    "store_entry",
    "warehouse_names",
]


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def warehouse_names(settings: Settings, tables: list[str]) -> dict[str, str]:
    """SQL name -> Delta path, for the tables and views the warehouse holds now."""
    from delta.tables import DeltaTable

    from cdc.core.spark import spark_session
    from cdc.stores.warehouse.tables import (
        current_path,
        history_path,
        view_path,
        warehouse_root,
    )

    spark = spark_session(settings, "cdc-query")
    root = warehouse_root(settings)
    short = [t.split(".", 1)[1] for t in tables]
    names: dict[str, str] = {}
    for qualified in tables:
        schema, table = qualified.split(".", 1)
        name = table if short.count(table) == 1 else f"{schema}_{table}"
        names[name] = current_path(root, qualified)
        names[f"{name}_history"] = history_path(root, qualified)
    for view in [*settings.apply.joins, *settings.apply.windows]:
        names[view.name] = view_path(root, view.name)
    return {n: p for n, p in names.items() if DeltaTable.isDeltaTable(spark, p)}


def run_query(
    settings: Settings, sql: str, tables: list[str], as_of: str | None = None
) -> QueryResult:
    """Run Spark SQL over the warehouse; `as_of` a Delta version (digits) or a timestamp."""
    from pyspark.errors import AnalysisException, ParseException

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "cdc-query")
    names = warehouse_names(settings, tables)
    for name, path in names.items():
        reader = spark.read.format("delta")
        if as_of is not None:
            option = "versionAsOf" if as_of.isdigit() else "timestampAsOf"
            reader = reader.option(option, as_of)
        try:
            frame = reader.load(path)
        except Exception as exc:  # a version or time the table does not have
            raise QueryError(f"{name} has no state as of {as_of}: {_first_line(exc)}") from None
        if name.endswith("_history") and path.endswith("/history"):
            # versions with their ends, derived as they are read
            key = history_key(spark, path)
            if not key:
                raise QueryError(
                    f"{name} is of the warehouse's earlier layout: run "
                    "`cdc rebuild --store warehouse`"
                )
            frame = derived_history(spark, frame, key)
        # one identifier, whatever it holds: a table named `we.ird` is not two parts
        frame.createOrReplaceTempView("`" + name.replace("`", "``") + "`")
    try:
        result = spark.sql(sql)
        rows = [tuple(r) for r in result.collect()]
    except ParseException as exc:
        raise QueryError(f"the SQL does not parse: {_first_line(exc)}") from None
    except AnalysisException as exc:
        raise QueryError(_explain(exc, names, spark)) from None
    return QueryResult(result.columns, rows)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s+", " ", text)[:300]


def _explain(exc: Any, names: dict[str, str], spark: Any) -> str:
    """One line for an analysis error: what is missing, and what there is."""
    condition = (exc.getCondition() or "") if hasattr(exc, "getCondition") else ""
    parameters = exc.getMessageParameters() or {}
    if condition.startswith("TABLE_OR_VIEW_NOT_FOUND"):
        wanted = parameters.get("relationName", "?").replace("`", "")
        return f"no table {wanted} in the warehouse; tables: {', '.join(sorted(names)) or 'none'}"
    if condition.startswith("UNRESOLVED_COLUMN"):
        wanted = parameters.get("objectName", "?").replace("`", "")
        proposal = parameters.get("proposal", "").replace("`", "")
        hint = f"; did you mean one of {proposal}" if proposal else ""
        return f"no column {wanted}{hint}"
    return _first_line(exc)


def search_table(settings: Settings, table: Table, text: str, limit: int = 10) -> QueryResult:
    """Documents of `table` matching `text` (simple query string over every field)."""
    from cdc.stores.search.store import SearchStore

    store = make_reader(settings, "search")
    assert isinstance(store, SearchStore)
    try:
        _reach(store)
        found = store.find(table, text, limit)
    finally:
        store.close()
    if found is None:
        raise QueryError(f"no search index for {table.qualified} yet: run `cdc apply`")
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


def _reach(store: StoreReader) -> None:
    try:
        store.ping()
    except StoreUnavailableError as exc:
        raise StoreUnavailableError(f"{exc}: start it (`cdc up`) or check its settings") from None


def store_entry(settings: Settings, store: str, table: Table, key: str) -> dict[str, Any]:
    """What `store` holds for the row with `key` (its fields: the columns and the store's
    metadata)."""
    target = make_reader(settings, store)
    wanted = key_json(table, key)
    try:
        _reach(target)
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
