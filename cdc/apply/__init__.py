"""The apply job: its streaming queries and their restarts (job), a store's side of each
micro-batch in named steps (batch), the position guard each batch passes first
(guards), the cache's and search index's rows of a batch (writer), dead letters
(dead_letters), and the warehouse in a process of its own (warehouse_process,
warehouse_main). Imports log, stores, views and check (a dead letter's replay is a
repair)."""
