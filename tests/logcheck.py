"""Checks of a change log against its source: reconstruct a table from its topic and compare."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg

from cdc.check.verify import source_rows as verify_source_rows
from cdc.core.catalog import Table, describe_table
from cdc.core.settings import Settings
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.topics import ChangeRecord, change_topic, read_topic
from cdc.types.decode import UNAVAILABLE, decode_row, mark_unavailable


def pipeline_for(settings: Settings, tables: list[str], **extra: Any) -> Settings:
    """Settings with a pipeline of its own (random names) capturing `tables`."""
    name = "t" + uuid.uuid4().hex[:10]
    pipe = PipelineSettings(name=name, topic_prefix=name, tables=tables, **extra)
    return settings.model_copy(update={"pipeline": pipe})


def pipeline_env(
    stack_env: dict[str, str], settings: Settings, tables: list[str] | None = None
) -> dict[str, str]:
    """The CDC_* environment that runs `cdc` on the stack with this pipeline (its tables,
    or `tables`)."""
    pipe = settings.pipeline
    return {
        **stack_env,
        "CDC_PIPELINE__NAME": pipe.name,
        "CDC_PIPELINE__TOPIC_PREFIX": pipe.topic_prefix,
        "CDC_PIPELINE__TABLES": json.dumps(tables if tables is not None else pipe.tables),
    }


def events_by_key(records: list[ChangeRecord]) -> dict[bytes, list[ChangeRecord]]:
    grouped: dict[bytes, list[ChangeRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key_bytes is not None, "a change event without a key"
        grouped[record.key_bytes].append(record)
    return grouped


def reconstruct(
    records: list[ChangeRecord], table: Table | None = None
) -> dict[bytes, dict[str, Any]]:
    """The table as the log says it is: the last event per key; deletes and tombstones
    remove it. With `table`, as the stores read it: a placeholder for an unchanged TOAST
    value keeps the value the key's event before it held (UNAVAILABLE when none did)."""
    rows: dict[bytes, dict[str, Any]] = {}
    for key, events in events_by_key(records).items():
        row: dict[str, Any] | None = None
        for event in events if table is not None else events[-1:]:
            value = event.value
            if value is None or value["op"] == "d":
                row = None
                continue
            after = value["after"]
            if table is not None:
                after = mark_unavailable(table, value["op"], after) or {}
                held = row or {}
                after = {c: held.get(c, v) if v == UNAVAILABLE else v for c, v in after.items()}
            row = after
        if row is None:
            rows.pop(key, None)
        else:
            rows[key] = row
    return rows


def table_info(settings: Settings, qualified: str) -> Table:
    with psycopg.connect(settings.postgres.dsn()) as conn:
        return describe_table(conn, qualified, settings.pipeline)


def source_rows(settings: Settings, table: Table) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of the table now, keyed by its key columns, values normalized (without
    its generated columns, as log_rows)."""
    rows = verify_source_rows(settings, table)
    for column in table.generated:
        for row in rows.values():
            del row[column.name]
    for column in table.columns:  # verify reads JSON as its text; the log decodes it
        if column.base in ("json", "jsonb"):
            for row in rows.values():
                row[column.name] = _parsed(row[column.name])
    return {tuple(row[k] for k in table.key): row for row in rows.values()}


def _parsed(text: Any) -> Any:
    if isinstance(text, list):
        return [_parsed(t) for t in text]
    return text if not isinstance(text, str) else json.loads(text)


def log_rows(records: list[ChangeRecord], table: Table) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table as its log says it is, read as the stores read it (reconstruct), without
    the generated columns (Debezium's events lack them; the apply job computes them)."""
    rows = {}
    generated = {c.name for c in table.generated}
    for after in reconstruct(records, table).values():
        decoded = {k: v for k, v in decode_row(table, after).items() if k not in generated}
        rows[tuple(decoded[k] for k in table.key)] = decoded
    return rows


def wait_until_equal(
    settings: Settings, table: Table, timeout: float = 90.0
) -> tuple[dict[tuple[Any, ...], dict[str, Any]], list[ChangeRecord]]:
    """Wait until the topic's reconstruction equals the table; return it and the records."""
    topic = change_topic(settings.pipeline, table.qualified)
    deadline = time.monotonic() + timeout
    while True:
        records = read_topic(settings.kafka, topic)
        logged, source = log_rows(records, table), source_rows(settings, table)
        if logged == source:
            return source, records
        if time.monotonic() > deadline:
            missing = [k for k in source if k not in logged][:5]
            extra = [k for k in logged if k not in source][:5]
            differ = [k for k in source if k in logged and source[k] != logged[k]][:3]
            detail = {
                k: {
                    c: (repr(v)[:80], repr(logged[k].get(c))[:80])
                    for c, v in source[k].items()
                    if logged[k].get(c) != v
                }
                for k in differ
            }
            raise AssertionError(
                f"log != table after {timeout}s: {len(source)} rows in table, "
                f"{len(logged)} in log; "
                f"missing {missing}, extra {extra}, differing {detail}"
            )
        time.sleep(1.0)


def poll(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.3)


def wait_until_captured(settings: Settings, timeout: float = 120.0) -> None:
    """Wait until every change written so far is in Kafka: the slot confirms the WAL
    written by now (Debezium confirms what Kafka acknowledged)."""
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    wanted = row[0] if row else 0

    def confirmed() -> bool:
        with psycopg.connect(dsn) as conn:
            found = conn.execute(
                "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (settings.pipeline.slot,),
            ).fetchone()
        return bool(found and found[0] is not None and found[0] >= wanted)

    poll(confirmed, timeout, "the slot to confirm the WAL written so far")
