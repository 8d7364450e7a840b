-- The pipeline's own tables, in schema cdc (never captured as data).
CREATE SCHEMA IF NOT EXISTS cdc;

-- Debezium's signal channel (incremental snapshots: execute-snapshot, pause, resume, stop).
-- Debezium also writes its watermarks here while a backfill runs.
CREATE TABLE IF NOT EXISTS cdc.debezium_signal (
    id   varchar(64) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data text  -- a backfill's filter, of any length (pipelines from before: widened by cdc/source.py)
);

-- A backfill's window opens with a watermark row here, then Debezium reads a chunk of
-- the table. PostgreSQL writes a commit to the WAL (logical decoding streams it from
-- there) before the committing backend makes it visible (after its WAL flush, or a
-- synchronous standby's answer): a transaction caught between the two is decoded
-- before the watermark yet missing from the chunk's read, and the chunk's older row
-- would land in the log after its change. This waits until the client transactions
-- that were running (or waiting for a standby) have ended or gone idle, at most 2 s (a
-- long statement is not waited for longer). A COMMIT PREPARED commits a transaction
-- that is not its session's (the session holds no xid): a session running one, or
-- waiting for a standby with no xid of its own, is waited for too. It runs as the
-- watermark commits (the trigger below), or, for read-only backfills, as Debezium
-- takes its watermark (cdc_watermarks.pg_current_snapshot below).
-- SECURITY DEFINER: it reads other roles' sessions in pg_stat_activity.
CREATE OR REPLACE FUNCTION cdc.await_commits_in_flight() RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '2 seconds';
    pids int[];
    xids xid[];
    starts timestamptz[];
BEGIN
    SELECT array_agg(pid), array_agg(backend_xid), array_agg(xact_start)
    INTO pids, xids, starts
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'
      AND (backend_xid IS NOT NULL AND state = 'active' OR wait_event = 'SyncRep'
           OR state = 'active' AND query ~* '^\s*commit\s+prepared');
    -- the same transaction of each (a session with no xid: the same statement's)
    WHILE pids IS NOT NULL AND clock_timestamp() < deadline AND EXISTS (
        SELECT 1 FROM pg_stat_activity AS a
        JOIN unnest(pids, xids, starts) AS w(pid, xid, started)
          ON a.pid = w.pid AND a.backend_xid IS NOT DISTINCT FROM w.xid
         AND a.xact_start IS NOT DISTINCT FROM w.started
        WHERE a.state = 'active' OR a.wait_event = 'SyncRep'
    ) LOOP
        PERFORM pg_sleep(0.002);
        PERFORM pg_stat_clear_snapshot();  -- sessions are read once a transaction otherwise
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION cdc.await_commits_in_flight() FROM PUBLIC;

CREATE OR REPLACE FUNCTION cdc.await_visible_commits() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM cdc.await_commits_in_flight();
    RETURN NULL;
END
$$;

-- A read-only backfill (pipeline.read_only_backfills) writes no watermark: Debezium
-- takes `SELECT * FROM pg_current_snapshot()` before and after each chunk. Its
-- connections name this schema before pg_catalog in their search_path (the connector's
-- database.initial.statements), so that call is this one. It waits for the commits in
-- flight first, as the trigger does, so the chunk read that follows sees them. And it
-- gives Debezium (3.6, PostgresReadOnlyIncrementalSnapshotContext) a snapshot it reads
-- right, as text: `3:<xmax>:`.
-- * xmin 3 (the first normal xid): Debezium opens the window at the first change whose
--   xid is at least the low watermark's xmin (a change before that emits the chunk at
--   once), and emits the chunk at a commit whose xid is at most the high watermark's
--   xmin (as "visible"). Both are wrong when commits reach the log out of xid order: a
--   chunk emitted at an older transaction's change or commit lands before the changes
--   of others the chunk read already saw (found under load: a key's backfilled row
--   before two of its updates). With xmin 3
--   every change after the chunk read is in the window (a key it changes is dropped
--   from the chunk: the change itself is in the log), and the chunk is emitted only at
--   a transaction that began after the chunk read (xid past xmax): every commit the
--   chunk saw is in the log before it.
-- * xids as the log gives them (32 bits; pg_current_snapshot gives 64), and no list of
--   those in progress (Debezium does not use it). A chunk read as the 32-bit counter
--   wraps (once in 4 billion transactions) may be emitted early: a transaction begun
--   before the wrap then looks newer than xmax.
CREATE SCHEMA IF NOT EXISTS cdc_watermarks;
CREATE OR REPLACE FUNCTION cdc_watermarks.pg_current_snapshot() RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM cdc.await_commits_in_flight();
    -- a statement of its own: a snapshot taken after the wait
    RETURN '3:' || greatest(pg_snapshot_xmax(pg_current_snapshot())::text::numeric % 4294967296, 3)
        || ':';
END
$$;
REVOKE ALL ON FUNCTION cdc_watermarks.pg_current_snapshot() FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'cdc.debezium_signal'::regclass
                     AND tgname = 'cdc_await_visible_commits') THEN
        CREATE CONSTRAINT TRIGGER cdc_await_visible_commits
            AFTER INSERT ON cdc.debezium_signal DEFERRABLE INITIALLY DEFERRED
            FOR EACH ROW WHEN (NEW.type = 'snapshot-window-open')
            EXECUTE FUNCTION cdc.await_visible_commits();
    END IF;
