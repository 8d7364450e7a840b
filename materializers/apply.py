"""The apply job: PySpark Structured Streaming from the change topics into each store.

One streaming query per store, each with its own checkpoint under
`<data_dir>/checkpoints/<pipeline>/<store>`, reading the pipeline's change topics
with the spark-sql-kafka source. Each micro-batch keeps every key's last event and
hands it to the store, which writes it only if it is newer than what it holds.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc.catalog import Table, describe_table, published_tables
from cdc.settings import Settings
from cdc.source import TRUNCATIONS_TABLE, admin_connection
from cdc.spark import spark_session
from materializers.events import parse_events
from materializers.stores.base import Store
from materializers.views import check_views, window_query
from materializers.writer import RESULT_DDL, partition_writer

__all__ = [
    "checkpoint_dir",
    "dead_letter_topic",
    "make_store",
    "read_progress",
    "run_apply",
    "warehouse_root",
]

log = logging.getLogger(__name__)


def checkpoint_dir(settings: Settings, store: str) -> Path:
    return settings.data_dir / "checkpoints" / settings.pipeline.name / store


def progress_file(settings: Settings, store: str) -> Path:
    """Written after every micro-batch: what the store has applied, for `cdc status`."""
    return settings.data_dir / "checkpoints" / settings.pipeline.name / f"{store}.progress.json"


def dead_letter_topic(settings: Settings) -> str:
    return f"{settings.pipeline.topic_prefix}.dlq"


class DeadLetters:
    """Poison events go to the pipeline's dead-letter topic with the error and where they
    came from (topic, partition, offset); the pipeline goes on."""

    def __init__(self, settings: Settings, store: str) -> None:
        self.settings, self.store = settings, store
        self._producer: Any = None

    def send(
        self, topic: str, partition: int, offset: int, key: Any, value: Any, error: str
    ) -> None:
        if self._producer is None:
            from kafka import KafkaProducer

            self._producer = KafkaProducer(
                bootstrap_servers=self.settings.kafka.bootstrap_servers, acks="all"
            )
        record = {
            "store": self.store,
            "error": error,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "key": key,
            "value": value,
        }
        self._producer.send(
            dead_letter_topic(self.settings),
            key=(key or "").encode(),
            value=json.dumps(record, default=str).encode(),
        )

    def send_row(self, row: Any) -> None:
        """A row (mapping) with topic, partition, offset, key, value and error."""
        self.send(
            row["topic"], row["partition"], row["offset"], row["key"], row["value"], row["error"]
        )

    def flush(self) -> None:
        if self._producer is not None:
            self._producer.flush()


def warehouse_root(settings: Settings) -> str:
    return settings.apply.warehouse_path or str(settings.data_dir / "warehouse")


def make_store(settings: Settings, name: str, spark: Any = None) -> Store:
    if name == "cache":
        from materializers.stores.cache import CacheStore

        r = settings.redis
        return CacheStore(
            r.url,
            settings.pipeline.topic_prefix,
            r.password.get_secret_value() if r.password else None,
            settings.apply.deleted_marker_ttl_s,
        )
    if name == "search":
        from materializers.stores.search import SearchStore

        return SearchStore(settings.opensearch.url, settings.pipeline.topic_prefix)
    if name == "warehouse":
        from materializers.stores.warehouse import WarehouseStore

        return WarehouseStore(spark, warehouse_root(settings), settings.apply.joins)
    raise ValueError(f"unknown store {name}")


def _captured_tables(settings: Settings) -> dict[str, Table]:
    """The pipeline's tables as the catalog describes them now (read every batch, so a
    schema change reaches the stores without a restart)."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        names = published_tables(conn, pipe.publication)
        return {name: describe_table(conn, name, pipe) for name in names}


