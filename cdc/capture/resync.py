"""After a lost slot: a new slot and streaming from it, with no new snapshot (`cdc resync`).

PostgreSQL invalidated the pipeline's slot (`wal_status` lost: past
`max_slot_wal_keep_size`, an idle timeout, a standby's conflict), so the changes
committed since its last confirmed position are gone from the log. What the stores
lack is only what changed in that gap, and the source still holds the result:

1. the connector is stopped, the lost slot dropped and a new one made (a failover slot
   on PostgreSQL 17+), at a consistent point of its own;
2. the connector streams from that point (its offset set to it), so every change
   committed after it reaches the stores as usual;
3. the caller (`cdc resync`) then reconciles every store with the source at a cut
   (cdc/check: verify, then repair): a key changed or inserted in the gap is
   backfilled through the log, a key deleted in it is removed from the stores.

The stores' history and the log-fed views do not see the gap's changes one by one: a
key's repair is one version, at the time of its backfill (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import register_connector
from cdc.capture.slot import drop_slot, exported_snapshot, int_to_lsn, slot_lost, slot_state
from cdc.capture.snapshot.record import read_state
from cdc.capture.source_reader import captured_tables
from cdc.capture.source_setup import replication_dsn
from cdc.core.errors import SnapshotError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings

__all__ = ["ResyncResult", "resync_slot"]


@dataclass(frozen=True)
class ResyncResult:
    lsn: str  # the new slot's consistent point: streaming goes on from here
    lost_at: str | None  # the lost slot's last confirmed position: the gap began after it


def resync_slot(settings: Settings, say: Say = quiet) -> ResyncResult:
    """Steps 1 and 2 of the module doc; refuses a pipeline whose slot is not lost."""
    pipe = settings.pipeline
    with admin_connection(settings) as conn:
        conn.autocommit = True
        state = read_state(conn, pipe.name)
        if state is None or state.status != "done":
            raise SnapshotError(
                f"pipeline {pipe.name} has no complete snapshot: `cdc snapshot` takes it "
                "(`cdc resync` mends a pipeline whose slot was lost after its snapshot)"
            )
        if slot_state(conn, pipe.slot) is not None and not slot_lost(conn, pipe.slot):
            raise SnapshotError(
                f"slot {pipe.slot} of pipeline {pipe.name} is not lost: the pipeline streams "
                "from it, and `cdc resync` would only skip changes; `cdc verify --repair` "
                "mends a store that drifted"
            )
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (pipe.slot,),
        ).fetchone()
        lost_at = row[0] if row else None
    tables = list(captured_tables(settings).values())
    client = connect_client(settings)
    if pipe.connector in client.connectors():
        say(f"stopping connector {pipe.connector}")
        client.stop(pipe.connector)
        client.wait_stopped(pipe.connector)
    with admin_connection(settings) as conn:
        conn.autocommit = True
        if drop_slot(conn, pipe.slot):
            say(f"dropped the lost slot {pipe.slot} (its last confirmed position {lost_at})")
    say(f"creating slot {pipe.slot} again")
    with exported_snapshot(
        replication_dsn(settings, replication=True), settings.postgres.dsn(), pipe.slot
    ) as point:  # its snapshot is not read: the stores are mended from the source instead
        lsn = int_to_lsn(point.lsn)
    say(f"connector {pipe.connector} streams from the new slot's point {lsn}")
    register_connector(settings, tables, start_lsn=point.lsn, start_ts_ms=point.ts_ms)
    return ResyncResult(lsn=lsn, lost_at=lost_at)
