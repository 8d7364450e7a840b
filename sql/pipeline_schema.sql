-- The pipeline's own tables, in schema cdc (never captured as data).
CREATE SCHEMA IF NOT EXISTS cdc;

-- Debezium's signal channel (incremental snapshots: execute-snapshot, pause, resume, stop).
-- Debezium also writes its watermarks here while a backfill runs.
CREATE TABLE IF NOT EXISTS cdc.debezium_signal (
    id   varchar(64) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data text  -- a backfill's filter, of any length (pipelines from before: widened by cdc/source.py)
);

-- Written by the connector's heartbeat action query: keeps the slot advancing when the
-- captured tables are quiet, so PostgreSQL can recycle WAL.
CREATE TABLE IF NOT EXISTS cdc.heartbeat (
    pipeline text PRIMARY KEY,
    ts       timestamptz NOT NULL
);

-- One row per pipeline: where its initial snapshot stands. A snapshot is complete
-- only when status = 'done'; anything else is redone from the start.
CREATE TABLE IF NOT EXISTS cdc.snapshots (
    pipeline     text PRIMARY KEY,
    slot         text NOT NULL,
    status       text NOT NULL CHECK (status IN ('running', 'done')),
    lsn          pg_lsn,
    snapshot_at  timestamptz,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    rows         bigint
);

-- A TRUNCATE of a captured table, recorded by a statement trigger in the truncating
-- transaction. Debezium's own truncate events carry no key, and a compacted topic
-- refuses keyless records; this row is keyed, and its LSN orders it among the
-- table's changes, so every store empties the table as of that point.
CREATE TABLE IF NOT EXISTS cdc.truncations (
    id           bigserial PRIMARY KEY,
    table_name   text NOT NULL,
    truncated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION cdc.record_truncate() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO cdc.truncations (table_name) VALUES (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;
