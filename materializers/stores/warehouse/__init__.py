"""The warehouse: Delta Lake tables per captured table, in modules of their own.

tables   where each table lives, how it is created and widened (tables.py)
store    the current state, kept by MERGE with a position guard, and what verify,
         repair and `cdc get` read of it (store.py: WarehouseStore)
history  every change as a version (SCD type 2) (history.py)
(the join views and window aggregates derived from them: materializers/views/)
"""
