"""The change log as the apply job reads it: Debezium's events decoded (events), the
warehouse's batch decoded in Arrow on the driver (arrow_events), generated columns
computed (generated), positions in the log (position) and what each store has applied
(progress; freshness: its commit-to-visible histogram). Imports core, types and
capture."""
