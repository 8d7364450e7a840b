"""What makes the log: the source prepared (source_setup: publication, replica
identity, signal table; role: the replication role and its grants; masks), the slot and
its position (slot), the Debezium connector on Kafka Connect (connector_config;
connect_client: Connect's REST client), backfills through Debezium's incremental
snapshots (backfill), snapshot generations (generation) and each pipeline's snapshot
record (snapshots), DDL that rewrote stored values (rewrites), a whole pipeline set up
and dropped (pipeline), the initial snapshot at the slot's consistent point
(initial_snapshot) and its rows as Debezium's events (snapshot_events), a lost slot's
restart (resync), the capture's lag (lag), and the one door through which the apply
job's batches read the source side (source_view, over source_reader: the catalog and
WAL position read every batch). Imports core and types."""
