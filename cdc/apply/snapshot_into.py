"""The stores `cdc snapshot` writes itself, beside the change topics: those of
apply.stores with the "snapshot" ability (the warehouse), when pipeline.snapshot_into_stores.

Each group of the snapshot's rows, once in Kafka, comes here as the Kafka records it is
(cdc/capture/snapshot/initial.py) and is written by the store's own `write_batch`, the
route it chooses included, as its apply job would write those records: generated
columns computed, poison values to the dead-letter topic, its join views refreshed.
Then what the store holds is recorded (cdc/capture/snapshot/held.py) and its apply skips
those records. While the snapshot writes a store it holds the store's snapshot lock, and
its writer lock where it takes one writer (the warehouse on S3). A store whose writer
lock another process holds, or that cannot be made ready (its tables, its views), is
reached through Kafka only, as before, and the snapshot says why in one line."""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

from cdc.apply.dead_letters import DeadLetters
from cdc.capture.snapshot.held import Held, record_held, writing_lock
from cdc.capture.snapshot.table_copy import IntoStores
from cdc.capture.source_reader import captured_tables
from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.one_writer import one_writer
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.core.store_declarations import with_ability
from cdc.core.topics import change_topic
from cdc.log.generated_columns import with_generated
from cdc.stores.base import BatchContext, FrameStore
from cdc.stores.registry import derived_views, make_writer

__all__ = ["StoresTakingSnapshot", "snapshot_into"]

log = logging.getLogger(__name__)


def snapshot_into(settings: Settings) -> StoresTakingSnapshot | None:
    """The stores the snapshot writes itself under `settings`, or None."""
    if not settings.pipeline.snapshot_into_stores:
        return None
    names = with_ability(settings.apply.stores, "snapshot")
    return StoresTakingSnapshot(settings, names) if names else None


class StoresTakingSnapshot:
    """The snapshot's writer into stores (module doc); a SnapshotInto."""

    def __init__(self, settings: Settings, names: list[str]) -> None:
        self.settings = settings
        self.names = names

    @contextlib.contextmanager
    def writing(self, spark: Any, lsn: int, say: Say) -> Iterator[IntoStores | None]:
        settings = self.settings
        with contextlib.ExitStack() as locks:
            stores: list[FrameStore] = []
            tables = captured_tables(settings)
            for name in self.names:
                own = contextlib.ExitStack()  # its locks, kept once it is ready
                try:
                    own.enter_context(one_writer(settings, name, "cdc snapshot"))
                    own.enter_context(writing_lock(settings, name))
                    store = _ready(settings, name, spark, tables)
                except Exception as exc:  # the snapshot goes on through Kafka, as before
                    own.close()
                    log.info("%s: not written by the snapshot", name, exc_info=True)
                    said = str(exc).strip().splitlines() or [type(exc).__name__]
                    say(f"{name}: {said[0][:300]}; the snapshot reaches it through Kafka only")
                    continue
                record_held(settings, name, Held(lsn))
                locks.enter_context(own.pop_all())
                stores.append(store)
            if not stores:
                yield None
                return
            say(f"the snapshot writes {', '.join(s.name for s in stores)} itself, beside Kafka")
            yield _writer(settings, stores, tables, lsn)


def _ready(settings: Settings, name: str, spark: Any, tables: dict[str, Table]) -> FrameStore:
    """The store `name` ready to take the snapshot's groups: its join views taken, as the
    apply job runs them, and its tables made before the copy (made beside its first
    group, Spark's Delta jobs and the Kafka write took the two cores from each other for
    longer)."""
    store = make_writer(settings, name, spark)
    if not isinstance(store, FrameStore):
        raise TypeError(f"store {name} declares the ability 'snapshot' but is no FrameStore")
    if with_ability([name], "views"):
        door = derived_views(settings, [name])
        if door is not None:
            store.take_views(door.checked(settings, tables))
    store.prepare(tables.values())
    return store


def _writer(
    settings: Settings, stores: list[FrameStore], tables: dict[str, Table], lsn: int
) -> IntoStores:
    """The function that writes a group into `stores`."""
    groups = itertools.count()

    def write(records: Any, ends: dict[str, int], count: int) -> None:
        group = next(groups)
        topics = {change_topic(settings.pipeline, t): t for t in [*tables, TRUNCATIONS_TABLE]}
        batch = with_generated(records, settings, topics, tables)
        for store in stores:
            _write_group(settings, store, batch, topics, tables, group, count)
            record_held(settings, store.name, Held(lsn, ends))

    return write


def _write_group(
    settings: Settings,
    store: FrameStore,
    batch: Any,
    topics: dict[str, str],
    tables: dict[str, Table],
    group: int,
    count: int,
) -> None:
    """One group of snapshot records into `store`, as one of its batches."""
    started = time.monotonic()
    dead = DeadLetters(settings, store.name)
    ctx = BatchContext(
        batch_id=group,
        started_ms=int(time.time() * 1000),
        topics=topics,
        tables=tables,
        behind=count,
        last_truncate={},
        truncate_log={},
        emptied_by=lambda name, relid: None,  # a snapshot holds no TRUNCATE
        dead_letter=dead.send_row,
        records=count,  # the route judges a collect by them (more than a batch's most)
    )
    outcome = store.write_batch(batch, ctx)
    dead.flush()
    log.info(
        "snapshot group %d into %s: %d rows in %.1f s (route %s)",
        group,
        store.name,
        outcome.n,
        time.monotonic() - started,
        outcome.route,
    )
