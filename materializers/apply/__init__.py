"""The apply job: its streaming queries and their restarts (job), the cache's and search
index's side of a batch (writer), commit-to-visible freshness (freshness), dead letters
(dead_letters), and the warehouse in a process of its own (warehouse_process,
warehouse_main). Imports log, stores and check (a dead letter's replay is a repair)."""
