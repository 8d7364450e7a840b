"""Operations on a whole pipeline's capture: make the source, topics and connector
match the settings (`cdc setup`), and drop them (`cdc drop`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from cdc.capture import pending
from cdc.capture.connect_client import connect_client
from cdc.capture.role import drop_role, other_pipelines, sync_grants
from cdc.capture.slot import drop_slot
from cdc.capture.snapshot.record import forget
from cdc.capture.source_setup import drop_publication
from cdc.core.catalog import published_tables, selected_tables, unstreamed_note
from cdc.core.errors import ConnectorError
from cdc.core.identity import current_relations, recorded
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings
from cdc.core.store_declarations import declared
from cdc.core.topics import change_topic, change_topic_spec, pipeline_topic_specs, set_topic_configs

__all__ = ["SyncResult", "drop_pipeline", "drop_replication_role", "pipe_streams", "sync_pipeline"]


@dataclass
class SyncResult:
    tables: list[str]
    added: list[str]
    removed: list[str]
    topics_created: list[str]
    backfills: list[str]  # tables whose backfill was requested
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (captured as, now)
    recreated: list[str] = field(default_factory=list)  # cut before its backfill (pending.py)
    stores: list[str] = field(default_factory=list)  # what the stores' setup said
    notes: list[str] = field(default_factory=list)  # columns not captured (unstreamed_note)


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
    the old one). A table under whose name the stores may hold rows not its own (created
    again, swapped, added back: pending.py) is cut first, as a TRUNCATE would be (every
    store drops the rows it held), then backfilled.
    That work is recorded with the new capture set and done afterwards (pending.py): a
    setup that stopped before it was done is finished by this one.
    """
    from cdc.capture.backfill import start_backfill
    from cdc.capture.connector_config import register_connector
    from cdc.capture.source_setup import prepare_source
    from cdc.core.topics import ensure_topics

    pipe = settings.pipeline
    # the stores first: one that cannot keep the pipeline refuses before anything changes
    with admin_connection(settings) as conn:
        said = setup_stores(settings, selected_tables(conn, pipe))
    before = _captured_before(settings)
    tables = prepare_source(settings, before)
    notes = [note for t in tables if (note := unstreamed_note(t))]
    names = [t.qualified for t in tables]
    with admin_connection(settings) as conn:
        now = current_relations(conn, names)
    created = ensure_topics(settings.kafka, pipeline_topic_specs(pipe, names))
    changed = pending.owed(before, now, names)
    removed = [t for t in before.values() if t not in names]
    # a renamed table's topic, made by Kafka Connect uncompacted (cdc/capture/connector_config.py)
    set_topic_configs(settings.kafka, [change_topic_spec(pipe, n) for _, n in changed.renamed])
    streams = pipe_streams(settings)
    with admin_connection(settings) as conn:
        if not streams:  # its snapshot reads every table
            pending.clear(conn, pipe.name)
            conn.commit()
            return SyncResult(
                names,
                changed.added,
                removed,
                created,
                [],
                changed.renamed,
                stores=said,
                notes=notes,
            )
        owed = pending.pending(conn, pipe.name)
        for table in [t for t, work in owed if work == pending.CUT]:
            # the old table's rows leave every store at this point, before the backfill:
            # the cut and its record's removal commit together, so it is made once
            if table in names:
                pending.cut(conn, table)
            pending.done(conn, pipe.name, table, pending.CUT)
            conn.commit()
    # its tables, or another setting (kafka.max_message_bytes…): the same configuration
    # is left alone, another one restarts the task where it stopped
    masked_before = _connector_masks(settings)
    register_connector(settings, tables)
    backfills = []
    for table in [t for t, work in owed if work == pending.BACKFILL]:
        if table in names:  # (one no longer selected is not captured)
            start_backfill(settings, table, acknowledge=False)
            backfills.append(table)
        with admin_connection(settings) as conn:
            pending.done(conn, pipe.name, table, pending.BACKFILL)
            conn.commit()
    # a table whose masks the connector changed now (added, removed, or another mode):
    # the log and the stores hold its rows as the connector masked them until now (a
    # mask added since: in plain); each is written again as it masks them now
    masked_now = _connector_masks(settings)
    for table in names:
        topic = change_topic(pipe, table)
        if masked_before.get(topic) != masked_now.get(topic) and table not in backfills:
            start_backfill(settings, table, acknowledge=False)
            backfills.append(table)
    recreated = [t for t, work in owed if work == pending.CUT and t in names]
    return SyncResult(
        names, backfills, removed, created, backfills, changed.renamed, recreated, said, notes
    )


def setup_stores(settings: Settings, tables: list[str]) -> list[str]:
    """Each store of apply.stores checks or keeps what it needs for `tables` (its
    declaration's `setup`); what they say. A store that cannot keep them raises."""
    known = declared()
    said: list[str] = []
    for name in settings.apply.stores:
        hook = known[name].setup if name in known else None
        if hook is not None:
            said += hook(settings, tables)
    return said


def _connector_masks(settings: Settings) -> dict[str, Any]:
    """Per change topic, the columns the running connector masks and how ({} for a topic
    of no mask; nothing when it masks no column, or does not exist)."""
    try:
        config = connect_client(settings).config(settings.pipeline.connector)
    except ConnectorError:  # not there yet
        return {}
    masks = json.loads(config.get("transforms.mask.masks") or "{}").get("topics") or {}
    return {topic: columns for topic, columns in masks.items() if columns}


def pipe_streams(settings: Settings) -> bool:
    return settings.pipeline.connector in connect_client(settings).connectors()


def _has(conn: Any, table: str) -> bool:
    """Whether the source has `table` (an older setup may not have made it)."""
    return bool(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0])


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
    # PostgreSQL and Connect are both reached before anything goes: a drop that could
    # not finish would leave the slot keeping WAL for a connector that is gone
    with admin_connection(settings) as conn:
        conn.autocommit = True
        client = connect_client(settings)
        if pipe.connector in client.connectors():
            client.stop(pipe.connector)
            client.wait_stopped(pipe.connector)
            client.reset_offsets(pipe.connector)
            client.delete(pipe.connector)
            gone.append(f"connector {pipe.connector} and its offsets")
            time.sleep(0.5)
        if drop_slot(conn, pipe.slot):
            gone.append(f"slot {pipe.slot}")
        if _has(conn, "cdc.snapshots"):
            forget(conn, pipe.name)
        if recorded(conn, pipe.name) is not None:
            conn.execute("DELETE FROM cdc.captured WHERE pipeline = %s", (pipe.name,))
            if _has(conn, "cdc.pending"):
                pending.clear(conn, pipe.name)
            if _has(conn, "cdc.acknowledged"):
                conn.execute("DELETE FROM cdc.acknowledged WHERE pipeline = %s", (pipe.name,))
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
