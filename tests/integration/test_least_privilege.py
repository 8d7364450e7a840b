"""The replication role has what the pipeline needs and nothing more."""

from __future__ import annotations

import stat
import uuid

import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from cdc.capture.role import password_file
from cdc.capture.source_setup import prepare_source, replication_dsn
from tests.conftest import Capture
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration


def test_the_replication_role_reads_only_what_is_captured_and_goes_with_drop(
    captured: Capture,
) -> None:
    role = f"cdc_r_{uuid.uuid4().hex[:8]}"
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY)",
        "CREATE TABLE {name}_other (id int PRIMARY KEY)",
        "CREATE TABLE {name}_never (id int PRIMARY KEY)",
        "INSERT INTO {name} VALUES (1)",
        tables=("public.{name}", "public.{name}_other"),
        prefix="lp",
        replication_user=role,
    )
    settings, name = t.settings, t.name
    try:
        # a generated password, in a file only its owner reads, stored as a SCRAM verifier
        assert settings.pipeline.replication_password is None
        secret_file = password_file(settings)
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(secret_file.parent.stat().st_mode) == 0o700
        password = secret_file.read_text().strip()
        assert len(password) >= 24 and password != role
        with psycopg.connect(t.dsn) as conn:
            stored = conn.execute(
                "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)
            ).fetchone()
        assert stored is not None and stored[0].startswith("SCRAM-SHA-256$")

        def can_read(table: str) -> bool:
            with psycopg.connect(t.dsn) as conn:
                row = conn.execute(
                    "SELECT has_table_privilege(%s, %s, 'SELECT')", (role, table)
                ).fetchone()
            return bool(row and row[0])

        assert can_read(f"public.{name}") and can_read(f"public.{name}_other")
        assert not can_read(f"public.{name}_never")
        with psycopg.connect(replication_dsn(settings)) as conn:
            assert conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(name))
            ).fetchone() == (1,)

        # logical replication of the pipeline's database only: no physical replication
        # (pg_basebackup would copy the cluster, pg_authid too), no other database
        pg = settings.postgres
        secret = SecretStr(password)
        for conninfo in (
            pg.conninfo(role, secret, replication="true"),
            pg.conninfo(role, secret, "postgres"),
        ):
            with pytest.raises(psycopg.OperationalError, match=r"pg_hba\.conf|rejects"):
                psycopg.connect(conninfo, connect_timeout=5).close()
        psycopg.connect(replication_dsn(settings, replication=True)).close()

        # the SQL for a DBA: what the setup runs, the password only as its verifier
        env = {**t.env, "CDC_PIPELINE__REPLICATION_USER": role}
        printed = run_cdc("setup", "--print-sql", env=env)
        assert printed.returncode == 0, printed.stderr
        for statement in (
            f'GRANT SELECT ON "public"."{name}_other" TO "{role}"',
            f'ALTER ROLE "{role}" WITH LOGIN REPLICATION NOSUPERUSER PASSWORD \'SCRAM-SHA-256$',
            f'CREATE PUBLICATION "{settings.pipeline.publication}" FOR TABLE',
        ):
            assert statement in printed.stdout
        assert password not in printed.stdout + printed.stderr
        assert f"{name}_never" not in printed.stdout

        # a table no longer captured is no longer readable
        fewer = settings.model_copy(
            update={"pipeline": settings.pipeline.model_copy(update={"tables": [t.table]})}
        )
        prepare_source(fewer)
        assert can_read(f"public.{name}") and not can_read(f"public.{name}_other")

        done = run_cdc("drop", "--yes", "--drop-role", env=env)
        assert done.returncode == 0, done.stderr
        assert "dropped" in done.stderr + done.stdout
        with psycopg.connect(t.dsn) as conn:
            assert (
                conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
                is None
            )
        assert not secret_file.exists()
    finally:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
