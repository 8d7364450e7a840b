"""The replication slot, created with an exported snapshot: the seam between snapshot and stream.

`CREATE_REPLICATION_SLOT … LOGICAL pgoutput (SNAPSHOT 'export')` returns the
slot's consistent point and the name of a snapshot that sees exactly the
transactions committed before it. The snapshot stays importable while the
replication connection that created it is open and idle, so the connection
is held until every reader has attached (SET TRANSACTION SNAPSHOT).

Creating a logical slot waits for the transactions already in flight (those
holding a transaction id) to end; while it waits, `on_wait` is told which.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc.core.errors import SourceError

__all__ = [
    "InFlight",
    "SnapshotPoint",
    "drop_slot",
    "exported_snapshot",
    "int_to_lsn",
    "lsn_to_int",
    "slot_lost",
    "slot_state",
    "standby_slots",
]


@dataclass(frozen=True)
class SnapshotPoint:
    """Where the snapshot sits in the log: the slot's consistent point, and when it was
    taken. `order`: its rows' position is (lsn, order): 0 for the snapshot's own rows, 1
    for those a resumed snapshot reads (cdc/capture/snapshot/initial.py), after the
    first run's and before every change streamed after the point."""

    lsn: int
    ts_ms: int
    snapshot_name: str
    order: int = 0

    def source_position(self) -> dict[str, object]:
        """The `source` block's `lsn` and `sequence` that give a row this position as
        every decoder reads it (cdc/log/envelope.py): `lsn` alone for order 0, as
        Debezium's own snapshot rows; else a sequence and no `lsn`, as Debezium's
        backfill rows."""
        if self.order == 0:
            return {"lsn": self.lsn, "sequence": None}
        return {
            "lsn": None,
            "sequence": json.dumps([str(self.lsn), str(self.order)], separators=(",", ":")),
        }


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def lsn_to_int(lsn: str) -> int:
    """'16/B374D848' -> the 64-bit WAL position Debezium writes as source.lsn."""
    high, low = lsn.split("/")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True)
class InFlight:
    """A transaction the slot creation waits for."""

    pid: int
    user: str
    application: str
    seconds: float
    query: str

    def __str__(self) -> str:
        app = f" ({self.application})" if self.application else ""
        return f"pid {self.pid} of {self.user}{app}, open {self.seconds:.0f}s: {self.query}"


