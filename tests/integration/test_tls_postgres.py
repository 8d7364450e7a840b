"""PostgreSQL over TLS: the local cluster started with a certificate the test's own CA
signed (postgres.cert_file/key_file), cdc's clients set to sslmode=verify-full with that CA.

Every connection cdc makes (the admin's, SQLAlchemy's, the replication role's walsender)
is encrypted, as PostgreSQL itself reports in pg_stat_ssl; the JDBC driver Debezium runs
with connects with the connector's `database.ssl*` settings; a plain-text connection is
refused by the `hostssl`-only pg_hba.conf and a server the client's CA did not sign is
refused by the client; no password reaches the server's log.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.capture.connector_config import connector_config
from cdc.capture.source_setup import prepare_source, replication_dsn
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings, load_settings
from cdc.core.spark import jdbc_ssl_options
from cdc.stack.components.postgres import Postgres
from tests import tls
from tests.helpers import free_ports

ADMIN_PASSWORD = "admin tls pw 'q' 1"
REPLICATION_PASSWORD = "repl tls pw 'q' 2"
SSL_OF_BACKEND = "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"

# Debezium's own PostgreSQL JDBC driver, given the connector's database.* settings on stdin
# (never on the command line), says whether its connection is encrypted.
JDBC_PROBE = """
import java.sql.*;
import java.util.Properties;
public class TlsProbe {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.load(System.in);
        String url = props.getProperty("url");
        props.remove("url");
        try (Connection c = DriverManager.getConnection(url, props);
             ResultSet r = c.createStatement().executeQuery(
                 "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")) {
            r.next();
            System.out.println("ssl=" + r.getBoolean(1));
        }
    }
}
"""


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[tuple[Settings, tls.TestCA]]:
    root = Path(tempfile.mkdtemp(prefix="cdc-tls-pg-"))
    root.chmod(0o755)  # the service user (tests run as root) enters the data directory
    try:
        ca = tls.make_ca(root / "ca")
        server = ca.server_cert("postgres")
        settings = load_settings(
            data_dir=str(root / "data"),
            postgres={
                "port": free_ports(1)[0],
                "password": ADMIN_PASSWORD,
                "sslmode": "verify-full",
                "ca_file": str(ca.ca_file),
                "cert_file": str(server.cert_file),
                "key_file": str(server.key_file),
            },
            pipeline={"name": "tls", "replication_password": REPLICATION_PASSWORD},
        )
        component = Postgres(settings)
        try:
            component.start()  # waits until cdc's own connection (verify-full) answers
            with admin_connection(settings) as conn:
                conn.execute("CREATE TABLE public.items (id int PRIMARY KEY, name text)")
                conn.commit()
            prepare_source(settings)  # the replication role, its grants, the publication
            yield settings, ca
        finally:
            component.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_cdc_connections_are_encrypted(tls_postgres: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_postgres
    with psycopg.connect(settings.postgres.dsn()) as conn:
        row = conn.execute(SSL_OF_BACKEND).fetchone()
    assert row is not None and row[0] is True, row
    from sqlalchemy import create_engine, text

    engine = create_engine(settings.postgres.sqlalchemy_url())
    try:
        with engine.connect() as conn:
            assert conn.execute(text(SSL_OF_BACKEND)).one()[0] is True
    finally:
        engine.dispose()


def test_the_replication_role_streams_over_tls(tls_postgres: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_postgres
    with psycopg.connect(replication_dsn(settings, replication=True), autocommit=True) as repl:
        cur = psycopg.ClientCursor(repl)
        cur.execute("IDENTIFY_SYSTEM")  # a walsender answers this: a replication connection
        assert cur.fetchone() is not None
        with admin_connection(settings) as conn:
            row = conn.execute(
                "SELECT s.ssl, a.backend_type FROM pg_stat_ssl s JOIN pg_stat_activity a "
                "USING (pid) WHERE a.pid = %s",
                (repl.info.backend_pid,),
            ).fetchone()
    assert row == (True, "walsender")


def test_plaintext_and_an_unknown_ca_are_refused(
    tls_postgres: tuple[Settings, tls.TestCA], tmp_path: Path
) -> None:
    settings, _ = tls_postgres
    plain = conninfo_to_dict(settings.postgres.dsn())
    plain.update(sslmode="disable")
    plain.pop("sslrootcert", None)
    with pytest.raises(psycopg.OperationalError, match="no encryption"):  # pg_hba: hostssl
        psycopg.connect(make_conninfo("", **plain), connect_timeout=5)
    other = tls.make_ca(tmp_path / "other", name="another-test-ca")
    wrong = settings.postgres.model_copy(update={"ca_file": other.ca_file})
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(wrong.dsn(), connect_timeout=5)


def _jdbc_probe(settings: Settings, ssl: dict[str, str], tmp_path: Path) -> str:
    jar = next((settings.jvm_dir / "connect-plugins").rglob("postgresql-*.jar"), None)
    if jar is None:
        pytest.skip("the Debezium connector is not installed (./install.sh)")
    pg = settings.postgres
    source = tmp_path / "TlsProbe.java"
    source.write_text(JDBC_PROBE)
    props = {
        "url": f"jdbc:postgresql://{pg.host}:{pg.port}/{pg.database}",
        "user": pg.user,
        "password": pg.password.get_secret_value(),
        **ssl,
    }
    stdin = "".join(
        f"{key}={value.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n".replace(
            " ", "\\ "
        )
        for key, value in props.items()
    )
    proc = subprocess.run(
        [str(settings.java_home / "bin" / "java"), "-cp", str(jar), str(source)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.stdout + proc.stderr


def test_debeziums_driver_verifies_the_server_with_the_connector_settings(
    tls_postgres: tuple[Settings, tls.TestCA], tmp_path: Path
) -> None:
    settings, _ = tls_postgres
    config = connector_config(
        settings, topic_prefix="tls", tables=["public.items"], slot="s", publication="p"
    )
    ssl = {k.removeprefix("database."): v for k, v in config.items() if ".ssl" in k}
    assert ssl == {"sslmode": "verify-full", "sslrootcert": str(settings.postgres.ca_file)}
    assert "ssl=true" in _jdbc_probe(settings, ssl, tmp_path)
    other = tls.make_ca(tmp_path / "other", name="another-test-ca")
    refused = _jdbc_probe(settings, {**ssl, "sslrootcert": str(other.ca_file)}, tmp_path)
    assert "ssl=true" not in refused
    assert "PKIX" in refused or "certif" in refused.lower(), refused[-2000:]
    # the form Spark's executors on other machines get: the CA's text, not its path
    inline = jdbc_ssl_options(settings, inline_ca=True)
    assert "sslrootcert" not in inline
    assert "ssl=true" in _jdbc_probe(settings, inline, tmp_path)
    other_ca = settings.postgres.model_copy(update={"ca_file": other.ca_file})
    stranger = settings.model_copy(update={"postgres": other_ca})
    refused = _jdbc_probe(settings, jdbc_ssl_options(stranger, inline_ca=True), tmp_path)
    assert "ssl=true" not in refused


def test_no_password_in_the_server_log(tls_postgres: tuple[Settings, tls.TestCA]) -> None:
    settings, _ = tls_postgres
    with pytest.raises(psycopg.OperationalError):  # a failed login is logged: not its password
        psycopg.connect(settings.postgres.conninfo(settings.postgres.user, None), connect_timeout=5)
    log = (settings.data_dir / "postgres" / "postgres.log").read_text(errors="replace")
    assert log, "the server log is empty"
    for secret in (ADMIN_PASSWORD, REPLICATION_PASSWORD):
        assert secret not in log
