"""Readers of the tests' own for the three stores (never the project's code): redis-py,
OpenSearch's client, and Delta read with Spark; the one place tests read a store
where the store is what is under test (checks of something else use the product's own
`StoreReader.rows`).

Each store has one raw reader (`cache_hashes`, `search_documents`, `warehouse_frame`),
and the shapes tests compare are made from it: `cache`, `search`, `warehouse` (the live
rows of a table, {key column's value: {column: value}}, without the stores' metadata),
`cache_contents`, `search_contents` (by the key's text or the document id)."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import redis

from cdc.stores.warehouse.tables import current_path, warehouse_root

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


def cache_hashes(settings: Any, table: str) -> dict[str, dict[str, str]]:
    """Every live hash the cache holds of `table` (a deleted row's marker left out), by
    its key's text (the key columns as JSON), with every field."""
    client = redis_reader(settings, socket_timeout=30)
    prefix = f"{settings.pipeline.topic_prefix}:{table}:"
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"  # the name's own glob characters
    hashes: dict[str, dict[str, str]] = {}
    for name in client.scan_iter(match=pattern, count=1000):
        entry: dict[str, str] = client.hgetall(name)  # type: ignore[assignment]
        if "_deleted" not in entry:
            hashes[name[len(prefix) :]] = entry
    return hashes


def cache_contents(settings: Any, table: str) -> dict[str, dict[str, str]]:
    """The cache's live rows by their key's text, without the cache's own fields."""
    return {
        k: {c: v for c, v in entry.items() if not c.startswith("_")}
        for k, entry in cache_hashes(settings, table).items()
    }


def cache(settings: Any, table: str, key: str = "id") -> Rows:
    return {
        json.loads(k)[key]: {c: v for c, v in entry.items() if not c.startswith("_")}
        for k, entry in cache_hashes(settings, table).items()
    }


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


def index_name(settings: Any, table: str) -> str:
    """Debezium's topic name (characters other than [A-Za-z0-9._-] become _), lower case."""
    topic = f"{settings.pipeline.topic_prefix}.{table}"
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in topic)[
        :249
    ].lower()


def search_documents(settings: Any, table: str) -> dict[str, dict[str, Any]]:
    """Every document of the table's index (all of them: a scroll), by its id, once the
    index is refreshed."""
    from opensearchpy import helpers

    client = opensearch_reader(settings, timeout=30)
    index = index_name(settings, table)
    client.indices.refresh(index=index)
    return {
        hit["_id"]: hit["_source"]
        for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}})
    }


def search_contents(settings: Any, table: str) -> dict[str, dict[str, Any]]:
    """The index's documents by id, without the pipeline's own fields."""
    return {
        i: {c: v for c, v in source.items() if not c.startswith("_cdc")}
        for i, source in search_documents(settings, table).items()
    }


def search(settings: Any, table: str, key: str = "id") -> Rows:
    return {
        source[key]: {c: v for c, v in source.items() if not c.startswith("_cdc_")}
        for source in search_documents(settings, table).values()
    }


def warehouse_frame(settings: Any, table: str, history: bool = False) -> Any:
    """The table's current state (its live rows) or its history (as written: versions
    and TRUNCATE rows, no ends), as a DataFrame of the Spark session open in this
    process (or one of the tests' own)."""
    from pyspark.sql import SparkSession

    from cdc.stores.warehouse.tables import history_path

    spark = SparkSession.getActiveSession()
    if spark is None:
        from cdc.core.spark import spark_session

        spark = spark_session(settings, "test")
    where = history_path if history else current_path
    return spark.read.format("delta").load(where(warehouse_root(settings), table))


def history_rows(settings: Any, table: str) -> Any:
    """The table's history as written (versions and TRUNCATE rows) as a DataFrame."""
    return warehouse_frame(settings, table, history=True)


