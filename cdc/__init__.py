"""pg-cdc: PostgreSQL changes through Debezium and Kafka into a cache, a search index and
a warehouse. One package whose folders are the stages of the flow, each a floor that
imports only the floors below it (tests/unit/project/test_layers.py; docs/layout.md):

- core: settings, errors, clients, the catalog of captured tables, topics, files;
- types: PostgreSQL's types, each value's text, Spark, JSON, document and key forms;
- capture: what makes the log (source, slot, connector, backfills, the snapshot);
- log: what the change topics hold, read (events, positions, progress, freshness);
- stores: the cache, the search index and the warehouse (with its derived views, one
  class per kind: stores/warehouse/views/);
- check: reading the stores back (verify, repair, rebuild, query, status);
- apply: the apply job;
- stack: the local stack (imports core, types and capture only);
- cli: the commands people run (`cdc`), the demo and its workload.
"""
