-- The role Debezium and the snapshot readers use: replication, and reading exactly
-- the captured tables; writing only the pipeline's own tables.
-- Placeholders: {role} {password} {database}
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role_literal}) THEN
        EXECUTE format('CREATE ROLE %I WITH LOGIN REPLICATION', {role_literal});
    END IF;
END
$$;
ALTER ROLE {role} WITH LOGIN REPLICATION PASSWORD {password};
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA cdc TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON cdc.debezium_signal, cdc.heartbeat, cdc.snapshots TO {role};
GRANT SELECT ON cdc.truncations TO {role};
