"""What makes the log: the source prepared (source_setup: publication, replica
identity, signal table; role: the replication role and its grants; masks), the slot and
its position (slot), the Debezium connector on Kafka Connect (connector_config;
connect_client: Connect's REST client), backfills through Debezium's incremental
snapshots (backfill), snapshot generations (generation), DDL that rewrote stored values
(rewrites), a whole pipeline set up and dropped (pipeline), what a setup owes a pipeline
(pending), a lost slot's restart (resync), the capture's lag (lag), and the one door
through which the apply job's batches read the source side (source_view, over
source_reader: the catalog and WAL position read every batch). Its sub-room snapshot/
takes the initial snapshot at the slot's consistent point: initial (the run, resumed),
ranges (its CTID ranges), table_copy (the tables read by Spark into the change topics
and the stores that take them), events (its rows as Debezium's events), record (each
pipeline's snapshot record) and held (what a store holds because the snapshot wrote it
there). Imports core and types."""
