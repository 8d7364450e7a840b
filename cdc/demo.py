"""The demo people run first: the stack comes up and a change in PostgreSQL appears in Kafka."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
from rich.console import Console
from rich.table import Table

from cdc.capture import connector_config, wait_slot_active
from cdc.render import status_table
from cdc.settings import PROJECT_ROOT, Settings
from cdc.stack import Stack
from cdc.topics import wait_for_records

__all__ = ["run_demo"]

CONNECTOR = "cdc-demo"
TOPIC_PREFIX = "demo"
TABLE = "public.customers"


def run_demo(
    settings: Settings, out: Console, progress: Callable[[str], None], keep: bool = True
) -> None:
    stack = Stack(settings)
    stack.up(progress)

    progress(f"creating the demo table {TABLE}")
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute((PROJECT_ROOT / "sql" / "demo_schema.sql").read_text())

    progress(f"registering the Debezium connector {CONNECTOR} on {TABLE}")
    client = stack.connect.client()
    client.put_config(
        CONNECTOR,
        connector_config(
            settings,
            topic_prefix=TOPIC_PREFIX,
            tables=[TABLE],
            slot="cdc_demo",
            publication="cdc_demo",
        ),
    )
    client.wait_running(CONNECTOR)
    wait_slot_active(settings, "cdc_demo")

    topic = f"{TOPIC_PREFIX}.{TABLE}"
    before = len(wait_for_records(settings.kafka.bootstrap_servers, topic, 0, timeout=0))
    progress("inserting, updating and deleting a customer in PostgreSQL")
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO customers (email, name, country, balance) "
            "VALUES ('ada-' || gen_random_uuid() || '@example.com', 'Ada Lovelace', 'GB', 10.50) "
            "RETURNING id"
        ).fetchone()
        assert row is not None
        conn.execute(
            "UPDATE customers SET balance = balance + 5, updated_at = now() WHERE id = %s", row
        )
        conn.execute("DELETE FROM customers WHERE id = %s", row)

    records = wait_for_records(settings.kafka.bootstrap_servers, topic, before + 4)[before:]
    table = Table(title=f"change events on Kafka topic {topic}", title_justify="left")
    for column in ("partition:offset", "key", "op", "after"):
        table.add_column(column, overflow="fold")
    for record in records:
        value = record.value
        after = json.dumps(value.get("after")) if value else "(tombstone)"
        table.add_row(
            f"{record.partition}:{record.offset}",
            record.key_bytes.decode() if record.key_bytes else "",
            record.op or "",
            after,
        )
    out.print(table)
    out.print(status_table(stack.status()))
    if not keep:
        stack.down(progress=progress)
    else:
        progress("the stack keeps running: `cdc status`, `cdc down` to stop it")
