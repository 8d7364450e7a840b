"""The warehouse: Delta Lake tables per captured table, in modules of their own.

routes       each micro-batch's route (arrow, spark-decoded, spark), its decode, its
             TRUNCATEs and dead letters, and what it wrote (routes.py)
arrow_events a batch's records decoded in Arrow on the driver (arrow_events.py)
store        the current state, kept by MERGE with a position guard (store.py:
             WarehouseStore)
readback     what verify, repair, `cdc get` and `cdc query` read of it (readback.py)
tables       where each table lives, how it is created and widened (tables.py)
history      every change as a version (SCD type 2) (history.py)
marks        which of a batch's changes are new to a table (marks.py)
arrow_batch  a batch's versions and each key's newest, told in Arrow on the driver
merge        the current state's MERGE clauses, for Spark and delta-rs (merge.py)
native       the writes by delta-rs (native.py), conflicts the other writers' (conflicts.py)
delta_log    a Delta table's log read directly (delta_log.py)
iceberg      its tables published as Iceberg tables (iceberg.py, [stores.warehouse] iceberg)
settings     its section, [stores.warehouse] (settings.py)
steps        the steps after each batch (its join views) and what a batch keeps for
             them (steps.py: BatchStep, Kept)
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
    publisher="cdc.stores.warehouse.iceberg:publisher",
    views="cdc.stores.warehouse.views.registry:VIEWS",
    one_writer=_one_writer,
)
