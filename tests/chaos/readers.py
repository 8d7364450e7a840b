"""Readers of the harness's own: each store read with its plain client, never with the
project's code, and brought to one form: {key: (column values...)}.

    PostgreSQL  psycopg
    Redis       redis-py: hash `<prefix>:<schema.table>:<key JSON>`, a field per non-NULL
                column (text), `_`-prefixed metadata; a deleted marker has `_deleted`
    OpenSearch  requests: index `<prefix>.<schema>.<table>` (lower case), `_id` = key JSON
    Delta       a Spark session of the harness's own: `<warehouse>/<schema>/<table>/current`
                (live rows) and `.../history` (versions as written; their ends computed
                here: tests/stores.py, with_ends)
    dead letters  kafka-python: the topic `<prefix>.dlq`
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import redis
import requests
from kafka import KafkaConsumer, TopicPartition

from cdc.core.clients import kafka_client_kwargs
from cdc.core.settings import Settings
from cdc.core.settings.connections import KafkaSettings
from tests.stores import with_ends

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "TABLES",
    "Current",
    "DeadLetters",
    "Rows",
    "TableSpec",
    "Version",
    "WarehouseReader",
    "cache_rows",
    "dead_letters",
    "search_rows",
    "source_rows",
]

Rows = dict[int, tuple[Any, ...]]


@dataclass(frozen=True)
class TableSpec:
    """A table of the bank: its integer key and its other columns, each int or text."""

    schema: str
    name: str
    key: str
    columns: tuple[tuple[str, type], ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def names(self) -> list[str]:
        return [c for c, _ in self.columns]

    def row(self, values: dict[str, Any]) -> tuple[Any, ...]:
        """Values as the source types them (a store's text or JSON number made int)."""
        return tuple(None if values.get(c) is None else kind(values[c]) for c, kind in self.columns)


TABLES = (
    TableSpec("public", "accounts", "aid", (("balance", int), ("transfers", int), ("note", str))),
    TableSpec(
        "public", "transfers", "tid", (("src", int), ("dst", int), ("amount", int), ("note", str))
    ),
    TableSpec("public", "shelf_a", "sid", (("qty", int), ("note", str))),
    TableSpec("public", "shelf_b", "sid", (("qty", int), ("note", str))),
    TableSpec("public", "events", "eid", (("kind", int), ("note", str))),
)


def source_rows(dsn: str, spec: TableSpec) -> Rows:
    columns = ", ".join([spec.key, *spec.names])
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        rows = conn.execute(f"SELECT {columns} FROM {spec.qualified}").fetchall()
    return {int(r[0]): tuple(r[1:]) for r in rows}


def cache_rows(url: str, prefix: str, spec: TableSpec) -> Rows:
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=20)
    head = f"{prefix}:{spec.qualified}:"
    rows: Rows = {}
    try:
        keys = list(client.scan_iter(match=head + "*", count=5000))
        for start in range(0, len(keys), 2000):
            chunk = keys[start : start + 2000]
            pipe = client.pipeline(transaction=False)
            for key in chunk:
                pipe.hgetall(key)
            for key, entry in zip(chunk, pipe.execute(), strict=True):
                if not entry or "_deleted" in entry:
                    continue
                rows[int(json.loads(key[len(head) :])[spec.key])] = spec.row(entry)
    finally:
        client.close()
    return rows


def search_rows(url: str, prefix: str, spec: TableSpec, **auth: Any) -> Rows:
    """`auth`: requests' auth and verify (tests.stores.opensearch_http)."""
    index = f"{prefix}.{spec.qualified}".lower()
    rows: Rows = {}
    with requests.Session() as http:
        http.auth, http.verify = auth.get("auth"), auth.get("verify", True)
        http.post(f"{url}/{index}/_refresh", timeout=60).raise_for_status()
        response = http.post(
            f"{url}/{index}/_search",
            params={"scroll": "2m"},
            json={"size": 5000, "sort": ["_doc"]},
            timeout=120,
        )
        response.raise_for_status()
        page = response.json()
        scroll_id = page.get("_scroll_id")
        try:
            while page["hits"]["hits"]:
                for hit in page["hits"]["hits"]:
                    rows[int(json.loads(hit["_id"])[spec.key])] = spec.row(hit["_source"])
                response = http.post(
                    f"{url}/_search/scroll",
                    json={"scroll": "2m", "scroll_id": scroll_id},
                    timeout=120,
                )
                response.raise_for_status()
                page = response.json()
                scroll_id = page.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                http.delete(f"{url}/_search/scroll", json={"scroll_id": scroll_id}, timeout=30)
    return rows


@dataclass
class DeadLetters:
    count: int
    kinds: dict[str, int]  # "store: error" (first line, shortened) -> how many
    examples: list[dict[str, Any]]


