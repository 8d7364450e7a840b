"""A plain connection to the source as the configured (administrative) user, and what a
refused or failed connection means, said in one line."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc.core.errors import SourceError, SourceUnavailableError
from cdc.core.settings import Settings

__all__ = ["admin_connection", "connect_error", "ping_source"]


def admin_connection(settings: Settings) -> psycopg.Connection[Any]:
    """A connection as the configured (administrative) PostgreSQL user."""
    pg = settings.postgres
    try:
        return psycopg.connect(pg.dsn(), connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise connect_error(settings, pg.user, exc) from None


def connect_error(settings: Settings, user: str, exc: Exception) -> Exception:
    text = str(exc)
    pg = settings.postgres
    if "password authentication failed" in text:
        return SourceError(
            f"PostgreSQL at {pg.host}:{pg.port} refused the password of user {user}: "
            "fix the password setting (CDC_POSTGRES__PASSWORD or cdc.toml)"
        )
    if "pg_hba.conf" in text:
        return SourceError(
            f"PostgreSQL at {pg.host}:{pg.port} does not admit user {user} to database "
            f"{pg.database} (pg_hba.conf): on the local stack run `cdc up` with these "
            "settings (it admits each pipeline's database); on a server of your own, add "
            "a pg_hba.conf line for it"
        )
    if "does not exist" in text and "database" in text:
        return SourceError(
            f"database {pg.database} does not exist: create it or fix postgres.database"
        )
    return SourceUnavailableError(
        f"PostgreSQL at {pg.host}:{pg.port} does not answer; start it (`cdc up`) or fix "
        "postgres.host/port"
    )


def ping_source(settings: Settings) -> None:
    """Raises SourceUnavailableError while PostgreSQL does not answer."""
    admin_connection(settings).close()
