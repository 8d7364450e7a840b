"""Reading the derived stores: Spark SQL over the warehouse, text search over the index,
and a row from the cache.

Warehouse tables are registered for SQL by name: `<table>` (live rows of the current
state, without the deleted markers), `<table>_history`, and each join view and window
aggregate by its name. A table name that two schemas share is registered as
`<schema>_<table>` instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cdc.catalog import Table
from cdc.clients import opensearch_client, redis_client
from cdc.errors import QueryError
from cdc.settings import JoinView, Settings, WindowAggregate

__all__ = [
    "QueryResult",
    "cache_entry",
    "key_json",
    "run_query",
    "search_table",
    "warehouse_names",
]


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def warehouse_names(settings: Settings, tables: list[str]) -> dict[str, str]:
    """SQL name -> Delta path, for the tables and views the warehouse holds now."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.delta_tables import current_path, history_path, warehouse_root
    from materializers.views import view_path

    spark = spark_session(settings, "cdc-query")
    root = warehouse_root(settings)
    short = [t.split(".", 1)[1] for t in tables]
    names: dict[str, str] = {}
    for qualified in tables:
        schema, table = qualified.split(".", 1)
        name = table if short.count(table) == 1 else f"{schema}_{table}"
        names[name] = current_path(root, qualified)
        names[f"{name}_history"] = history_path(root, qualified)
    views: list[JoinView | WindowAggregate] = [*settings.apply.joins, *settings.apply.windows]
    for view in views:
        names[view.name] = view_path(root, view.name)
    return {n: p for n, p in names.items() if DeltaTable.isDeltaTable(spark, p)}


def run_query(
    settings: Settings, sql: str, tables: list[str], as_of: str | None = None
) -> QueryResult:
    """Run Spark SQL over the warehouse; `as_of` a Delta version (digits) or a timestamp."""
    from pyspark.errors import AnalysisException, ParseException

    from cdc.spark import spark_session

    spark = spark_session(settings, "cdc-query")
    names = warehouse_names(settings, tables)
    views: list[JoinView | WindowAggregate] = [*settings.apply.joins, *settings.apply.windows]
    current = {n for n in names if not n.endswith("_history")} - {v.name for v in views}
    for name, path in names.items():
        reader = spark.read.format("delta")
        if as_of is not None:
            option = "versionAsOf" if as_of.isdigit() else "timestampAsOf"
            reader = reader.option(option, as_of)
        try:
            frame = reader.load(path)
        except Exception as exc:  # a version or time the table does not have
            raise QueryError(f"{name} has no state as of {as_of}: {_first_line(exc)}") from None
        if name in current:
            frame = frame.where("NOT _cdc_deleted").drop("_cdc_deleted")
        frame.createOrReplaceTempView(name)
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
    from opensearchpy.exceptions import ConnectionError as OsConnectionError

    from materializers.stores.search import index_name

    client = opensearch_client(settings.opensearch.url, 30)
    index = index_name(settings.pipeline.topic_prefix, table.qualified)
    try:
        if not client.indices.exists(index=index):
            raise QueryError(f"no search index for {table.qualified} yet ({index}): run cdc apply")
        found = client.search(
            index=index,
            body={
                "query": {"simple_query_string": {"query": text, "lenient": True}},
                "size": limit,
            },
        )
    except OsConnectionError:
        raise QueryError(
            f"OpenSearch at {settings.opensearch.url} does not answer; start it (`cdc up`)"
        ) from None
    columns = ["_score", *(c.name for c in table.columns)]
    rows = [
        (round(hit["_score"], 3), *(hit["_source"].get(c.name) for c in table.columns))
        for hit in found["hits"]["hits"]
    ]
    return QueryResult(columns, rows)


def key_json(table: Table, key: str) -> str:
    """The key as the change events carry it (Debezium's compact JSON, key columns in
    order): from a JSON object, or from a bare value for a single-column key."""
    try:
        given = json.loads(key)
    except ValueError:
        given = key
    if not isinstance(given, dict):
        if len(table.key) != 1:
            raise QueryError(
                f"{table.qualified} has a composite key ({', '.join(table.key)}): give it as "
                "JSON, e.g. '{\"" + table.key[0] + "\": ...}'"
            )
        column = table.column(table.key[0])
        if column.base in ("int2", "int4", "int8"):
            if not isinstance(given, int):
                raise QueryError(f"{column.name} of {table.qualified} is an integer, not {key!r}")
        else:  # text, uuid, numeric (carried as text) ...
            given = str(key)
        given = {table.key[0]: given}
    missing = [k for k in table.key if k not in given]
    if missing:
        raise QueryError(f"the key of {table.qualified} needs {', '.join(missing)}")
    return json.dumps({k: given[k] for k in table.key}, separators=(",", ":"), ensure_ascii=False)


def cache_entry(settings: Settings, table: Table, key: str) -> dict[str, str]:
    """The cache's hash for the row with `key` (its fields as text)."""
    import redis

    from materializers.stores.cache import cache_key

    name = cache_key(settings.pipeline.topic_prefix, table.qualified, key_json(table, key))
    try:
        entry = redis_client(settings.redis).hgetall(name)
    except redis.ConnectionError:
        raise QueryError(
            f"Redis at {settings.redis.host}:{settings.redis.port} does not answer; "
            "start it (`cdc up`)"
        ) from None
    found = {k.decode(): v.decode() for k, v in entry.items()}
    if not found:
        raise QueryError(f"no cache entry for {table.qualified} key {key_json(table, key)}")
    if "_deleted" in found:
        raise QueryError(
            f"{table.qualified} key {key_json(table, key)} was deleted (at offset "
            f"{found.get('_offset')}); the cache keeps the marker for a while"
        )
    return found