def _batch_writer(
    settings: Settings, store: Store, chunk: int = 5000
) -> Callable[[Any, int], None]:
    dead = DeadLetters(settings, store.name)

    def write(batch: Any, batch_id: int) -> None:
        # each store's queries run in a scheduler pool of their own (FAIR between pools)
        batch.sparkSession.sparkContext.setLocalProperty("spark.scheduler.pool", store.name)
        tables = _captured_tables(settings)
        topics = {settings.pipeline.topic(t): t for t in [*tables, TRUNCATIONS_TABLE]}
        cutoffs = dict((read_progress(settings, store.name) or {}).get("truncated", {}))
        if not getattr(store, "spark_native", False):
            _write_partitions(batch, topics, tables, batch_id, cutoffs)
            return
        parsed = parse_events(batch, topics).where("table IS NOT NULL").cache()
        try:
            _write_frame(parsed, tables, batch_id, cutoffs)
        finally:
            parsed.unpersist()

    def _write_frame(
        parsed: Any, tables: dict[str, Table], batch_id: int, cutoffs: dict[str, int]
    ) -> None:
        """A store that writes Spark frames (the warehouse) takes the batch as one. One
        job tells what the batch holds (per topic partition: last offset, events, newest
        commit time, poison events); the dead-letter and TRUNCATE jobs run only when the
        batch has some, as each Spark job costs a few hundred ms on a small machine."""
        from pyspark.sql import functions as F

        valid = F.col("error").isNull()
        parts = (
            parsed.groupBy("table", "topic", "partition")
            .agg(
                F.max("offset").alias("offset"),
                F.count(F.when(valid, 1)).alias("n"),
                F.max(F.when(valid, F.col("commit_ms"))).alias("commit_ms"),
                F.count("error").alias("errors"),
            )
            .collect()
        )
        if any(p["errors"] for p in parts):
            for row in parsed.where("error IS NOT NULL").toLocalIterator():
                dead.send_row(row)
        truncated = any(p["table"] == TRUNCATIONS_TABLE and p["n"] for p in parts)
        keep = _truncated(parsed, tables, cutoffs, found=truncated)
        data = [p for p in parts if p["table"] != TRUNCATIONS_TABLE]
        commits = [p["commit_ms"] for p in data if p["commit_ms"] is not None]
        summary = {"n": sum(p["n"] for p in data), "commit_ms": max(commits, default=None)}
        offsets = {f"{p['topic']}:{p['partition']}": p["offset"] for p in parts}
        present = {p["table"] for p in data if p["n"]}
        started = time.monotonic()
        store.write_frame(tables, parsed.where(valid & keep), present)  # type: ignore[attr-defined]
        dead.flush()
        log.info(
            "%s batch %d: %d events in %.1f s",
            store.name,
            batch_id,
            summary["n"],
            time.monotonic() - started,
        )
        _record(batch_id, summary, offsets, None, cutoffs)

    def _write_partitions(
        batch: Any,
        topics: dict[str, str],
        tables: dict[str, Table],
        batch_id: int,
        cutoffs: dict[str, int],
    ) -> None:
        """A Python store is written by Spark's Python workers, partition by partition
        (materializers/writer.py); the driver gets the counts, the dead letters and the
        batch's TRUNCATEs. A TRUNCATE is applied after the batch's writes: it empties
        what was written before its LSN, which is what applying it first and leaving out
        the older events would have left."""
        from pyspark.sql import functions as F

        mapping = F.create_map(*[x for t, n in topics.items() for x in (F.lit(t), F.lit(n))])
        frame = batch.select(
            mapping[F.col("topic")].alias("table"),
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
        ).where("table IS NOT NULL")
        run = partition_writer(
            functools.partial(make_store, settings, store.name),
            tables,
            settings.pipeline.topic,
            TRUNCATIONS_TABLE,
            cutoffs,
            chunk,
        )
        offsets: dict[str, int] = {}
        counts = {"written": 0, "stale": 0}
        summary: dict[str, Any] = {"n": 0, "commit_ms": None}
        truncations = []
        for row in frame.mapInArrow(run, RESULT_DDL).collect():
            if row["kind"] == "dead":
                dead.send_row(row)
                continue
            if row["kind"] == "truncate":
                truncations.append(row)
                continue
            where = f"{row['topic']}:{row['partition']}"
            offsets[where] = max(row["offset"], offsets.get(where, -1))
            summary["n"] += row["n"] or 0
            if row["commit_ms"] is not None:
                summary["commit_ms"] = max(row["commit_ms"], summary["commit_ms"] or 0)
            counts["written"] += row["written"] or 0
            counts["stale"] += row["stale"] or 0
        dead.flush()
        for row in sorted(truncations, key=lambda r: r["lsn"]):
            if row["table"] in tables:
                store.truncate(tables[row["table"]], row["lsn"], row["commit_ms"])
                cutoffs[row["table"]] = max(row["lsn"], cutoffs.get(row["table"], 0))
        log.info("%s batch %d: %s", store.name, batch_id, counts)
        _record(batch_id, summary, offsets, counts, cutoffs)

    def _truncated(
        parsed: Any, tables: dict[str, Table], cutoffs: dict[str, int], found: bool
    ) -> Any:
        """Apply the batch's TRUNCATEs (rows of cdc.truncations; `found`: the batch has
        some) to the store, in LSN order, adding them to `cutoffs`. Returns which events
        to write: none of cdc.truncations, and none of a truncated table from before its
        TRUNCATE. The cut-offs are kept in the progress file, so an event from before a
        TRUNCATE that comes in a later batch (another topic, read further behind) is
        dropped too."""
        from pyspark.sql import functions as F

        rows = (
            parsed.where(F.col("table") == TRUNCATIONS_TABLE)
            .where("error IS NULL AND op IN ('c', 'r')")
            .select(F.get_json_object("after", "$.table_name").alias("name"), "lsn", "commit_ms")
            .orderBy("lsn")
            .collect()
            if found
            else []
        )
        for row in rows:
            if row["name"] in tables:
                store.truncate(tables[row["name"]], row["lsn"], row["commit_ms"])
                cutoffs[row["name"]] = max(row["lsn"], cutoffs.get(row["name"], 0))
        keep = F.col("table") != TRUNCATIONS_TABLE
        for name, lsn in cutoffs.items():
            # tombstones (no LSN) follow their delete event, which the cut-off judges
            keep &= (F.col("table") != name) | F.col("lsn").isNull() | (F.col("lsn") > lsn)
        return keep

    def _record(
        batch_id: int, summary: Any, offsets: dict[str, int], counts: Any, cutoffs: dict[str, int]
    ) -> None:
        previous = read_progress(settings, store.name) or {}
        applied = dict(previous.get("applied", {}))
        applied.update(offsets)
        commit_ms = summary["commit_ms"] if summary and summary["n"] else previous.get("commit_ms")
        record = {
            "batch": batch_id,
            "applied": applied,
            "commit_ms": commit_ms,
            "applied_ms": int(time.time() * 1000),
            "last_batch": counts,
            "truncated": cutoffs,
        }
        path = progress_file(settings, store.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    return write


def _note_late(settings: Settings, windows: dict[str, Any]) -> None:
    """Events a windowed aggregate did not count (later than its watermark), added up
    per window in `window-<name>.progress.json` for `cdc status`."""
    for name, query in windows.items():
        path = progress_file(settings, f"window-{name}")
        try:
            noted = json.loads(path.read_text())
        except (OSError, ValueError):
            noted = {"late": 0, "batch": -1}
        fresh = [p for p in query.recentProgress if p["batchId"] > noted["batch"]]
        if not fresh:
            continue
        for progress in fresh:
            for operator in progress.get("stateOperators", []):
                noted["late"] += int(operator.get("numRowsDroppedByWatermark", 0))
        noted["batch"] = max(p["batchId"] for p in fresh)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(noted))


