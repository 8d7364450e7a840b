"""The change log as the apply job reads it: Debezium's events decoded (events), values
typed for Spark (typed), the warehouse's batch decoded in Arrow on the driver
(arrow_events), generated columns computed (generated), keys in one form
(keys), positions in the log (position) and what each store has applied (progress;
freshness: its commit-to-visible histogram).
Imports no other room of materializers."""
