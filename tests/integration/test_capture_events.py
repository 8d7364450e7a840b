"""A Debezium connector on a table turns row changes into change events on Kafka."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from cdc.capture.connector_config import connector_config, secret_reference, wait_slot_active
from cdc.core.topics import wait_for_records
from cdc.stack.components.connect import Connect
from tests.conftest import RunningStack

pytestmark = [pytest.mark.integration, pytest.mark.pg_matrix]


def test_insert_update_delete_become_c_u_d_and_a_tombstone(stack: RunningStack) -> None:
    settings = stack.settings
    suffix = uuid.uuid4().hex[:8]
    table, prefix, slot = f"items_{suffix}", f"t{suffix}", f"slot_{suffix}"
    dsn = settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id int PRIMARY KEY, name text, qty int)")

    client = Connect(settings).client()
    name = f"conn-{suffix}"
    config = connector_config(
        settings,
        topic_prefix=prefix,
        tables=[f"public.{table}"],
        slot=slot,
        publication=f"pub_{suffix}",
    )
    # as the pipeline's connector does: Connect's config topic never holds a password
    config["database.password"] = secret_reference(
        settings, "database.password", config["database.password"], connector=name
    )
    client.put_config(name, config)
    try:
        client.wait_running(name)
        wait_slot_active(settings, slot)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {table} VALUES (7, 'seven', 1)")
            conn.execute(f"UPDATE {table} SET qty = 2 WHERE id = 7")
            conn.execute(f"DELETE FROM {table} WHERE id = 7")

        topic = f"{prefix}.public.{table}"
        records = wait_for_records(settings.kafka, topic, 4)
        assert [r.op for r in records] == ["c", "u", "d", None]
        assert all(r.key == {"id": 7} for r in records)
        assert len({r.partition for r in records}) == 1
        create, update, delete, tombstone = (r.value for r in records)
        assert create is not None and create["after"] == {"id": 7, "name": "seven", "qty": 1}
        assert update is not None and update["after"]["qty"] == 2
        assert delete is not None and delete["after"] is None and delete["before"]["id"] == 7
        assert tombstone is None
        assert create["source"]["table"] == table and create["source"]["lsn"] > 0
    finally:
        client.delete(name)
        (settings.data_dir / "connect" / "secrets" / f"{name}.properties").unlink()
        _drop_slot(dsn, slot)


def _drop_slot(dsn: str, slot: str) -> None:
    """Drop the slot once the deleted connector has let go of it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(100):
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row is None:
                return
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            time.sleep(0.2)
