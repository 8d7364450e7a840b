"""Readers of the tests' own for the three stores (never the project's code): redis-py,
OpenSearch over HTTP, and Delta read with the Spark session open in the test process.
Each returns the live rows of a table, {key column's value: {column: value}}, without
the stores' metadata."""

from __future__ import annotations

import json
from typing import Any

import redis
import requests

from materializers.stores.warehouse.tables import current_path, warehouse_root

Rows = dict[Any, dict[str, Any]]


def cache(settings: Any, table: str, key: str = "id") -> Rows:
    client = redis.Redis.from_url(settings.redis.url, decode_responses=True)
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    rows = {}
    for name in client.scan_iter(match=prefix + "*"):
        entry = client.hgetall(name)
        if "_deleted" not in entry:  # a deleted row's marker
            rows[json.loads(name[len(prefix) :])[key]] = {
                c: v for c, v in entry.items() if not c.startswith("_")
            }
    return rows


def search(settings: Any, table: str, key: str = "id") -> Rows:
    index = f"{settings.pipeline.topic_prefix}.{table}".lower()
    url = settings.opensearch.url
    requests.post(f"{url}/{index}/_refresh", timeout=30).raise_for_status()
    hits = requests.post(f"{url}/{index}/_search", json={"size": 1000}, timeout=30).json()
    return {
        h["_source"][key]: {c: v for c, v in h["_source"].items() if not c.startswith("_")}
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
