"""The warehouse: Delta Lake tables per captured table, in modules of their own.

tables       where each table lives, how it is created and widened (tables.py)
store        the current state, kept by MERGE with a position guard, and what verify,
             repair and `cdc get` read of it (store.py: WarehouseStore)
history      every change as a version (SCD type 2) (history.py)
marks        which of a batch's changes are new to a table (marks.py)
arrow_batch  a batch's versions and each key's newest, told in Arrow on the driver
native       the writes by delta-rs (native.py)
(the join views and window aggregates derived from them: cdc/views/)
"""

from __future__ import annotations

from cdc.core.store_declarations import StoreDeclaration

HISTORY_COLUMNS = frozenset({"valid_from", "valid_to"})  # the history's own, on every version


def _reserved(column: str) -> str | None:
    if column in HISTORY_COLUMNS:
        return "is one the warehouse history adds to every version"
    return None


DECLARATION = StoreDeclaration(
    name="warehouse",
    summary="Delta Lake tables, the live rows and every version",
    make="cdc.stores.warehouse.store:make",
    slo_s=30.0,
    reserved=_reserved,
    abilities=frozenset({"views", "apart", "expectations"}),
)
