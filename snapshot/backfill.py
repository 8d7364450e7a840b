"""Backfills while streaming: Debezium's incremental snapshot through its signal table.

Debezium reads the table in primary-key chunks between two watermarks it writes
to the signal table (the DBLog algorithm): a chunk row that changed inside the
window is dropped from the chunk, so a snapshot row never lands in the log after
a newer change of the same key. Progress comes back as Debezium notifications
on the pipeline's notification topic.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from cdc.connect import ConnectClient
from cdc.errors import CdcError
from cdc.settings import Settings
from cdc.source import SIGNAL_TABLE, admin_connection

__all__ = [
    "BackfillError",
    "BackfillProgress",
    "notification_topic",
    "send_signal",
    "start_backfill",
    "watch_backfill",
]


class BackfillError(CdcError):
    """A backfill cannot start, or it was aborted."""


def notification_topic(settings: Settings) -> str:
    return f"{settings.pipeline.topic_prefix}.notifications"


@dataclass
class BackfillProgress:
    """What the last notification said."""

    state: str = "requested"  # STARTED, IN_PROGRESS, PAUSED, RESUMED, TABLE_SCAN_COMPLETED, ...
    table: str | None = None
    last_key: str | None = None
    max_key: str | None = None
    rows_scanned: int | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("COMPLETED", "ABORTED")

    @property
    def fraction(self) -> float | None:
        """How far through its key range, when the key is a single number."""
        try:
            last, top = float(self.last_key or ""), float(self.max_key or "")
        except ValueError:
            return None
        return min(max(last / top, 0.0), 1.0) if top > 0 else None


def send_signal(settings: Settings, kind: str, data: dict[str, Any] | None) -> str:
    """Write a signal to Debezium's signal table; returns its id."""
    signal_id = str(uuid.uuid4())
    with admin_connection(settings) as conn:
        conn.execute(
            f"INSERT INTO {SIGNAL_TABLE} (id, type, data) VALUES (%s, %s, %s)",
            (signal_id, kind, json.dumps(data) if data is not None else None),
        )
        conn.commit()
    return signal_id


def _check_streaming(settings: Settings, table: str) -> None:
    pipe = settings.pipeline
    connectors = ConnectClient(settings.connect.url).connectors()
    status = connectors.get(pipe.connector, {}).get("status", {})
    if status.get("connector", {}).get("state") != "RUNNING":
        raise BackfillError(
            f"pipeline {pipe.name} is not streaming (connector {pipe.connector} is "
            f"{status.get('connector', {}).get('state', 'missing')}): run `cdc snapshot` first"
        )
    with admin_connection(settings) as conn:
        captured = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s "
            "AND schemaname || '.' || tablename = %s",
            (pipe.publication, table),
        ).fetchone()
    if not captured:
        raise BackfillError(
            f"table {table} is not captured by pipeline {pipe.name}: add it with "
            f"`cdc tables add {table}`"
        )


def start_backfill(settings: Settings, table: str, where: str | None = None) -> tuple[str, int]:
    """Ask Debezium for an incremental snapshot of table (rows matching where).

    Returns the signal id and the notification topic offset to watch from.
    """
    if "." not in table:
        table = f"public.{table}"
    _check_streaming(settings, table)
    if where:
        _check_filter(settings, table, where)
    start = _end_offset(settings)
    data: dict[str, Any] = {"data-collections": [table], "type": "incremental"}
    if where:
        data["additional-conditions"] = [{"data-collection": table, "filter": where}]
    return send_signal(settings, "execute-snapshot", data), start


def _check_filter(settings: Settings, table: str, where: str) -> None:
    """Refuse a filter PostgreSQL cannot run, before Debezium fails on it mid-backfill."""
    with admin_connection(settings) as conn:
        try:
            schema, name = table.split(".", 1)
            conn.execute(f'EXPLAIN SELECT 1 FROM "{schema}"."{name}" WHERE {where}')
        except Exception as exc:
            raise BackfillError(
                f"--where {where!r} is not a valid filter on {table}: {str(exc).splitlines()[0]}"
            ) from None


def _end_offset(settings: Settings) -> int:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    try:
        tp = TopicPartition(notification_topic(settings), 0)
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def watch_backfill(
    settings: Settings,
    from_offset: int,
    on_progress: Callable[[BackfillProgress], None],
    timeout: float | None = None,
) -> BackfillProgress:
    """Follow the notifications until the incremental snapshot completes or is aborted."""
    tp = TopicPartition(notification_topic(settings), 0)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    progress = BackfillProgress()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        consumer.assign([tp])
        consumer.seek(tp, from_offset)
        while not progress.finished:
            for record in consumer.poll(timeout_ms=1000).get(tp, []):
                note = json.loads(record.value) if record.value else {}
                if note.get("aggregate_type") != "Incremental Snapshot":
                    continue
                _apply(progress, note)
                on_progress(progress)
            if deadline is not None and time.monotonic() > deadline:
                raise BackfillError(f"the backfill did not finish within {timeout:.0f}s")
    finally:
        consumer.close()
    if progress.state == "ABORTED":
        raise BackfillError("the backfill was stopped before it finished")
    return progress


def _apply(progress: BackfillProgress, note: dict[str, Any]) -> None:
    extra = note.get("additional_data") or {}
    progress.state = note.get("type", progress.state)
    progress.table = (
        extra.get("current_collection_in_progress")
        or extra.get("data_collection")
        or progress.table
    )
    progress.last_key = extra.get("last_processed_key", progress.last_key)
    progress.max_key = extra.get("maximum_key", progress.max_key)
    if "total_rows_scanned" in extra:
        progress.rows_scanned = (progress.rows_scanned or 0) + int(extra["total_rows_scanned"])
