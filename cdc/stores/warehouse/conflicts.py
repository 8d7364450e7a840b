"""Other writers on the warehouse's tables, as Spark's Delta writes meet them.

People OPTIMIZE, VACUUM, DELETE from and UPDATE the warehouse's tables while `cdc apply`
runs, and `cdc verify --repair` removes rows from them (docs/stores.md). Delta's
optimistic concurrency then refuses one of two commits that touched the same files: the
loser raises a concurrent-modification error and commits nothing. A Spark write that
loses is run again here, on the table's newest version (a MERGE of the write rule is
right on any version), a few times; after that the error goes up, the batch fails and
its query starts again from its checkpoint, which holds nothing of it. So a write that
lost is never counted as written. delta-rs's writes meet the same in native.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["SPARK_RETRIES", "lost_conflict", "retried"]

log = logging.getLogger(__name__)

# how many times a Spark write that lost a commit conflict is run again
SPARK_RETRIES = 5

T = TypeVar("T")

# the error classes of Delta's commit conflicts (Spark carries them as text: PySpark does
# not always raise delta.exceptions' classes for them)
_CONFLICTS = ("[DELTA_CONCURRENT_", "[DELTA_METADATA_CHANGED", "[DELTA_PROTOCOL_CHANGED")


def lost_conflict(exc: BaseException) -> bool:
    """Whether `exc` is a Delta commit that lost to another writer's (nothing committed)."""
    from delta.exceptions import DeltaConcurrentModificationException

    if isinstance(exc, DeltaConcurrentModificationException):
        return True
    text = str(exc)
    return any(c in text for c in _CONFLICTS) or "io.delta.exceptions.Concurrent" in text


def retried(what: str, write: Callable[[], T]) -> T:
    """`write()`, run again while it loses a commit conflict to another writer (at most
    SPARK_RETRIES times, a growing pause between); `what` names it in the log."""
    for attempt in range(SPARK_RETRIES + 1):
        try:
            return write()
        except Exception as exc:
            if attempt == SPARK_RETRIES or not lost_conflict(exc):
                raise
            said = str(exc).splitlines()[0][:200]
            log.warning(
                "warehouse: %s lost a commit conflict to another writer (%s); "
                "writing it again (attempt %d of %d)",
                what,
                said,
                attempt + 1,
                SPARK_RETRIES,
            )
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")
