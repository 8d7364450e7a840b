"""The pipeline's own schema `cdc` is the setup user's: a `cdc` schema, or tables in it,
made first by another role (a database owner) held that role's triggers, which then
ran with the administrator's rights whenever `cdc` wrote its own tables. Setup refuses
it in one line, and no trigger of that role ran."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from tests.conftest import RunningStack
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration

PLANTED = [
    "CREATE TABLE public.seen (n serial PRIMARY KEY, who text)",
    "CREATE TABLE public.x (id int PRIMARY KEY)",
    "CREATE SCHEMA cdc",
    "CREATE TABLE cdc.snapshots (pipeline text PRIMARY KEY, slot text NOT NULL, "
    "status text NOT NULL, lsn pg_lsn, snapshot_at timestamptz, started_at timestamptz "
    "NOT NULL DEFAULT now(), finished_at timestamptz, rows bigint)",
    "CREATE FUNCTION cdc.t() RETURNS trigger LANGUAGE plpgsql AS "
    "$$BEGIN INSERT INTO public.seen VALUES (current_user); RETURN NEW; END$$",
    "CREATE TRIGGER t BEFORE INSERT OR UPDATE ON cdc.snapshots "
    "FOR EACH ROW EXECUTE FUNCTION cdc.t()",
]


# cdc_watermarks: the connector's sessions call its pg_current_snapshot() (read-only
# backfills), so another role's would run in them
WATERMARKS = [
    "CREATE TABLE public.seen (n serial PRIMARY KEY, who text)",
    "CREATE TABLE public.x (id int PRIMARY KEY)",
    "CREATE SCHEMA cdc_watermarks",
    "CREATE FUNCTION cdc_watermarks.pg_current_snapshot() RETURNS text LANGUAGE sql "
    "AS $$SELECT '3:3:'$$",
]


@pytest.mark.parametrize(
    ("planted", "schema"), [(PLANTED, "cdc"), (WATERMARKS, "cdc_watermarks")], ids=["cdc", "wm"]
)
def test_a_cdc_schema_another_role_made_is_refused(
    stack: RunningStack, planted: list[str], schema: str
) -> None:
    owner, database = f"app_{uuid.uuid4().hex[:8]}", f"probe_{uuid.uuid4().hex[:8]}"
    admin = stack.settings.postgres
    with psycopg.connect(admin.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'app'").format(sql.Identifier(owner)))
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    try:
        with psycopg.connect(admin.conninfo(owner, SecretStr("app"), database)) as conn:
            for statement in planted:
                conn.execute(statement)
        env = {**stack.env, "CDC_POSTGRES__DATABASE": database}
        result = run_cdc("setup", env=env)
        said = result.stderr.strip()
        assert result.returncode == 7 and said.count("\n") == 0, said
        assert f"schema {schema} of database {database} belongs to {owner}" in said, said
        with psycopg.connect(admin.dsn(database), autocommit=True) as conn:
            assert conn.execute("SELECT who FROM public.seen").fetchall() == []
    finally:
        with psycopg.connect(admin.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))