def dead_letters(kafka: KafkaSettings, topic: str, read_at_most: int = 2000) -> DeadLetters:
    consumer = KafkaConsumer(
        **kafka_client_kwargs(kafka), enable_auto_commit=False, consumer_timeout_ms=5000
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        if not partitions:
            return DeadLetters(0, {}, [])
        starts = consumer.beginning_offsets(partitions)
        ends = consumer.end_offsets(partitions)
        count = sum(ends[p] - starts[p] for p in partitions)
        kinds: Counter[str] = Counter()
        examples: list[dict[str, Any]] = []
        if count:
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            for n, message in enumerate(consumer):
                try:
                    letter = json.loads(message.value)
                except (TypeError, ValueError):
                    letter = {"store": "?", "error": repr(message.value)[:200]}
                error = str(letter.get("error", "")).splitlines()[0][:160] if letter else ""
                kinds[f"{letter.get('store', '?')}: {error}"] += 1
                if len(examples) < 5:
                    examples.append({k: letter.get(k) for k in ("store", "error", "topic", "key")})
                if n + 1 >= min(count, read_at_most):
                    break
        return DeadLetters(count, dict(kinds), examples)
    finally:
        consumer.close()


# --- Delta, with a Spark session of the harness's own --------------------------------

_VERSIONED = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def _artifact(jar: Path) -> str:
    match = _VERSIONED.match(jar.name)
    return match.group("name") if match else jar.stem


def _jars(settings: Settings) -> list[Path]:
    """The installed jars (Kafka source, Delta, JDBC), minus libraries pyspark ships."""
    import pyspark

    shipped = {_artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    jars = sorted((settings.jvm_dir / "spark" / "jars").glob("*.jar"))
    return [j for j in jars if _artifact(j) not in shipped]


def chaos_spark(settings: Settings) -> SparkSession:
    os.environ.setdefault("JAVA_HOME", str(settings.java_home))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    local_dir = settings.data_dir / "chaos-spark"
    local_dir.mkdir(parents=True, exist_ok=True)
    spark = (
        SparkSession.builder.appName("cdc-chaos-readers")
        .master("local[2]")
        .config("spark.jars", ",".join(str(j) for j in _jars(settings)))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(local_dir))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass(frozen=True)
class Version:
    """One row of a table's history: a version of a key."""

    key: int
    op: str
    position: tuple[int | None, ...]
    valid_from: Any
    valid_to: Any
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Current:
    """One row of a table's current state (a live row)."""

    position: tuple[int | None, ...]
    values: tuple[Any, ...]


class WarehouseReader:
    """The Delta tables as Spark reads them (the latest committed version each time)."""

    def __init__(self, settings: Settings) -> None:
        base = Path(settings.store_section("warehouse").path or settings.data_dir / "warehouse")
        self.root = base / settings.pipeline.topic_prefix
        self.spark = chaos_spark(settings)

    def close(self) -> None:
        self.spark.stop()

    def _path(self, spec: TableSpec, part: str) -> Path:
        return self.root / spec.schema / spec.name / part

    def _frame(self, spec: TableSpec, part: str) -> DataFrame:
        return self.spark.read.format("delta").load(str(self._path(spec, part)))

    def stamp(self) -> tuple[str, ...]:
        """The newest commit of each table's current state: nothing new to read if unchanged."""
        newest = []
        for spec in TABLES:
            commits = sorted(self._path(spec, "current").glob("_delta_log/*.json"))
            newest.append(commits[-1].name if commits else "")
        return tuple(newest)

    @staticmethod
    def position_columns(columns: list[str]) -> list[str]:
        """What places a row in the source: its commit LSN and LSN (the layout before those
        columns existed had the Kafka partition and offset)."""
        if "_cdc_commit_lsn" in columns:
            return ["_cdc_commit_lsn", "_cdc_lsn"]
        return ["_cdc_partition", "_cdc_offset"]

    def current(self, spec: TableSpec) -> dict[int, Current]:
        frame = self._frame(spec, "current")
        position = self.position_columns(frame.columns)
        rows = frame.select(spec.key, *position, *spec.names).collect()
        width = len(position)
        return {int(r[0]): Current(tuple(r[1 : 1 + width]), spec.row(r.asDict())) for r in rows}

    def rows(self, spec: TableSpec) -> Rows:
        return {k: c.values for k, c in self.current(spec).items()}

    def history(self, spec: TableSpec) -> tuple[list[str], list[Version]]:
        """Every version, its ends computed here (tests/stores.py, with_ends)."""
        frame = self._frame(spec, "history")
        position = ["_cdc_commit_lsn", "_cdc_lsn"]
        raw = frame.select(spec.key, "_cdc_op", "_cdc_commit_ts", *position, *spec.names)
        versions = [
            Version(
                int(v[spec.key]),
                str(v["_cdc_op"]),
                tuple(v[p] for p in position),
                v["valid_from"],
                v["valid_to"],
                spec.row(v),
            )
            for v in with_ends([r.asDict() for r in raw.collect()], [spec.key])
        ]
        return position, versions
