"""Mend what verify found: keys a store lacks or holds different values for come through
the log again (a backfill of just those keys, or of the whole table); keys only a store
has are removed from it."""

from __future__ import annotations

from cdc.capture.backfill import start_backfill, watch_backfill
from cdc.check.keyed import FILTER_CHARS, key_filters
from cdc.check.verify import Drift, source_rows
from cdc.core.catalog import Table
from cdc.core.errors import BackfillError, CdcError, VerifyError
from cdc.core.one_writer import one_writer
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.stores.registry import make_reader

__all__ = ["backfill_keys", "key_filters", "repair", "repair_filters"]

REPAIR_WHOLE_TABLE_SHARE = 0.5  # at least this share of a table's rows drifted: backfill it all
REPAIR_FILTER_CHARS = FILTER_CHARS  # one backfill signal's key filter at most (a few thousand keys)
REPAIR_TIMEOUT = 600.0  # seconds each signal's backfill may take


def repair(
    settings: Settings,
    tables: list[Table],
    drifts: list[Drift],
    say: Say | None = None,
) -> list[str]:
    """Mend what verify found; returns what was done, one line each.

    Keys a store lacks or holds different values for are backfilled (Debezium's
    incremental snapshot of just those keys, or of the table when at least half its
    rows drifted): the rows come through the log again at new positions and every
    store takes them. The keys go in signals of at most REPAIR_FILTER_CHARS of filter
    each, one after the other (Debezium keeps a running backfill's filter in its
    offsets, and reads a queue of them one by one anyway); `say` hears of each.
    Keys only a store has (no such row in the source) are removed from that store
    first, each table's before its backfills (which may take minutes), and only those
    the source still lacks as they go: a key inserted since verify looked is
    backfilled instead, never removed.
    """
    done = []
    by_name = {t.qualified: t for t in tables}
    for name in sorted({d.table for d in drifts if not d.ok}):
        table = by_name[name]
        mine = [d for d in drifts if d.table == name]
        extra = sorted({k for d in mine for k in d.extra})
        real = set(source_rows(settings, table, extra)) if extra else set()
        for drift in mine:
            gone = [k for k in drift.extra if k not in real]
            if gone:
                with one_writer(settings, drift.store, "cdc verify --repair"):
                    _remove(settings, drift.store, table, gone)
                done.append(f"{name}: removed {len(gone)} keys only {drift.store} had")
        stale = sorted({k for d in mine for k in d.missing + d.different} | real)
        if stale:
            filters = repair_filters(table, stale, max(d.source_rows for d in mine))
            backfill_keys(settings, table, filters, len(stale), say)
            if filters is None:
                done.append(f"{name}: backfilled the whole table ({len(stale)} keys drifted)")
            else:
                signals = f"{len(filters)} signal" + ("s" if len(filters) > 1 else "")
                done.append(f"{name}: backfilled {len(stale)} keys ({signals})")
    return done


def repair_filters(table: Table, stale: list[str], source_rows: int) -> list[str] | None:
    """The backfill filters that bring back the `stale` keys: None for the whole table."""
    if len(stale) >= REPAIR_WHOLE_TABLE_SHARE * source_rows:
        return None
    if any(table.mask(k) for k in table.key):  # the stores know its key only hashed
        return None
    return key_filters(table, stale)


def _key_filter(table: Table, keys: list[str]) -> str:
    """A WHERE clause matching exactly these keys (key texts as verify reports them)."""
    (where,) = key_filters(table, keys, limit=1 << 62)
    return where


def backfill_keys(
    settings: Settings,
    table: Table,
    filters: list[str] | None,
    keys: int,
    say: Say | None,
) -> None:
    """One incremental snapshot per filter (or of the whole table), each to its end."""
    parts: list[str | None] = [None] if filters is None else list(filters)
    for number, where in enumerate(parts, 1):
        try:
            signal, offset = start_backfill(settings, table.qualified, where)
            watch_backfill(settings, offset, lambda _: None, REPAIR_TIMEOUT, signal_id=signal)
        except BackfillError as exc:
            part = f" (signal {number} of {len(parts)})" if len(parts) > 1 else ""
            raise VerifyError(f"the repair of {table.qualified} failed{part}: {exc}") from None
        if say is not None:
            say(f"{table.qualified}: backfill {number} of {len(parts)} done ({keys} keys)")


def _remove(settings: Settings, store: str, table: Table, keys: list[str]) -> None:
    target = make_reader(settings, store)
    try:
        target.remove(table, keys)
    except CdcError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise VerifyError(
            f"could not remove {len(keys)} keys only {store} has from {table.qualified} "
            f"({first}): check `cdc status`, then run `cdc verify --repair` again"
        ) from None
    finally:
        target.close()