def with_ends(rows: list[dict[str, Any]], key: list[str]) -> list[dict[str, Any]]:
    """The history's rows as written (dicts with `_cdc_op`, `_cdc_commit_lsn`, `_cdc_lsn`,
    `_cdc_commit_ts`) as versions with `valid_from` and `valid_to`, computed here, apart
    from the product: a version begins at its commit time, or at the earliest commit
    time of a version after it, or at the first TRUNCATE after it, whichever is
    earliest; it ends where the next version of its key begins, or at that TRUNCATE.
    Sorted by key, then position; the TRUNCATE rows left out."""

    def at(row: dict[str, Any]) -> tuple[int, int]:
        return (row["_cdc_commit_lsn"], row["_cdc_lsn"])

    cuts = sorted((at(r), r["_cdc_commit_ts"]) for r in rows if r["_cdc_op"] == "t")
    chains: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        if row["_cdc_op"] != "t":
            chains.setdefault(tuple(row[k] for k in key), []).append(dict(row))
    versions = []
    for name in sorted(chains, key=repr):
        chain = sorted(chains[name], key=at)
        for row in chain:
            row["_cap"] = next((ts for cut, ts in cuts if cut > at(row)), None)
        earliest = None
        for row in reversed(chain):
            earliest = (
                row["_cdc_commit_ts"] if earliest is None else min(earliest, row["_cdc_commit_ts"])
            )
            row["valid_from"] = min(t for t in (earliest, row["_cap"]) if t is not None)
        for row, following in zip(chain, [*chain[1:], None], strict=True):
            after = following["valid_from"] if following is not None else None
            ends = [t for t in (after, row["_cap"]) if t is not None]
            row["valid_to"] = min(ends) if ends else None
            del row["_cap"]
            versions.append(row)
    return versions


def history_with_ends(settings: Any, table: str, key: tuple[str, ...] = ("id",)) -> Any:
    """The table's history as versions with `valid_from` and `valid_to` as `with_ends`
    computes them (never the product's reading of the history), as a DataFrame: the
    columns as written, then those two; the TRUNCATE rows left out."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    raw = history_rows(settings, table)
    versions = with_ends([r.asDict() for r in raw.collect()], list(key))
    schema = StructType(
        [
            *raw.schema.fields,
            StructField("valid_from", TimestampType()),
            StructField("valid_to", TimestampType()),
        ]
    )
    names = schema.fieldNames()
    return raw.sparkSession.createDataFrame([tuple(v[n] for n in names) for v in versions], schema)


def open_and_live(settings: Any, table: str, columns: list[str]) -> tuple[list[Any], list[Any]]:
    """The open versions that are not deletes (their ends as `with_ends` computes them),
    and the current state's rows: each as sorted tuples of `columns` and the position.
    Each live row is its key's one open version when the two are equal."""
    named = [*columns, "_cdc_commit_lsn", "_cdc_lsn"]
    opened = history_with_ends(settings, table).where("valid_to IS NULL AND _cdc_op <> 'd'")
    return (
        sorted(tuple(r[c] for c in named) for r in opened.collect()),
        sorted(tuple(r[c] for c in named) for r in warehouse_frame(settings, table).collect()),
    )


def warehouse(settings: Any, table: str, key: str = "id") -> Rows:
    return {
        r[key]: {c: v for c, v in r.asDict().items() if not c.startswith("_cdc_")}
        for r in warehouse_frame(settings, table).collect()
    }


def warehouse_rows(settings: Any, table: str, columns: list[str]) -> dict[Any, tuple[Any, ...]]:
    """The live rows' `columns`, by id."""
    frame = warehouse_frame(settings, table)
    return {r["id"]: tuple(r[c] for c in columns) for r in frame.collect()}


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


def engines(path: str) -> list[str]:
    """What wrote each Delta commit, oldest first: "spark" or "delta-rs"."""
    found = []
    for log in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                rust = str(info.get("clientVersion", "")).startswith("delta-rs")
                found.append("delta-rs" if rust else "spark")
    return found
