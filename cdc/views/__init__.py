"""The derived views of the warehouse (`apply.joins`, `apply.windows`), one class per
kind, each in one place: its check against the catalog, its Spark work (a step after
each warehouse batch, or its part of a streaming query, shared with the views of one
mode, tables and watermark: queries.py), its rows computed again from the change log
for `cdc verify`, and when each row is due. The settings' kind selects the class
(registry.py). Imports log and stores; check and apply use it."""
