"""The demo people run first: the stack comes up, the demo tables are snapshotted at a known
offset, changes made in PostgreSQL appear as Debezium change events in Kafka, and the apply
job brings them into the warehouse, the search index and the cache."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
from rich.console import Console
from rich.table import Table

from cdc.components.redis import redis_client
from cdc.pipeline import pipe_streams, pipeline_status, sync_pipeline
from cdc.render import pipeline_table, status_table
from cdc.settings import PROJECT_ROOT, JoinView, Settings, WindowAggregate
from cdc.stack import Stack
from cdc.topics import read_topic, wait_for_records
from materializers.apply import run_apply
from materializers.stores.cache import cache_key
from snapshot.initial import run_snapshot

__all__ = ["DEMO_JOIN", "DEMO_WINDOW", "run_demo", "with_demo_views"]

TABLE = "public.customers"
# the derived data the demo keeps in the warehouse
DEMO_JOIN = JoinView(
    name="orders_enriched",
    table="public.orders",
    references="public.customers",
    on="customer_id",
    columns=["name", "email", "country"],
)
DEMO_WINDOW = WindowAggregate(name="orders_per_minute", table="public.orders", sum="total")


def with_demo_views(settings: Settings) -> Settings:
    """The settings with the demo's join view and window aggregate, unless views are set."""
    apply = settings.apply
    if apply.joins or apply.windows:
        return settings
    views = apply.model_copy(update={"joins": [DEMO_JOIN], "windows": [DEMO_WINDOW]})
    return settings.model_copy(update={"apply": views})


def run_demo(
    settings: Settings, out: Console, progress: Callable[[str], None], keep: bool = True
) -> None:
    stack = Stack(settings)
    stack.up(progress)

    progress("creating the demo schema (sql/demo_schema.sql)")
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute((PROJECT_ROOT / "sql" / "demo_schema.sql").read_text())
        count = conn.execute("SELECT count(*) FROM customers").fetchone()
        if count and count[0] == 0:
            progress("adding the demo rows (sql/demo_seed.sql)")
            with conn.transaction():
                conn.execute((PROJECT_ROOT / "sql" / "demo_seed.sql").read_text())
    settings = with_demo_views(settings)

    if pipe_streams(settings):
        progress(f"pipeline {settings.pipeline.name} already streams; checking its tables")
        sync_pipeline(settings)
    else:
        result = run_snapshot(settings, out, progress)
        out.print(
            f"initial snapshot at LSN {result.lsn}: {result.total_rows} rows in "
            f"{result.seconds:.1f}s; the connector streams from that point on"
        )

    topic = settings.pipeline.topic(TABLE)
    before = len(read_topic(settings.kafka.bootstrap_servers, topic))
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

    records = wait_for_records(settings.kafka.bootstrap_servers, topic, before + 4)
    ours = [r for r in records if r.key == {"id": row[0]}]
    table = Table(title=f"change events on Kafka topic {topic}", title_justify="left")
    for column in ("partition:offset", "key", "op", "after"):
        table.add_column(column, overflow="fold")
    for record in ours:
        value = record.value
        after = json.dumps(value.get("after")) if value else "(tombstone)"
        table.add_row(
            f"{record.partition}:{record.offset}",
            record.key_bytes.decode() if record.key_bytes else "",
            record.op or "",
            after,
        )
    out.print(table)

    progress("applying the change topics to the warehouse, the search index and the cache")
    run_apply(settings, once=True)
    entry = redis_client(settings.redis).hgetall(
        cache_key(settings.pipeline.topic_prefix, TABLE, '{"id":1}')
    )
    out.print(
        "cache entry of customer 1: "
        + json.dumps({k.decode(): v.decode() for k, v in entry.items()}, ensure_ascii=False)
    )
    out.print(status_table(stack.status()))
    out.print(pipeline_table(pipeline_status(settings)))
    if not keep:
        stack.down(progress=progress)
    else:
        progress("the stack keeps running: `cdc status`, `cdc down` to stop it")
