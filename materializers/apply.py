"""The apply job: PySpark Structured Streaming from the change topics into each store.

One streaming query per store, each with its own checkpoint under
`<data_dir>/checkpoints/<pipeline>/<store>`, reading the pipeline's change topics
with the spark-sql-kafka source. Each micro-batch keeps every key's last event and
hands it to the store, which writes it only if it is newer than what it holds.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cdc.catalog import Table, describe_table
from cdc.decode import UNAVAILABLE
from cdc.settings import Settings
from cdc.source import admin_connection
from cdc.spark import spark_session
from materializers.events import parse_events
from materializers.stores.base import Event, Store

__all__ = ["checkpoint_dir", "make_store", "run_apply", "warehouse_root"]

log = logging.getLogger(__name__)


def checkpoint_dir(settings: Settings, store: str) -> Path:
    return settings.data_dir / "checkpoints" / settings.pipeline.name / store


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

        return WarehouseStore(spark, warehouse_root(settings))
    raise ValueError(f"unknown store {name}")


def _captured_tables(settings: Settings) -> dict[str, Table]:
    """The pipeline's tables as the catalog describes them now (read every batch, so a
    schema change reaches the stores without a restart)."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        names = [
            f"{s}.{t}"
            for s, t in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables "
                "WHERE pubname = %s AND schemaname <> 'cdc' ORDER BY 1, 2",
                (pipe.publication,),
            ).fetchall()
        ]
        return {name: describe_table(conn, name, pipe) for name in names}


def _events(rows: Iterator[Any]) -> Iterator[Event]:
    """Each key's last event of the batch, from rows sorted by (topic, key, offset).

    An unchanged TOASTed value arrives as a placeholder; when an earlier event of the
    same key in this batch carried the value, the last event gets it, since only the
    last event is written.
    """
    current: Event | None = None
    for row in rows:
        after = json.loads(row["after"]) if row["after"] and row["op"] != "d" else None
        same_key = current is not None and (current.table, current.key) == (
            row["table"],
            row["key"],
        )
        if same_key and after is not None and current.after is not None:  # type: ignore[union-attr]
            for name, value in after.items():
                earlier = current.after.get(name, UNAVAILABLE)  # type: ignore[union-attr]
                if value == UNAVAILABLE and earlier != UNAVAILABLE:
                    after[name] = earlier
        elif not same_key and current is not None:
            yield current
        current = Event(
            table=row["table"],
            key=row["key"],
            partition=row["partition"],
            offset=row["offset"],
            op=row["op"],
            after=after,
            commit_ms=row["commit_ms"],
            lsn=row["lsn"],
        )
    if current is not None:
        yield current


def _batch_writer(
    settings: Settings, store: Store, chunk: int = 5000
) -> Callable[[Any, int], None]:
    def write(batch: Any, batch_id: int) -> None:
        tables = _captured_tables(settings)
        topics = {settings.pipeline.topic(t): t for t in tables}
        events = parse_events(batch, topics).where("table IS NOT NULL")
        if getattr(store, "spark_native", False):
            store.write_frame(tables, events)  # type: ignore[attr-defined]
            return
        events = events.orderBy("topic", "key", "offset")
        pending: list[Event] = []
        written = stale = 0
        for event in _events(events.toLocalIterator()):
            pending.append(event)
            if len(pending) >= chunk:
                result = store.write(tables, pending)
                written, stale, pending = written + result.written, stale + result.stale, []
        if pending:
            result = store.write(tables, pending)
            written, stale = written + result.written, stale + result.stale
        log.info("%s batch %d: %d written, %d stale", store.name, batch_id, written, stale)

    return write


def run_apply(
    settings: Settings,
    stores: list[str] | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Run the apply job. once: apply what the topics hold now, then return."""
    spark = spark_session(settings, f"cdc-apply-{settings.pipeline.name}")
    tables = _captured_tables(settings)
    topics = [settings.pipeline.topic(t) for t in tables]
    queries = []
    for name in stores or list(settings.apply.stores):
        store = make_store(settings, name, spark)
        store.prepare(tables.values())
        source = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka.bootstrap_servers)
            .option("subscribe", ",".join(topics))
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
    if once:
        for query in queries:
            query.awaitTermination()
        return
    try:
        while not (stop and stop.is_set()):
            for query in queries:
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()))
            if stop is None:
                queries[0].awaitTermination(1)
            else:
                stop.wait(1)
    finally:
        for query in queries:
            query.stop()
