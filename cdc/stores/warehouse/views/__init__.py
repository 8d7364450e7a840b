"""The derived views of the warehouse (`apply.joins`, `apply.windows`), one class per
kind, each in one place: its check against the catalog, its Spark work (a step after
each warehouse batch, steps.py, or its part of a streaming query, shared with the views
of one mode, tables and watermark: queries.py), its rows computed again from the change
log for `cdc verify`, and when each row is due. The settings' kind selects the class
(registry.py). A room of the warehouse: it imports the warehouse's modules and the
floors below stores; apply and check reach it only through the warehouse's declaration
(`views`: registry.py VIEWS, a DerivedViews of cdc/stores/base.py)."""
