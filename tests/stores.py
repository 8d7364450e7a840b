"""Readers of the tests' own for the three stores (never the project's code): redis-py,
OpenSearch over HTTP, and Delta read with the Spark session open in the test process.
Each returns the live rows of a table, {key column's value: {column: value}}, without
the stores' metadata."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import redis
import requests

from materializers.stores.warehouse.tables import current_path, warehouse_root

Rows = dict[Any, dict[str, Any]]


def redis_reader(settings: Any, **options: Any) -> redis.Redis:
    """A redis-py client of the tests' own, with the TLS and ACL user the settings name."""
    r = settings.redis
    return redis.Redis(
        host=r.host,
        port=r.port,
        username=r.username,
        password=r.password.get_secret_value() if r.password else None,
        ssl=r.tls,
        ssl_ca_certs=str(r.ca_file) if r.ca_file else None,
        decode_responses=True,
        **options,
    )


def cache(settings: Any, table: str, key: str = "id") -> Rows:
    client = redis_reader(settings)
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    rows = {}
    for name in client.scan_iter(match=prefix + "*"):
        entry = client.hgetall(name)
        if "_deleted" not in entry:  # a deleted row's marker
            rows[json.loads(name[len(prefix) :])[key]] = {
                c: v for c, v in entry.items() if not c.startswith("_")
            }
    return rows


def opensearch_http(settings: Any) -> dict[str, Any]:
    """requests arguments of the tests' own that reach OpenSearch as the settings say:
    basic auth, the server's certificate checked against their CA file."""
    o = settings.opensearch
    auth = (o.username, o.password.get_secret_value()) if o.password else None
    return {"auth": auth, "verify": str(o.ca_file) if o.ca_file else True}


def opensearch_reader(settings: Any, **options: Any) -> Any:
    """An opensearch-py client of the tests' own, with the TLS and user the settings name."""
    from opensearchpy import OpenSearch

    o = settings.opensearch
    http = opensearch_http(settings)
    return OpenSearch(
        hosts=[o.url],
        use_ssl=o.tls,
        verify_certs=o.tls,
        ca_certs=str(o.ca_file) if o.ca_file else None,
        http_auth=http["auth"],
        **options,
    )


def search(settings: Any, table: str, key: str = "id") -> Rows:
    index = f"{settings.pipeline.topic_prefix}.{table}".lower()
    url, http = settings.opensearch.url, opensearch_http(settings)
    requests.post(f"{url}/{index}/_refresh", timeout=30, **http).raise_for_status()
    hits = requests.post(f"{url}/{index}/_search", json={"size": 1000}, timeout=30, **http).json()
    return {
        h["_source"][key]: {c: v for c, v in h["_source"].items() if not c.startswith("_cdc_")}
        for h in hits["hits"]["hits"]
    }


def warehouse(settings: Any, table: str, key: str = "id") -> Rows:
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None  # the apply job's session, still open in this process
    frame = spark.read.format("delta").load(current_path(warehouse_root(settings), table))
    return {
        r[key]: {c: v for c, v in r.asDict().items() if not c.startswith("_cdc_")}
        for r in frame.where("NOT _cdc_deleted").collect()
    }


def stores(settings: Any, table: str, key: str = "id") -> dict[str, Rows]:
    return {
        "cache": cache(settings, table, key),
        "search": search(settings, table, key),
        "warehouse": warehouse(settings, table, key),
    }


def delta_tables(root: str) -> list[Path]:
    """Every Delta table under a warehouse folder (current state, history, views)."""
    return sorted(log.parent for log in Path(root).rglob("_delta_log") if log.is_dir())


def column_mapped(path: Path) -> bool:
    """Whether the table's newest metadata in its log turns on Delta's column mapping."""
    mode = "none"
    for log in sorted((path / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            meta = json.loads(line).get("metaData")
            if meta:
                mode = meta.get("configuration", {}).get("delta.columnMapping.mode", "none")
    return mode != "none"


def delta_rs_read(path: Path) -> Any:
    """The Delta table as delta-rs reads it (the `deltalake` package, what Polars uses)."""
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_table()


def iceberg_read(base: str, path: Path) -> Any:
    """The Iceberg table published for the Delta table at `path` (apply.iceberg), as
    PyIceberg reads it from the warehouse's SQL catalog (docs/stores.md, "Reading the
    warehouse"): named by its folders under the warehouse folder `base`."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("cdc", uri=f"sqlite:///{Path(base) / '_iceberg_catalog.db'}")
    name = tuple(path.resolve().relative_to(Path(base).resolve()).parts)
    return catalog.load_table(name).scan().to_arrow()


def readers_differ(spark: Any, path: Path, theirs: Any = None) -> list[str]:
    """How another reader's read of a Delta table (`theirs`, an Arrow table; default:
    delta-rs's) differs from Spark's: column names, then rows (each row's values as
    Python objects, timestamps compared as instants). Empty: the same table."""
    theirs = delta_rs_read(path) if theirs is None else theirs
    ours = spark.read.format("delta").load(str(path)).toArrow()
    if theirs.column_names != ours.column_names:
        return [f"{path}: columns {theirs.column_names} ≠ Spark's {ours.column_names}"]

    def plain(value: Any) -> Any:
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            return value.astimezone(dt.UTC).isoformat()
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    def rows(table: Any) -> list[str]:
        return sorted(repr(sorted(plain(row).items())) for row in table.to_pylist())

    mine, spark_rows = rows(theirs), rows(ours)
    if mine == spark_rows:
        return []
    only = [r for r in mine if r not in spark_rows][:2]
    return [f"{path}: {len(mine)} rows ≠ Spark's {len(spark_rows)}; e.g. {only}"]