END
$$;

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
-- the oldest transaction in progress at the snapshot (xid8): a row version a later
-- transaction wrote is not one the snapshot saw (a resumed snapshot reads it again)
ALTER TABLE cdc.snapshots ADD COLUMN IF NOT EXISTS snapshot_xmin bigint;

-- The CTID ranges an initial snapshot has written to the log whole, per table (its
-- relation and files: a rewrite such as VACUUM FULL moves every row): an interrupted
-- snapshot resumes by backfilling only the rest (cdc/capture/initial_snapshot.py).
CREATE TABLE IF NOT EXISTS cdc.snapshot_ranges (
    pipeline   text NOT NULL,
    relid      oid NOT NULL,
    files      text NOT NULL,
    first_page bigint NOT NULL,
    end_page   bigint,  -- NULL: to the table's end
    read_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, relid, first_page)
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

-- the relation truncated: under a name it passes through (renamed and back in one
-- transaction), the apply job finds the table by it
ALTER TABLE cdc.truncations ADD COLUMN IF NOT EXISTS relid oid;

CREATE OR REPLACE FUNCTION cdc.record_truncate() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO cdc.truncations (table_name, relid)
        VALUES (TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, TG_RELID);
    RETURN NULL;
END
$$;

-- What each pipeline captures, by relation: a table is the relation (its OID), not its
-- name. A rename (ALTER TABLE … RENAME, SET SCHEMA, ALTER SCHEMA … RENAME) keeps the OID
-- and the publication's hold on it; a table dropped and created again has a new OID.
-- `cdc sync` writes it; `cdc status` and `cdc sync` compare it with the catalog.
CREATE TABLE IF NOT EXISTS cdc.captured (
    pipeline   text NOT NULL,
    relid      oid  NOT NULL,
    table_name text NOT NULL,
    PRIMARY KEY (pipeline, relid)
);
-- when `cdc setup` recorded it: a change topic of another name written since holds
-- changes of a captured table made under that name (`cdc status`)
ALTER TABLE cdc.captured ADD COLUMN IF NOT EXISTS recorded_at timestamptz NOT NULL DEFAULT now();
-- a partitioned table's partitions (every level) when `cdc setup` recorded it: one
-- detached or dropped since took its rows out without a change event (`cdc status`;
-- `cdc setup` cuts and backfills the table)
ALTER TABLE cdc.captured ADD COLUMN IF NOT EXISTS partitions oid[];

-- Change topics of no captured table written since `cdc.captured` was recorded hold
-- changes made under a passing name (`cdc status`). Their changes up to `through` are
-- accounted for: a name the pipeline captured until `cdc setup` took it out, or every
-- name ('*') once a backfill was asked for (the remedy `cdc status` gives).
CREATE TABLE IF NOT EXISTS cdc.acknowledged (
    pipeline   text NOT NULL,
    table_name text NOT NULL,
    through    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_name)
);

-- What `cdc setup` owes a streaming pipeline once it has recorded its capture set in
-- cdc.captured: the cut of a table dropped and created again (done before its
-- backfill), the backfill of a table new to it (added, renamed, created again, or put
-- back into the publication). Written in the transaction that records the set, each
-- row removed once its work is done: a setup that stops halfway (Connect down, a
-- timeout, Ctrl-C) leaves it for the next `cdc setup` to finish.
CREATE TABLE IF NOT EXISTS cdc.pending (
    pipeline   text NOT NULL,
    table_name text NOT NULL,
    work       text NOT NULL CHECK (work IN ('cut', 'backfill')),
    since      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, table_name, work)
);