def slot_state(conn: psycopg.Connection[Any], slot: str) -> tuple[bool, int | None] | None:
    """(active, active_pid) of the slot, or None if it does not exist."""
    row = conn.execute(
        "SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return (bool(row[0]), row[1]) if row else None


def slot_lost(conn: psycopg.Connection[Any], slot: str) -> bool:
    """PostgreSQL invalidated the slot (`wal_status` lost): the WAL after its last
    confirmed position is gone, and no connector can stream from it."""
    row = conn.execute(
        "SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    return bool(row and row[0])


def drop_slot(conn: psycopg.Connection[Any], slot: str, wait: float = 30.0) -> bool:
    """Drop the slot once nothing uses it. Returns False if it did not exist."""
    deadline = time.monotonic() + wait
    while True:
        state = slot_state(conn, slot)
        if state is None:
            return False
        active, pid = state
        if not active:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return True
        if time.monotonic() > deadline:
            raise SourceError(
                f"replication slot {slot} is in use by pid {pid}; stop its consumer "
                "(the connector: `cdc drop`) before dropping it"
            )
        time.sleep(0.2)


def _in_flight(conn: psycopg.Connection[Any], exclude_pid: int) -> list[InFlight]:
    rows = conn.execute(
        "SELECT pid, coalesce(usename, ''), coalesce(application_name, ''), "
        "extract(epoch FROM now() - xact_start)::float, "
        "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) "
        "FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> %s "
        "AND pid <> pg_backend_pid() ORDER BY xact_start",
        (exclude_pid,),
    ).fetchall()
    return [InFlight(*row) for row in rows]


@contextmanager
def exported_snapshot(
    replication_dsn: str,
    admin_dsn: str,
    slot: str,
    on_wait: Callable[[list[InFlight]], None] = lambda _: None,
) -> Iterator[SnapshotPoint]:
    """Create `slot` with an exported snapshot; yield its point while the snapshot is valid."""
    try:
        conn = psycopg.connect(replication_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        if "replication" in str(exc) or "password" in str(exc):
            raise SourceError(
                f"the replication role cannot open a replication connection ({str(exc).strip()}); "
                "run `cdc setup` to create it, and check pg_hba.conf allows replication for it "
                "(on the local stack, `cdc up` with these settings admits their database)"
            ) from None
        raise
    waiting = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(admin_dsn, conn.info.backend_pid, waiting, on_wait), daemon=True
    )
    try:
        watcher.start()
        cur = psycopg.ClientCursor(conn)
        try:
            cur.execute(_create_slot(slot, conn.info.server_version))
        except psycopg.errors.DuplicateObject:
            raise SourceError(
                f"replication slot {slot} already exists; `cdc snapshot` drops an unused one "
                "itself: is another snapshot or connector using it?"
            ) from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise SourceError(
                f"the replication role may not create slots ({exc.diag.message_primary}); "
                "it needs the REPLICATION attribute: run `cdc setup`"
            ) from None
        finally:
            waiting.set()
        row = cur.fetchone()
        assert row is not None
        _, consistent_point, snapshot_name, _ = row
        yield SnapshotPoint(
            lsn=lsn_to_int(consistent_point),
            ts_ms=int(time.time() * 1000),
            snapshot_name=snapshot_name,
        )
    finally:
        waiting.set()
        conn.close()


def _create_slot(slot: str, server_version: int) -> str:
    """The replication command that makes `slot` with an exported snapshot: on
    PostgreSQL 17+ a failover slot, which a standby with sync_replication_slots keeps in
    step, so that capture goes on from it once promoted; before 15, the old syntax."""
    if server_version < 150000:
        return f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput EXPORT_SNAPSHOT"
    failover = ", FAILOVER true" if server_version >= 170000 else ""
    return f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput (SNAPSHOT 'export'{failover})"


def _watch(
    admin_dsn: str,
    exclude_pid: int,
    done: threading.Event,
    on_wait: Callable[[list[InFlight]], None],
) -> None:
    """Tell on_wait what the slot creation waits for, once a second, until it is done."""
    if done.wait(1.0):
        return
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        while not done.is_set():
            blockers = _in_flight(conn, exclude_pid)
            if blockers and not done.is_set():
                on_wait(blockers)
            done.wait(1.0)


# what brings back a pipeline whose slot PostgreSQL invalidated: a new generation
RESNAPSHOT = (
    "run `cdc resync` (a new slot, and only the gap mended in every store from the source), "
    "or take a new snapshot: `cdc drop`, then `cdc snapshot`"
)
# what to do about a slot that retains too much WAL
WAL_ADVICE = "fix the connector, or `cdc drop` an abandoned pipeline"


def slot_row(
    conn: Any, slot: str, warn_bytes: int, standbys: list[dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The slot as `cdc status` shows it, with its health; None if there is no slot.

    The row goes through to_jsonb, so columns of newer servers (`conflicting` from
    PostgreSQL 16; `invalidation_reason`, `inactive_since` and `failover` from 17) come
    when the server has them, and 18's `idle_replication_slot_timeout` when it is set.
    With it: the primary's physical slots (its standbys') and which of them
    `synchronized_standby_slots` names (17+), and `standbys`, the slot as each configured
    standby holds it (standby_slots)."""
    row = conn.execute(
        "SELECT to_jsonb(s) || jsonb_build_object("
        "'wal_retained_bytes', pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint, "
        "'max_slot_wal_keep_size', current_setting('max_slot_wal_keep_size'), "
        "'idle_timeout_s', (SELECT setting::bigint * CASE unit WHEN 'min' THEN 60 "
        "WHEN 'h' THEN 3600 WHEN 'd' THEN 86400 ELSE 1 END FROM pg_settings "
        "WHERE name = 'idle_replication_slot_timeout'), "
        "'idle_s', extract(epoch FROM now() - (to_jsonb(s) ->> 'inactive_since')::timestamptz), "
        "'synchronized_standby_slots', current_setting('synchronized_standby_slots', true), "
        "'physical_slots', (SELECT coalesce(jsonb_agg(p.slot_name ORDER BY p.slot_name), "
        "'[]') FROM pg_replication_slots p WHERE p.slot_type = 'physical')) "
        "FROM pg_replication_slots s WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    found: dict[str, Any] = row[0]
    info = {
        "name": slot,
        "active": found.get("active"),
        "wal_retained_bytes": found.get("wal_retained_bytes"),
        "confirmed_flush_lsn": found.get("confirmed_flush_lsn"),
        "wal_status": found.get("wal_status"),
        "safe_wal_size": found.get("safe_wal_size"),
        "max_slot_wal_keep_size": found.get("max_slot_wal_keep_size"),
        "invalidation_reason": found.get("invalidation_reason"),
        "conflicting": found.get("conflicting"),
        "failover": found.get("failover"),
        "idle_replication_slot_timeout_s": found.get("idle_timeout_s") or None,
        "idle_s": None if found.get("active") else found.get("idle_s"),
        "warn_bytes": warn_bytes,
        "physical_slots": found.get("physical_slots") or [],
        "synchronized_standby_slots": found.get("synchronized_standby_slots"),
        "standbys": standbys or [],
    }
    info["health"], info["problem"] = slot_health(info, warn_bytes)
    return info


def standby_slots(
    addresses: list[str], dsn: Callable[[str], str], slot: str
) -> list[dict[str, Any]]:
    """The slot as each standby at `addresses` (host:port; `dsn(address)` connects to it)
    holds it: a failover slot the standby's slot sync worker keeps (PostgreSQL 17+,
    `sync_replication_slots`) is there with `synced` true, and a promoted standby's
    pipeline streams from it without a new snapshot."""
    found = []
    for address in addresses:
        entry: dict[str, Any] = {"address": address, "error": None}
        try:
            with psycopg.connect(dsn(address), connect_timeout=3) as conn:
                row = conn.execute(
                    "SELECT pg_is_in_recovery(), (SELECT to_jsonb(s) FROM "
                    "pg_replication_slots s WHERE slot_name = %s)",
                    (slot,),
                ).fetchone()
        except psycopg.Error as exc:
            entry["error"] = str(exc).strip().splitlines()[0][:160] if str(exc) else "error"
            found.append(entry)
            continue
        assert row is not None
        held = row[1] or {}
        entry.update(
            in_recovery=row[0],
            has_slot=bool(held),
            synced=held.get("synced"),
            confirmed_flush_lsn=held.get("confirmed_flush_lsn"),
            invalidation_reason=held.get("invalidation_reason"),
        )
        found.append(entry)
    return found


def failover_problem(slot: Mapping[str, Any]) -> str | None:
    """What puts a failover to a standby at risk, or None: a standby's physical slot that
    `synchronized_standby_slots` does not name (the connector may then get changes that
    standby lacks: after promoting it, the stores would hold changes it lost, and it would
    skip its own up to the connector's position), a slot that is not a failover slot, or
    a configured standby that does not hold it synchronized."""
    name = slot.get("name", "?")
    physical = list(slot.get("physical_slots") or [])
    named = {
        n.strip().strip('"')
        for n in str(slot.get("synchronized_standby_slots") or "").split(",")
        if n.strip()
    }
    standbys = list(slot.get("standbys") or [])
    if physical and slot.get("failover") is False:
        return (
            f"slot {name} is not a failover slot, and standbys stream from this server "
            f"({', '.join(physical)}): a promoted standby would not have it, and the pipeline "
            "would need a new snapshot; `cdc drop` and `cdc snapshot` make one "
            "(docs/operations.md, Failover)"
        )
    unnamed = [p for p in physical if p not in named]
    if slot.get("failover") and unnamed and slot.get("synchronized_standby_slots") is not None:
        listed = ", ".join(unnamed)
        return (
            f"synchronized_standby_slots does not name the physical slot(s) {listed}: the "
            "connector may get changes a standby lacks, and after promoting it the stores "
            "would hold changes it lost; set synchronized_standby_slots on this server to "
            "the standbys' slots (docs/operations.md, Failover)"
        )
    for standby in standbys:
        where = f"standby {standby['address']}"
        if standby.get("error"):
            return f"{where} does not answer ({standby['error']}); check postgres.standbys"
        if not standby.get("in_recovery"):
            return f"{where} is not in recovery: it is a primary, not a standby of this server"
        if not standby.get("has_slot") or not standby.get("synced"):
            return (
                f"{where} does not hold slot {name} synchronized: a failover to it would "
                "need a new snapshot; set sync_replication_slots = on, hot_standby_feedback "
                "= on, primary_slot_name and a dbname in primary_conninfo on it "
                "(docs/operations.md, Failover)"
            )
        if standby.get("invalidation_reason"):
            return (
                f"{where} holds slot {name}, but invalidated "
                f"({standby['invalidation_reason']}): a failover to it would need a new snapshot"
            )
    return None


def _duration(seconds: float) -> str:
    """A duration for people: 45s, 12m, 3.5h, 2.0d."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def wal_size(n: float) -> str:
    """A size of WAL for people: 512 B, 3.0 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_INVALIDATED = {
    "wal_removed": "it retained more WAL than max_slot_wal_keep_size{limit}",
    "rows_removed": "rows it needed were removed (a conflict on a standby)",
    "wal_level_insufficient": "wal_level is no longer logical",
    "idle_timeout": "it was idle longer than idle_replication_slot_timeout",
}


def slot_health(slot: Mapping[str, Any], warn_bytes: int) -> tuple[str, str | None]:
    """("ok", None), ("warning", what to do) or ("failed", what to do) for a slot row.

    Failed: PostgreSQL invalidated the slot (`wal_status` lost; `invalidation_reason` on
    PostgreSQL 17+; `conflicting` on 16+): the changes it kept are gone, only a new
    snapshot brings the pipeline back. Warning: it retains more WAL than `warn_bytes`
    (0: never), or its WAL is no longer reserved (lost at the next checkpoint)."""
    name = slot.get("name", "?")
    keep = slot.get("max_slot_wal_keep_size")
    limit = f" ({keep})" if keep not in (None, "-1") else ""
    reason = slot.get("invalidation_reason")
    if slot.get("wal_status") == "lost" or reason or slot.get("conflicting"):
        if reason is None and slot.get("conflicting"):
            reason = "rows_removed"
        why = _INVALIDATED.get(reason or "wal_removed", f"invalidation reason {reason}")
        since = slot.get("confirmed_flush_lsn")
        return "failed", (
            f"slot {name} is lost: PostgreSQL invalidated it ({why.format(limit=limit)}); "
            f"the changes after {since or 'its last confirmed position'} are gone and the "
            f"connector cannot stream; {RESNAPSHOT}"
        )
    retained = slot.get("wal_retained_bytes")
    safe = slot.get("safe_wal_size")
    if slot.get("wal_status") == "unreserved":
        return "warning", (
            f"slot {name} retains WAL past max_slot_wal_keep_size{limit}: PostgreSQL "
            "invalidates it at the next checkpoint unless the connector catches up; " + WAL_ADVICE
        )
    idle, timeout = slot.get("idle_s"), slot.get("idle_replication_slot_timeout_s")
    if idle is not None and timeout and idle > timeout / 2:
        return "warning", (
            f"slot {name} has been idle for {_duration(idle)}: PostgreSQL invalidates it "
            f"once idle longer than idle_replication_slot_timeout ({_duration(timeout)}), "
            "and the pipeline then needs a new snapshot; start the connector, or `cdc drop` "
            "an abandoned pipeline"
        )
    if warn_bytes > 0 and retained is not None and retained > warn_bytes:
        if safe is not None:
            at_risk = f"; PostgreSQL invalidates the slot after {wal_size(max(safe, 0))} more"
        elif keep == "-1":
            at_risk = ", and nothing limits it (max_slot_wal_keep_size -1): the disk can fill"
        else:
            at_risk = ""
        return "warning", (
            f"slot {name} retains {wal_size(retained)} of WAL, more than "
            f"pipeline.wal_retained_warn_bytes ({wal_size(warn_bytes)}){at_risk}; " + WAL_ADVICE
        )
    risk = failover_problem(slot)
    if risk is not None:
        return "warning", risk
    return "ok", None
