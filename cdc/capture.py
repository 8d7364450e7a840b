"""The Debezium PostgreSQL connector: its configuration, and waiting for it to stream."""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg

from cdc.components.connect import DEBEZIUM_POSTGRES
from cdc.errors import ConnectorError
from cdc.settings import Settings

__all__ = ["connector_config", "wait_slot_active"]


def connector_config(
    settings: Settings,
    *,
    topic_prefix: str,
    tables: Sequence[str],
    slot: str,
    publication: str,
    snapshot_mode: str = "no_data",
) -> dict[str, str]:
    """Configuration of a Debezium connector capturing `tables` ("schema.table")."""
    pg = settings.postgres
    return {
        "connector.class": DEBEZIUM_POSTGRES,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": pg.connector_host or pg.host,
        "database.port": str(pg.connector_port or pg.port),
        "database.user": pg.user,
        "database.password": pg.password.get_secret_value(),
        "database.dbname": pg.database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(_regex_literal(t) for t in tables),
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": snapshot_mode,
        # a delete is followed by a tombstone so that compaction can drop the key
        "tombstones.on.delete": "true",
        # exact values: decimals as strings, times to the microsecond
        "decimal.handling.mode": "string",
        "time.precision.mode": "adaptive_time_microseconds",
        "interval.handling.mode": "string",
        "hstore.handling.mode": "json",
        "heartbeat.interval.ms": "10000",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        "topic.creation.default.cleanup.policy": "compact",
    }


def _regex_literal(table: str) -> str:
    """table.include.list takes regular expressions: match this name exactly."""
    return table.replace(".", r"\.")


def wait_slot_active(settings: Settings, slot: str, timeout: float = 60.0) -> None:
    """Wait until the connector streams from its replication slot.

    Changes committed before the slot exists are not captured, so callers wait
    for this before they write.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row and row[0]:
                return
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"replication slot {slot} is not streaming after {timeout:.0f}s; "
                    "check `cdc status` and the Connect log"
                )
            time.sleep(0.2)
