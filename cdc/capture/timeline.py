"""Where each timeline the source descends from was left (a restore to a point in time,
a promoted standby writes on a new timeline), read as the replication role."""

from __future__ import annotations

import psycopg

from cdc.capture.source_setup import replication_dsn
from cdc.core.errors import SourceError, SourceUnavailableError
from cdc.core.settings import Settings

__all__ = ["parse_timeline_history", "timeline_forks"]


def timeline_forks(settings: Settings, timeline: int) -> dict[int, int]:
    """Per timeline the current one descends from, where it left it: the first WAL
    position (as an int) not on it. Read with the replication protocol's
    TIMELINE_HISTORY, as the replication role (no superuser needed)."""
    if timeline <= 1:
        return {}
    try:
        with psycopg.connect(
            replication_dsn(settings, replication=True), connect_timeout=5
        ) as conn:
            result = conn.pgconn.exec_(f"TIMELINE_HISTORY {int(timeline)}".encode())
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                message = (result.error_message or b"").decode(errors="replace").strip()
                raise SourceError(f"could not read timeline {timeline}'s history: {message}")
            content = result.get_value(0, 1) or b""
    except psycopg.OperationalError as exc:
        pg = settings.postgres
        raise SourceUnavailableError(
            f"PostgreSQL at {pg.host}:{pg.port} does not answer ({str(exc).strip()[:120]})"
        ) from None
    if content.startswith(b"\\x"):  # bytea in its hex text form
        content = bytes.fromhex(content[2:].decode())
    return parse_timeline_history(content.decode())


def parse_timeline_history(text: str) -> dict[int, int]:
    """A timeline history file's lines, "parent<TAB>X/Y<TAB>reason": per parent timeline,
    the WAL position where its child left it."""
    forks = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[0].isdigit():
            continue  # a comment or a blank line
        high, low = fields[1].split("/")
        forks[int(fields[0])] = (int(high, 16) << 32) + int(low, 16)
    return forks
