"""The warehouse: Delta Lake tables per captured table, a wing of four sub-rooms
around what they share. A module whose name starts with `_` is its sub-room's own:
only that sub-room and the modules here import it (tests/unit/project/test_layers.py).

store        the door the registry makes (store.py: WarehouseStore, its writes and the
             steps it runs after each batch): the current state, kept by MERGE with a
             position guard, and the history
settings     its section, [stores.warehouse] (settings.py)
tables       where each table lives, how it is created and widened (tables.py)
history      every change as a version (SCD type 2) (history.py)
native       the writes by delta-rs (native.py); conflicts: the other writers'
             (conflicts.py)
steps        the steps after each batch (its join views) and what a batch keeps for
             them (steps.py: BatchStep, Kept)
write/       how a batch is written: routes (each micro-batch's named route: arrow,
             spark-decoded, spark; its decode, TRUNCATEs and dead letters, and what
             it wrote), _arrow_events (a batch's records decoded in Arrow on the
             driver), _arrow_batch (its versions and each key's newest, in Arrow),
             _marks (which of a batch's changes are new to a table), _merge (the current
             state's MERGE clauses, for Spark and delta-rs)
read/        what is read back: readback (what verify, repair, `cdc get` and
             `cdc query` read of it), delta_log (a Delta table's log read directly)
publish/     its tables published for other engines: iceberg ([stores.warehouse]
             iceberg)
views/       the views derived from its tables, one class per kind (join views, window
             aggregates), reached by the apply job and the checks through its
             declaration's `views` door (views/registry.py VIEWS)
"""

from __future__ import annotations

from typing import Any

from cdc.core.store_declarations import StoreDeclaration
from cdc.stores.warehouse.settings import RENAMED, WarehouseSettings

HISTORY_COLUMNS = frozenset({"valid_from", "valid_to"})  # the history's own, on every version


def _reserved(column: str) -> str | None:
    if column in HISTORY_COLUMNS:
        return "is one the warehouse history adds to every version"
    return None


def _one_writer(settings: Any) -> str | None:
    """On S3, Delta's log store makes commits safe from one Spark driver only."""
    from cdc.core.state_folders import warehouse_store

    if warehouse_store(settings) is None:
        return None
    return "Delta on S3 commits safely from one Spark driver only"


DECLARATION = StoreDeclaration(
    name="warehouse",
    summary="Delta Lake tables, the live rows and every version",
    make="cdc.stores.warehouse.store:make",
    slo_s=30.0,
    settings=WarehouseSettings,
    renamed=RENAMED,
    reserved=_reserved,
    abilities=frozenset({"views", "own_process", "expectations", "sql", "snapshot"}),
    publisher="cdc.stores.warehouse.publish.iceberg:publisher",
    views="cdc.stores.warehouse.views.registry:VIEWS",
    one_writer=_one_writer,
)