def change_topic_pattern(settings: Settings) -> str:
    """`<prefix>.<schema>.<table>`: not the transaction, notification or dead-letter topics."""
    return rf"^{re.escape(settings.pipeline.topic_prefix)}\.[^.]+\.[^.]+$"


def read_progress(settings: Settings, store: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(progress_file(settings, store).read_text()))
    except (OSError, ValueError):
        return None


def run_apply(
    settings: Settings,
    stores: list[str] | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Run the apply job. once: apply what the topics hold now, then return."""
    spark = spark_session(settings, f"cdc-apply-{settings.pipeline.name}")
    tables = _captured_tables(settings)
    selected = stores or list(settings.apply.stores)
    if "warehouse" in selected:
        check_views(settings, tables)
    queries = []
    for name in selected:
        store = make_store(settings, name, spark)
        store.prepare(tables.values())
        source = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka.bootstrap_servers)
            # every change topic of the pipeline, also of tables added while it runs
            .option("subscribePattern", change_topic_pattern(settings))
            .option("startingOffsets", "earliest")
            # records a re-snapshot deleted are gone on purpose; start from what is there
            .option("failOnDataLoss", "false")
            .option("maxOffsetsPerTrigger", settings.apply.max_offsets_per_trigger)
            .load()
        )
        writer = (
            source.writeStream.queryName(f"cdc-{settings.pipeline.name}-{name}")
            .option("checkpointLocation", str(checkpoint_dir(settings, name)))
            .foreachBatch(_batch_writer(settings, store))
        )
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=f"{settings.apply.trigger_interval_s} seconds")
        )
        queries.append(writer.start())
    windows: dict[str, Any] = {}
    for window in settings.apply.windows if "warehouse" in selected else []:
        checkpoint = str(checkpoint_dir(settings, f"window-{window.name}"))
        # a pool of its own (the query's thread inherits it from this one)
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", f"window-{window.name}")
        writer = window_query(spark, settings, window, tables[window.table], checkpoint)
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=f"{settings.apply.trigger_interval_s} seconds")
        )
        windows[window.name] = writer.start()
        queries.append(windows[window.name])
    if once:
        for query in queries:
            query.awaitTermination()
        _note_late(settings, windows)
        return
    try:
        while not (stop and stop.is_set()):
            for query in queries:
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
            _note_late(settings, windows)
            if stop is None:
                queries[0].awaitTermination(1)
            else:
                stop.wait(1)
    finally:
        for query in queries:
            query.stop()
