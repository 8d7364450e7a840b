"""The engines that keep the stores, in rooms that read as the data flow; each room
imports only the ones above it in this list (tests/unit/test_layers.py):

- log: what the change topics hold, read and typed (events, typed values, generated
  columns, keys, positions, the progress each store records);
- stores: the cache, the search index and the warehouse behind one interface;
- views: the warehouse's derived views, one class per kind (its check, its Spark work,
  its rows computed again from the log);
- check: reading the stores back against the source (verify's cut, expectations,
  each view's comparison, reconcile, repair, rebuild, query);
- apply: the apply job (its queries, the batch writer and its guards, freshness,
  dead letters, the warehouse's own process).
"""
