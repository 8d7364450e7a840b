"""Rebuild a store's tables from the log: what the store holds of them goes, its
checkpoint starts over, and the tables are backfilled through the log (so a rebuild
ends with the source's values even where the topic lost them: a topic deleted and
created again, or a compacted key left with only a TOAST placeholder)."""

from __future__ import annotations

from cdc.capture.snapshot.held import forget_held
from cdc.capture.source_reader import read_source
from cdc.core.errors import ConfigError
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.log.checkpoints import checkpoint
from cdc.log.progress import Progress, read_progress, write_progress
from cdc.stores.registry import make_reader, reach

__all__ = ["reset_store"]


def reset_store(settings: Settings, store: str, tables: list[str] | None, say: Say) -> list[str]:
    """Empty `store` of `tables` (default: every captured table) and restart its
    checkpoint; returns the tables, for the caller to backfill. `cdc apply` must not
    run meanwhile."""
    captured, wal = read_source(settings)
    chosen = tables or sorted(captured)
    unknown = [t for t in chosen if t not in captured]
    if unknown:
        raise ConfigError(
            f"not a captured table: {', '.join(unknown)}; the pipeline captures "
            f"{', '.join(sorted(captured)) or 'nothing'} (`cdc tables list`)"
        )
    target = make_reader(settings, store)
    try:
        reach(target)
        for name in chosen:
            say(f"{store}: removing what it holds of {name}")
            target.reset(captured[name])
    finally:
        target.close()
    # the whole log is read again; what the store holds of the other tables refuses
    # every write that is not newer, so only the emptied tables change
    checkpoint(settings, store).remove()
    forget_held(settings, store)  # the snapshot's records are read again, as every other
    progress = read_progress(settings, store) or Progress()
    # the TRUNCATEs the source still has (a restored source has lost those past its WAL)
    kept = {t: at for t, at in progress.truncated.items() if not wal or at[0] <= wal}
    # with their times: the replayed versions from before a TRUNCATE end at it
    times = {
        t: [c for c in cuts if not wal or c[0] <= wal] for t, cuts in progress.truncations.items()
    }
    write_progress(
        settings, store, Progress(truncated=kept, truncations={t: c for t, c in times.items() if c})
    )
    return chosen