-- Each pipeline's placeholder for an unchanged TOASTed value (the connector's
-- `unavailable.value.placeholder`): a secret of its own, so no value a user stores can
-- be taken for one. Kept after `cdc drop` (the topics stay, and hold it).
CREATE TABLE IF NOT EXISTS cdc.placeholders (
    pipeline    text PRIMARY KEY,
    placeholder text NOT NULL
);

-- Each pipeline's salt for its masks' hashes (pipeline.table."<t>".mask = "hash"): a
-- secret of its own, made once by `cdc setup` (or pipeline.mask_salt), which only the
-- setup's user reads. cdc.mask_hash gives the hash the pipeline's Connect transform
-- gives every change event (jvm/transforms): the hex SHA-256 of the salt's UTF-8 bytes
-- and then the value's. The snapshot and verify call it, so the salt never leaves.
CREATE TABLE IF NOT EXISTS cdc.mask_salts (
    pipeline text PRIMARY KEY,
    salt     text NOT NULL
);
REVOKE ALL ON cdc.mask_salts FROM PUBLIC;
CREATE OR REPLACE FUNCTION cdc.mask_hash(pipeline text, value text) RETURNS text
    LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    AS $$ SELECT encode(sha256(convert_to(s.salt, 'UTF8') || convert_to($2, 'UTF8')), 'hex')
          FROM cdc.mask_salts s WHERE s.pipeline = $1 $$;
REVOKE ALL ON FUNCTION cdc.mask_hash(text, text) FROM PUBLIC;

-- A partition created or attached after `cdc setup` under a captured root with REPLICA
-- IDENTITY FULL takes that identity in the statement's own transaction (PostgreSQL does
-- not pass it down, and checks a partition's UPDATE against the partition's own: under
-- DEFAULT a row filter on a non-key column would make the application's UPDATE fail).
-- Run by the event trigger cdc_follow_root_identity (installed by `cdc setup` where the
-- setup's user may: a superuser), with the rights of whoever ran the DDL (who owns the
-- partition). It never fails that DDL: a partition it cannot change (busy for 100 ms,
-- not the user's) is left with a warning, and `cdc status` names it.
CREATE OR REPLACE FUNCTION cdc.follow_root_identity() RETURNS event_trigger
    LANGUAGE plpgsql SET search_path = pg_catalog SET lock_timeout = '100ms' AS $$
DECLARE
    made record;
    part regclass;
BEGIN
    -- names are looked up in the catalog, never cast: the user running the DDL may lack
    -- USAGE on schema cdc, and nothing here may make the application's DDL fail
    FOR made IN
        SELECT DISTINCT objid FROM pg_event_trigger_ddl_commands()
        WHERE object_type = 'table' AND pg_partition_root(objid) IS NOT NULL
    LOOP
        IF NOT EXISTS (  -- the root is captured (in a pipeline's publication) with FULL
            SELECT 1 FROM pg_class r JOIN pg_publication_rel pr ON pr.prrelid = r.oid
            WHERE r.oid = pg_partition_root(made.objid) AND r.relreplident = 'f'
              AND pr.prpubid IN (
                  SELECT t.prpubid FROM pg_publication_rel t
                  JOIN pg_class c ON c.oid = t.prrelid
                  JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'cdc' AND c.relname = 'truncations')
        ) THEN
            CONTINUE;
        END IF;
        FOR part IN
            SELECT t.relid FROM pg_partition_tree(made.objid) t JOIN pg_class c ON c.oid = t.relid
            WHERE c.relreplident <> 'f' AND c.relkind IN ('r', 'p')
        LOOP
            BEGIN
                EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', part);
            EXCEPTION WHEN OTHERS THEN
                RAISE WARNING 'cdc: could not give partition % REPLICA IDENTITY FULL (%); '
                    'run ALTER TABLE % REPLICA IDENTITY FULL, or cdc setup', part, SQLERRM, part;
            END;
        END LOOP;
    END LOOP;
EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'cdc: the replica identity of new partitions was not checked (%)', SQLERRM;
END
$$;
