"""Backfills while streaming: Debezium's incremental snapshot through its signal table.

Debezium reads the table in primary-key chunks between two watermarks it writes
to the signal table (the DBLog algorithm): a chunk row that changed inside the
window is dropped from the chunk, so a snapshot row never lands in the log after
a newer change of the same key. With pipeline.read_only_backfills the signals go
through a Kafka topic and the watermarks are pg_current_snapshot(): nothing is
written to the source. Progress comes back as Debezium notifications on the
pipeline's notification topic.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from psycopg import sql

from cdc.capture.connect_client import connect_client
from cdc.capture.source_setup import (
    SIGNAL_LOCK_TIMEOUT,
    SIGNAL_TABLE,
    replication_dsn,
    signal_data_width,
    widen_signal_table,
)
from cdc.core.clients import kafka_client_kwargs, kafka_producer_kwargs
from cdc.core.errors import BackfillError
from cdc.core.filters import filter_problem
from cdc.core.identity import acknowledge_all
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings
from cdc.core.topics import notification_topic, signal_topic

__all__ = [
    "MAX_FILTER_CHARS",
    "BackfillProgress",
    "filter_problem",
    "send_signal",
    "start_backfill",
    "watch_backfill",
]


# A signal from Kafka is run by Debezium's signal thread, beside the streaming thread: its
# own execute-snapshot and resume-snapshot read a chunk there, racing the changes streamed
# meanwhile (a key deleted during the read came back after its delete). These actions
# (jvm/signals, cdc.connect.signals.InStreamSnapshots) are the same, run by the streaming
# thread.
IN_STREAM = {
    "execute-snapshot": "cdc-execute-snapshot",
    "resume-snapshot": "cdc-resume-snapshot",
}

# Debezium keeps a running backfill's filter in the connector's offsets, escaped twice
# (JSON in JSON); Kafka Connect writes them as one record, at most 1 MiB by default.
MAX_FILTER_CHARS = 512 * 1024

# how long a COMPLETED that no table scan came before waits for an ABORTED (finished)
STOP_GRACE_S = 10.0


@dataclass
class BackfillProgress:
    """What the last notification said."""

    state: str = "requested"  # STARTED, IN_PROGRESS, PAUSED, RESUMED, TABLE_SCAN_COMPLETED, ...
    table: str | None = None
    last_key: str | None = None
    max_key: str | None = None
    rows_scanned: int | None = None
    failures: list[str] = field(default_factory=list)  # "table: STATUS" of a scan that failed
    signal_id: str | None = None  # when given: what follows Debezium taking this signal
    taken: bool = False  # Debezium has taken signal_id
    scanned: bool = False  # a table's scan completed
    completed_at: float | None = None  # when a COMPLETED came before any scan completed

    @property
    def finished(self) -> bool:
        """Completed or stopped. Debezium 3.6 says COMPLETED, then ABORTED, of a backfill
        stopped in its table, with no TABLE_SCAN_COMPLETED: such a COMPLETED is the end
        only once STOP_GRACE_S passed without an ABORTED."""
        if self.state == "ABORTED":
            return True
        if self.state != "COMPLETED":
            return False
        return self.scanned or time.monotonic() - (self.completed_at or 0.0) > STOP_GRACE_S

    @property
    def fraction(self) -> float | None:
        """How far through its key range, when the key is a single number."""
        try:
            last, top = float(self.last_key or ""), float(self.max_key or "")
        except (TypeError, ValueError):  # not a single number
            return None
        return min(max(last / top, 0.0), 1.0) if top > 0 else None


def send_signal(settings: Settings, kind: str, data: dict[str, Any] | None) -> str:
    """Write a signal to Debezium's signal table, or with pipeline.read_only_backfills
    to its signal topic; returns its id.

    A signal table from before, whose data column is too short for this signal, is
    widened to text first (cdc.capture.source_setup.widen_signal_table).
    """
    signal_id = str(uuid.uuid4())
    if settings.pipeline.read_only_backfills:
        kind = IN_STREAM.get(kind, kind)
        _send_to_topic(settings, {"id": signal_id, "type": kind, "data": data or {}})
        return signal_id
    text = json.dumps(data) if data is not None else None
    with admin_connection(settings) as conn:
        try:
            width = signal_data_width(conn)
            too_long = text is not None and width is not None and len(text) > width
            if too_long and not widen_signal_table(conn):
                raise BackfillError(
                    f"the signal ({len(text or '')} characters) does not fit {SIGNAL_TABLE}.data "
                    f"(varchar({width})) and could not be widened to text (another transaction "
                    f"held the table for {SIGNAL_LOCK_TIMEOUT}, or user {settings.postgres.user} "
                    "does not own it): run the command again once the table is free, or have its "
                    f"owner run ALTER TABLE {SIGNAL_TABLE} ALTER COLUMN data TYPE text"
                )
            conn.execute(
                f"INSERT INTO {SIGNAL_TABLE} (id, type, data) VALUES (%s, %s, %s)",
                (signal_id, kind, text),
            )
            conn.commit()
        except psycopg.Error as exc:
            raise BackfillError(
                f"could not write the {kind} signal to {SIGNAL_TABLE}: "
                f"{str(exc).strip().splitlines()[0]}; run `cdc snapshot` to set the pipeline up"
            ) from None
    return signal_id


def _send_to_topic(settings: Settings, signal: dict[str, Any]) -> None:
    """Debezium's Kafka signal channel takes a record keyed by its logical name (the
    topic prefix) whose value is the signal as JSON."""
    topic = signal_topic(settings.pipeline)
    try:
        producer = KafkaProducer(**kafka_producer_kwargs(settings.kafka), request_timeout_ms=10_000)
    except KafkaError:
        raise BackfillError(
            f"Kafka at {settings.kafka.bootstrap} does not answer: start it (`cdc up`) "
            "or fix kafka.bootstrap_servers (or host and port)"
        ) from None
    try:
        key = settings.pipeline.topic_prefix.encode()
        producer.send(topic, key=key, value=json.dumps(signal).encode()).get(timeout=15)
    except KafkaError as exc:
        raise BackfillError(
            f"could not write the {signal['type']} signal to topic {topic} ({exc}): "
            "run `cdc setup` to make it, and check `cdc status`"
        ) from None
    finally:
        producer.close(timeout=5)


def ready_to_backfill(settings: Settings, tables: list[str]) -> None:
    """Raise BackfillError unless a backfill of `tables` (none: every captured table) can
    start now: the connector streams, each table is captured, and Kafka answers. Checked
    before a command changes anything that the backfill would then have to make good."""
    if not tables:
        _check_connector(settings)
    for table in tables:
        _check_streaming(settings, table)
    _end_offset(settings)


def _check_connector(settings: Settings) -> None:
    pipe = settings.pipeline
    connectors = connect_client(settings).connectors()
    status = connectors.get(pipe.connector, {}).get("status", {})
    if status.get("connector", {}).get("state") != "RUNNING":
        raise BackfillError(
            f"pipeline {pipe.name} is not streaming (connector {pipe.connector} is "
            f"{status.get('connector', {}).get('state', 'missing')}): run `cdc snapshot` first"
        )


def _check_streaming(settings: Settings, table: str) -> None:
    pipe = settings.pipeline
    _check_connector(settings)
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


def start_backfill(
    settings: Settings, table: str, where: str | None = None, acknowledge: bool = True
) -> tuple[str, int]:
    """Ask Debezium for an incremental snapshot of table (rows matching where).

    Returns the signal id and the notification topic offset to watch from. With
    `acknowledge` (a backfill a person asked for: the remedy `cdc status` gives for
    changes made under a passing name), those changes written so far are accounted for.
    """
    if "." not in table:
        table = f"public.{table}"
    if where is not None and not where.strip():
        where = None
    if where:
        _check_filter_size(where)
    _check_streaming(settings, table)
    if where:
        _check_filter(settings, table, where)
    start = _end_offset(settings)
    data: dict[str, Any] = {"data-collections": [table], "type": "incremental"}
    # the table's own row filter (pipeline.table): a backfill reads the rows the
    # publication and the snapshot hold, no others
    choice = settings.pipeline.table.get(table)
    rows = " AND ".join(f"({w})" for w in (choice.where if choice else None, where) if w)
    if rows:
        _check_filter_size(rows)
        # Debezium appends the filter to its chunk query as it is (`WHERE <chunk bounds>
        # AND <filter>`): an OR at its top level would escape the chunk's bounds
        data["additional-conditions"] = [{"data-collection": table, "filter": rows}]
    signal = send_signal(settings, "execute-snapshot", data)
    if acknowledge:
        with admin_connection(settings) as conn:
            acknowledge_all(conn, settings.pipeline.name)
            conn.commit()
    return signal, start


def filter_chars(where: str) -> int:
    """How long the filter is once Debezium keeps it in its offsets (JSON in JSON)."""
    return len(json.dumps(json.dumps(where)))


def _check_filter_size(where: str) -> None:
    if filter_chars(where) > MAX_FILTER_CHARS:
        raise BackfillError(
            f"--where is {len(where):,} characters: Debezium keeps a running backfill's filter "
            "in the connector's offsets, which Kafka Connect stores as one record of at most "
            "1 MiB; give a shorter filter (a range of keys), or split it into several backfills"
        )


def _check_filter(settings: Settings, table: str, where: str) -> None:
    """Refuse a filter that is not one boolean expression PostgreSQL accepts on the table,
    before Debezium fails on it mid-backfill.

    It is checked as Debezium will run it: as the replication role, in a read-only
    transaction, one statement (a prepared one: PostgreSQL refuses several), and only
    planned (EXPLAIN), never run.
    """
    shown = where if len(where) <= 200 else where[:200] + "..."
    problem = filter_problem(where)
    if problem:
        raise BackfillError(f"--where {shown!r} is not one filter expression: {problem}")
    schema, name = table.split(".", 1)
    query = sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE ({})").format(
        sql.Identifier(schema, name),
        sql.SQL(where),
    )
    try:
        conn = psycopg.connect(replication_dsn(settings), connect_timeout=5)
    except psycopg.OperationalError:
        raise BackfillError(
            f"cannot check --where: the replication role {settings.pipeline.replication_user} "
            "cannot connect to PostgreSQL; run `cdc status` and `cdc setup`"
        ) from None
    with conn:
        conn.read_only = True
        try:
            with conn.transaction():
                conn.execute("SET LOCAL statement_timeout = '10s'")
                conn.execute(query, prepare=True)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise BackfillError(
                f"--where {shown!r} reads what the replication role "
                f"{settings.pipeline.replication_user} may not ({exc.diag.message_primary}): "
                f"filter on the columns of {table} only"
            ) from None
        except psycopg.Error as exc:
            raise BackfillError(
                f"--where {shown!r} is not a valid filter on {table}: "
                f"{str(exc).strip().splitlines()[0]}"
            ) from None


def _consumer(settings: Settings) -> KafkaConsumer:
    try:
        return KafkaConsumer(**kafka_client_kwargs(settings.kafka))
    except KafkaError:
        raise BackfillError(
            f"Kafka at {settings.kafka.bootstrap} does not answer: start it (`cdc up`) "
            "or fix kafka.bootstrap_servers (or host and port)"
        ) from None


def _end_offset(settings: Settings) -> int:
    consumer = _consumer(settings)
    try:
        tp = TopicPartition(notification_topic(settings.pipeline), 0)
        return int(consumer.end_offsets([tp])[tp])
    except KafkaError as exc:
        raise BackfillError(
            f"cannot read the notification topic {notification_topic(settings.pipeline)} ({exc}): "
            "check `cdc status`"
        ) from None
    finally:
        consumer.close()


def watch_backfill(
    settings: Settings,
    from_offset: int,
    on_progress: Callable[[BackfillProgress], None],
    timeout: float | None = None,
    signal_id: str | None = None,
) -> BackfillProgress:
    """Follow the notifications until the incremental snapshot completes or is aborted.

    With signal_id (start_backfill's), only what follows Debezium taking that signal
    counts (see _follow). A table scan that failed (Debezium reports SQL_EXCEPTION
    and goes on) is an error here.
    """
    tp = TopicPartition(notification_topic(settings.pipeline), 0)
    consumer = _consumer(settings)
    progress = BackfillProgress(signal_id=signal_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    log_file = settings.data_dir / "connect" / "connect.log"
    try:
        consumer.assign([tp])
        consumer.seek(tp, from_offset)
        while not progress.finished:
            records = consumer.poll(timeout_ms=1000).get(tp, [])
            _take(progress, (_note(r.value) for r in records), on_progress)
            if deadline is not None and time.monotonic() > deadline:
                waiting = signal_id is not None and not progress.taken
                untaken = " (Debezium has not taken its signal yet"
                if settings.pipeline.read_only_backfills:  # an action of the pipeline's own
                    untaken += "; a Connect of your own needs cdc-signals-1.jar beside Debezium's"
                raise BackfillError(
                    f"the backfill did not finish within {timeout:.0f}s"
                    + (untaken + ")" if waiting else "")
                    + f": see `cdc status` and the Connect log {log_file}"
                )
    except KafkaError as exc:
        raise BackfillError(
            f"lost the notification topic {notification_topic(settings.pipeline)} ({exc}): check "
            "`cdc status`; the backfill itself goes on"
        ) from None
    finally:
        consumer.close()
    if progress.state == "ABORTED":
        raise BackfillError("the backfill was stopped before it finished")
    if progress.failures:
        raise BackfillError(
            f"Debezium could not read {', '.join(progress.failures)}: see the Connect log "
            f"{log_file}, then run the backfill again"
        )
    return progress


def _note(value: bytes | None) -> Any:
    """A notification record's JSON; one that is not JSON (nothing Debezium writes) is
    no notification."""
    try:
        return json.loads(value) if value else {}
    except (ValueError, RecursionError):
        return {}


def _take(
    progress: BackfillProgress,
    notes: Iterable[Any],
    on_progress: Callable[[BackfillProgress], None],
) -> None:
    """Follow `notes` (one poll's) in order, up to the one that finishes the backfill:
    what comes after it (Debezium's COMPLETED of the window a stop interrupted, another
    backfill's) is not this backfill's end, and a stop stays a stop."""
    for note in notes:
        if _follow(progress, note):
            on_progress(progress)
            if progress.finished:
                return


def _follow(progress: BackfillProgress, note: dict[str, Any]) -> bool:
    """Take one notification in; returns whether it concerned this backfill.

    Debezium queues a signal that arrives while a backfill runs, and its notifications
    carry the id of the signal that joined the queue last; COMPLETED comes once the
    queue is empty. So once a notification carries progress.signal_id, Debezium has
    taken the signal, and the next COMPLETED covers it; a COMPLETED before that (of a
    backfill that was running already) does not.
    """
    if not isinstance(note, dict) or note.get("aggregate_type") != "Incremental Snapshot":
        return False
    if progress.signal_id is not None and not progress.taken:
        if note.get("id") != progress.signal_id:
            return False
        progress.taken = True
    _apply(progress, note)
    return True


def _apply(progress: BackfillProgress, note: dict[str, Any]) -> None:
    extra = note.get("additional_data")
    extra = extra if isinstance(extra, dict) else {}  # what Debezium writes is an object
    progress.state = str(note.get("type", progress.state))
    progress.table = (
        extra.get("current_collection_in_progress")
        or extra.get("data_collection")
        or progress.table
    )
    progress.last_key = extra.get("last_processed_key", progress.last_key)
    progress.max_key = extra.get("maximum_key", progress.max_key)
    scanned = str(extra.get("total_rows_scanned", ""))
    if scanned.isascii() and scanned.isdigit() and len(scanned) <= 18:  # a count, as Debezium says
        progress.rows_scanned = (progress.rows_scanned or 0) + int(scanned)
    status = extra.get("status")
    progress.scanned |= progress.state == "TABLE_SCAN_COMPLETED"
    if progress.state == "COMPLETED" and progress.completed_at is None:
        progress.completed_at = time.monotonic()
    if progress.state == "TABLE_SCAN_COMPLETED" and status not in (None, "SUCCEEDED", "EMPTY"):
        progress.failures.append(f"{extra.get('scanned_collection', progress.table)}: {status}")
