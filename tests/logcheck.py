"""Checks of a change log against its source: reconstruct a table from its topic and compare."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from cdc.catalog import Table, describe_table
from cdc.decode import decode_row, parse_interval
from cdc.settings import PipelineSettings, Settings
from cdc.topics import ChangeRecord, read_topic


def pipeline_for(settings: Settings, tables: list[str], **extra: Any) -> Settings:
    """Settings with a pipeline of its own (random names) capturing `tables`."""
    name = "t" + uuid.uuid4().hex[:10]
    pipe = PipelineSettings(name=name, topic_prefix=name, tables=tables, **extra)
    return settings.model_copy(update={"pipeline": pipe})


def events_by_key(records: list[ChangeRecord]) -> dict[bytes, list[ChangeRecord]]:
    grouped: dict[bytes, list[ChangeRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.key_bytes is not None, "a change event without a key"
        grouped[record.key_bytes].append(record)
    return grouped


def reconstruct(records: list[ChangeRecord]) -> dict[bytes, dict[str, Any]]:
    """The table as the log says it is: the last event per key; deletes and tombstones remove it."""
    rows: dict[bytes, dict[str, Any]] = {}
    for key, events in events_by_key(records).items():
        last = events[-1].value
        if last is None or last["op"] == "d":
            rows.pop(key, None)
        else:
            rows[key] = last["after"]
    return rows


def table_info(settings: Settings, qualified: str) -> Table:
    with psycopg.connect(settings.postgres.dsn()) as conn:
        return describe_table(conn, qualified, settings.pipeline)


def normalize(value: Any) -> Any:
    """psycopg's value of a column in the decoder's terms."""
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, uuid.UUID | IPv4Address | IPv6Address):
        return str(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def source_rows(settings: Settings, table: Table) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of the table now, keyed by its key columns, values normalized."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        conn.execute("SET intervalstyle = iso_8601")
        conn.adapters.register_loader("interval", TextLoader)
        cur = conn.execute(
            psycopg.sql.SQL("SELECT * FROM {}").format(
                psycopg.sql.Identifier(table.schema, table.name)
            )
        )
        names = [d.name for d in cur.description or []]
        result = {}
        intervals = {c.name for c in table.columns if c.base == "interval"}
        for row in cur.fetchall():
            values = {}
            for name, value in zip(names, row, strict=True):
                if name in intervals and value is not None:
                    value = (
                        [parse_interval(v) for v in value]
                        if isinstance(value, list)
                        else parse_interval(value)
                    )
                values[name] = normalize(value)
            result[tuple(values[k] for k in table.key)] = values
    return result


def log_rows(records: list[ChangeRecord], table: Table) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = {}
    for after in reconstruct(records).values():
        decoded = decode_row(table, after)
        rows[tuple(decoded[k] for k in table.key)] = decoded
    return rows


def wait_until_equal(
    settings: Settings, table: Table, timeout: float = 90.0
) -> tuple[dict[tuple[Any, ...], dict[str, Any]], list[ChangeRecord]]:
    """Wait until the topic's reconstruction equals the table; return it and the records."""
    topic = settings.pipeline.topic(table.qualified)
    deadline = time.monotonic() + timeout
    while True:
        records = read_topic(settings.kafka.bootstrap_servers, topic)
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
