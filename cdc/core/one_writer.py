"""One writing process at a time, for a store that takes no more (its declaration's
`one_writer`: the warehouse on S3, where Delta's log store makes commits safe from one
Spark driver only, and two drivers committing the same version lose one's files).

The writer holds a PostgreSQL advisory lock, on a connection of its own, for as long as
it writes: every process of the pipeline reaches the source, wherever it runs, and the
lock goes with its connection when the process ends, however it ends. A second writer
is refused in one line that names the first (its connection's application_name)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import psycopg

from cdc.core.errors import SourceUnavailableError, StoreBusyError
from cdc.core.settings import Settings
from cdc.core.store_declarations import declared

__all__ = ["lock_key", "one_writer"]

_HOLDER = (
    "SELECT a.application_name FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid "
    "AND l.objid = %s::oid AND l.objsubid = 1"
)


def lock_key(settings: Settings, store: str) -> int:
    """The advisory lock's key (a signed 64-bit number) of the store of this pipeline."""
    name = f"cdc one writer:{settings.pipeline.name}:{store}".encode()
    return int.from_bytes(hashlib.sha256(name).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def one_writer(settings: Settings, store: str, who: str) -> Iterator[None]:
    """Hold the store's writer lock while the block runs, when its declaration asks for
    one writer under these settings; StoreBusyError (one line) when another
    process holds it. `who` names this one to the next (e.g. "cdc apply")."""
    declaration = declared().get(store)  # an unknown name: its maker says so
    ask = declaration.one_writer if declaration is not None else None
    why = ask(settings) if ask is not None else None
    if why is None:
        yield
        return
    key = lock_key(settings, store)
    try:
        conn = psycopg.connect(
            settings.postgres.dsn(), autocommit=True, application_name=f"{who} ({store})"
        )
    except psycopg.Error as exc:
        raise SourceUnavailableError(
            f"{store}: could not take its writer lock in PostgreSQL "
            f"({str(exc).strip().splitlines()[0]}): check `cdc status`"
        ) from None
    with conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if not (row and row[0]):
            unsigned = key & 0xFFFFFFFFFFFFFFFF
            found = conn.execute(_HOLDER, (unsigned >> 32, unsigned & 0xFFFFFFFF)).fetchone()
            holder = found[0] if found and found[0] else "another process"
            raise StoreBusyError(
                f"{store} of pipeline {settings.pipeline.name} is being written by {holder}, "
                f"and it takes one writer ({why}): stop that first, then run {who} again"
            )
        yield
