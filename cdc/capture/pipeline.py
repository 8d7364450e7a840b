"""Operations on a whole pipeline's capture: make the source, topics and connector
match the settings (`cdc setup`), and drop them (`cdc drop`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from psycopg import sql

from cdc.capture.connect import connect_client
from cdc.capture.role import drop_role, other_pipelines, sync_grants
from cdc.capture.slot import drop_slot
from cdc.capture.snapshots import forget
from cdc.capture.source import admin_connection, drop_publication
from cdc.catalog import published_tables
from cdc.identity import current_relations, recorded
from cdc.settings import Settings
from cdc.topics import change_topic_spec, pipeline_topic_specs, set_topic_configs

__all__ = ["SyncResult", "drop_pipeline", "drop_replication_role", "pipe_streams", "sync_pipeline"]


@dataclass
class SyncResult:
    tables: list[str]
    added: list[str]
    removed: list[str]
    topics_created: list[str]
    backfills: list[str]  # tables whose backfill was requested
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (captured as, now)
    recreated: list[str] = field(default_factory=list)  # dropped and created again


def _captured_before(settings: Settings) -> dict[int, str]:
    """The relations the pipeline captured (OID -> name), as recorded, or for a pipeline
    set up before they were recorded, as its publication holds them now."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        has = recorded(conn, pipe.name)
        if has is not None:
            return has
        return current_relations(conn, published_tables(conn, pipe.publication))


def sync_pipeline(settings: Settings) -> SyncResult:
    """Make the source, topics and connector match the settings' tables (idempotent).

    On a streaming pipeline, a table that is new to it is captured from now on and
    backfilled (Debezium incremental snapshot); a table no longer selected stops being
    captured (its topic stays, as a copy of what was). A captured table renamed since is
    a new table under its new name (backfilled; the stores keep what they hold under
    the old one). A table dropped and created again under a captured name is cut first,
    as a TRUNCATE would be (every store drops the old table's rows), then backfilled.
    """
    from cdc.capture.backfill import start_backfill
    from cdc.capture.connector import register_connector
    from cdc.capture.source import prepare_source
    from cdc.catalog import TRUNCATIONS_TABLE
    from cdc.topics import ensure_topics

    before = _captured_before(settings)
    tables = prepare_source(settings)
    names = [t.qualified for t in tables]
    with admin_connection(settings) as conn:
        now = current_relations(conn, names)
    created = ensure_topics(
        settings.kafka,
        pipeline_topic_specs(settings.pipeline, [t.qualified for t in tables]),
    )
    renamed = sorted(
        (before[oid], name) for oid, name in now.items() if before.get(oid, name) != name
    )
    recreated = sorted(
        name for oid, name in now.items() if oid not in before and name in before.values()
    )
    oids = {name: oid for oid, name in now.items()}
    added = [t for t in names if before and before.get(oids.get(t, -1)) != t]
    removed = [t for t in before.values() if t not in names]
    # a renamed table's topic, made by Kafka Connect uncompacted (cdc/capture/connector.py)
    set_topic_configs(settings.kafka, [change_topic_spec(settings.pipeline, n) for _, n in renamed])
    backfills = []
    streams = pipe_streams(settings)
    if streams and (added or removed) and recreated:
        # the old table's rows leave every store at this point, before the backfill
        with admin_connection(settings) as conn:
            for name in recreated:
                conn.execute(
                    sql.SQL("INSERT INTO {} (table_name) VALUES (%s)").format(
                        sql.Identifier(*TRUNCATIONS_TABLE.split("."))
                    ),
                    (name,),
                )
            conn.commit()
    if streams:  # its tables, or another setting (kafka.max_message_bytes…): the same
        # configuration is left alone, another one restarts the task where it stopped
        register_connector(settings, tables)
        for table in added:
            start_backfill(settings, table)
            backfills.append(table)
    return SyncResult(names, added, removed, created, backfills, renamed, recreated)


def pipe_streams(settings: Settings) -> bool:
    return settings.pipeline.connector in connect_client(settings).connectors()


def drop_pipeline(settings: Settings) -> list[str]:
    """Remove the connector, its offsets, the slot and the publication; the topics stay.
    Returns what went.

    Connect keeps a deleted connector's offsets under its name, and a connector created
    with that name later would resume from them, before its own slot: they are removed
    first (the connector stopped, its offsets reset). The next snapshot sets the offset of
    its connector in any case (a generation starts at its slot's consistent point).
    """
    pipe = settings.pipeline
    gone = []
    client = connect_client(settings)
    if pipe.connector in client.connectors():
        client.stop(pipe.connector)
        client.wait_stopped(pipe.connector)
        client.reset_offsets(pipe.connector)
        client.delete(pipe.connector)
        gone.append(f"connector {pipe.connector} and its offsets")
        time.sleep(0.5)
    with admin_connection(settings) as conn:
        conn.autocommit = True
        if drop_slot(conn, pipe.slot):
            gone.append(f"slot {pipe.slot}")
        if conn.execute("SELECT to_regclass('cdc.snapshots') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
            forget(conn, pipe.name)
        if recorded(conn, pipe.name) is not None:
            conn.execute("DELETE FROM cdc.captured WHERE pipeline = %s", (pipe.name,))
    if drop_publication(settings):
        gone.append(f"publication {pipe.publication}")
    with admin_connection(settings) as conn:
        # the role keeps SELECT only on what other pipelines still capture
        revoked = sync_grants(conn, pipe.replication_user, [], pipe.publication)
        if revoked:
            gone.append(f"{pipe.replication_user}'s SELECT on {', '.join(revoked)}")
    return gone


def drop_replication_role(settings: Settings) -> tuple[bool, list[str]]:
    """Drop the replication role unless a pipeline is still set up on the database.
    Returns whether it went, and the pipelines' publications that kept it."""
    with admin_connection(settings) as conn:
        others = other_pipelines(conn, settings.pipeline.replication_user)
        if others:
            return False, others
        return drop_role(conn, settings), []
