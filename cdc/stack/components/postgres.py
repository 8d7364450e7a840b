"""A private PostgreSQL cluster with logical decoding enabled."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc.capture.role import REPLICATION_GROUP, generated_secret
from cdc.core.errors import INSTALL_HINT, ComponentError, NotInstalledError
from cdc.core.files import private_folder, read_own, write_file
from cdc.core.settings import admin_password_file, local_admin_password
from cdc.core.settings.connections import PostgresSettings
from cdc.core.state_folders import make_state_dir
from cdc.stack.components.base import Component
from cdc.stack.process import inherited_env

__all__ = ["Postgres", "postgres_bin_dir"]


def postgres_bin_dir(version: int | None = None, fetched: Path | None = None) -> Path | None:
    """The PostgreSQL server binaries of major `version`: the machine's package (Debian's
    layout), else those ./install.sh fetched into `fetched`/<major> (jvm/postgres/pom.xml).
    No version: the newest the machine's packages give (their client tools too)."""
    if version is not None:
        for bin_dir in (
            Path(f"/usr/lib/postgresql/{version}/bin"),
            *([fetched / str(version) / "bin"] if fetched is not None else []),
        ):
            if (bin_dir / "postgres").exists():
                return bin_dir
        return None
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    which = shutil.which("postgres")
    return Path(which).resolve().parent if which else None


class Postgres(Component):
    name = "postgres"
    start_timeout = 60.0
    stop_signal = signal.SIGINT  # fast shutdown: roll back open transactions, checkpoint, exit
    needs_service_user = True

    @property
    def section(self) -> PostgresSettings:
        return self.settings.postgres

    @property
    def address(self) -> str:
        return f"postgresql://{self.section.user}@{self.section.host}:{self.section.port}/{self.section.database}"

    @property
    def data_path(self) -> Path:
        return self.state_dir / "data"

    def ports(self) -> list[int]:
        return [self.section.port]

    @property
    def major(self) -> int | None:
        """The major the cluster runs: postgres.version, else the one that made the
        cluster (a cluster made by 17 stays on 17), else None (the newest installed)."""
        return self.section.version if self.section.version is not None else self._made_by()

    def _made_by(self) -> int | None:
        try:
            return int((self.data_path / "PG_VERSION").read_text().strip())
        except (OSError, ValueError):
            return None

    def _bin(self, tool: str) -> str:
        major = self.major
        bin_dir = postgres_bin_dir(major, self.settings.jvm_dir / "postgres")
        if bin_dir is None or not (bin_dir / tool).exists():
            if major is not None:
                raise NotInstalledError(
                    f"PostgreSQL {major} is not installed (postgres.version): ./install.sh "
                    f"fetches 14, 16, 17 and 18; or apt-get install postgresql-{major}"
                )
            raise NotInstalledError(
                f"postgres is not installed (no PostgreSQL server binaries found): {INSTALL_HINT}"
            )
        return str(bin_dir / tool)

    def check_installed(self) -> None:
        made, wanted = self._made_by(), self.section.version
        if made is not None and wanted is not None and made != wanted:
            raise ComponentError(
                f"postgres: the local cluster in {self.data_path} is PostgreSQL {made}, but "
                f"postgres.version is {wanted}; cdc does not upgrade a cluster: set "
                f"postgres.version = {made}, or use another data_dir (or `cdc down --purge`, "
                "which deletes its data)"
            )
        self._bin("postgres")
        self._bin("initdb")

    def prepare(self) -> None:
        if (self.data_path / "PG_VERSION").exists():
            return
        user = self.service_user()
        run = self.state_dir / "run"
        run.mkdir(exist_ok=True)
        self._generate_password()
        with tempfile.NamedTemporaryFile("w", dir=self.state_dir, delete=False) as pw:
            pw.write(self.section.password.get_secret_value() + "\n")
        try:
            if user is not None:
                user.own(self.state_dir)
            proc = subprocess.run(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self.data_path),
                    "-U",
                    self.section.user,
                    f"--pwfile={pw.name}",
                    "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                ],
                capture_output=True,
                text=True,
                check=False,
                env=inherited_env(),  # no CDC_* (passwords among them)
                user=user.uid if user else None,
                group=user.gid if user else None,
                extra_groups=[] if user else None,
            )
        finally:
            os.unlink(pw.name)
        if proc.returncode != 0:
            write_file(self.log_file, proc.stdout + proc.stderr)
            raise ComponentError(f"postgres: initdb failed; see {self.log_file}")

    def _generate_password(self) -> None:
        """A new cluster's superuser gets a random password unless one is configured: no
        local user logs in with one everyone knows (`postgres`), which as a superuser
        runs programs as the service user (COPY … TO PROGRAM). It is kept in
        <data_dir>/secrets/postgres.password (0600), where load_settings finds it."""
        if "password" in self.section.model_fields_set:
            return
        generated_secret(self.settings, admin_password_file(self.settings))
        self.settings = local_admin_password(self.settings)

    def command(self) -> tuple[list[str], dict[str, str]]:
        settings = {
            "port": self.section.port,
            "listen_addresses": self.section.host,
            "unix_socket_directories": str(self.state_dir / "run"),
            "wal_level": "logical",
            "max_replication_slots": 20,
            "max_wal_senders": 20,
            "max_connections": 200,
            "shared_buffers": "256MB",
            "max_wal_size": "2GB",
            # a slot nobody reads (a failed connector) cannot fill the disk: past this it is
            # invalidated (wal_status lost) and `cdc status` says to take a new snapshot
            "max_slot_wal_keep_size": self.section.max_slot_wal_keep_size,
            "logging_collector": "off",
            # commit times of rows (pg_xact_commit_timestamp), for checking window aggregates
            "track_commit_timestamp": "on",
        }
        if self.section.cert_file is not None:  # TLS, and TCP connections over TLS only
            cert_file, key_file = self._tls_files()
            settings.update(ssl="on", ssl_cert_file=str(cert_file), ssl_key_file=str(key_file))
        self._write_hba(tls=self.section.cert_file is not None)
        argv = [self._bin("postgres"), "-D", str(self.data_path)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv, {}

    def _tls_files(self) -> tuple[Path, Path]:
        """The configured certificate and key, copied where the server reads them: owned by
        the user it runs as, the key 0600 (PostgreSQL refuses a key others can read)."""
        section = self.section
        assert section.cert_file is not None and section.key_file is not None
        tls = self.state_dir / "tls"
        copies = (tls / "server.crt", tls / "server.key")
        user = self.service_user()
        owner = (user.uid, user.gid) if user is not None else None
        private_folder(tls, owner)
        for source, copy in zip((section.cert_file, section.key_file), copies, strict=True):
            try:
                data = source.read_bytes()
            except OSError as exc:
                why = exc.strerror or type(exc).__name__
                raise ComponentError(
                    f"postgres: cannot read {source} (postgres.cert_file/key_file): {why}"
                ) from None
            write_file(copy, data, 0o600, owner)
        return copies

    @property
    def _databases_file(self) -> Path:
        # beside the pid files, cdc's own: the state folder is the service user's (given
        # to it at every start), and what that user owns is not believed (cdc.core.files)
        return self.pid_file.parent / "postgres.databases.json"

    def pipeline_databases(self) -> list[str]:
        """The databases the replication roles may reach: every one the stack was started
        or brought up for (`cdc up` under settings naming it), the settings' own last."""
        known = self._recorded()
        return [*(d for d in known if d != self.section.database), self.section.database]

    def admit_database(self) -> bool:
        """On a running cluster, admit the settings' database too (True if it was not):
        a pipeline on a second database of the local stack needs only `cdc up` under its
        settings. The database is made, pg_hba.conf rewritten with every pipeline
        database and reloaded; the first database's pipelines keep theirs."""
        if self.section.database in self._recorded():
            return False
        self._write_hba(tls=self.section.cert_file is not None)
        with self._connect("postgres") as conn:
            conn.execute("SELECT pg_reload_conf()")
        self.after_start()
        return True

    def _recorded(self) -> list[str]:
        try:
            return [str(d) for d in json.loads(read_own(self._databases_file) or "[]")]
        except (ValueError, TypeError):
            return []

    def _write_hba(self, tls: bool) -> None:
        """Who may connect, written at every start (and when a database is admitted). The
        replication roles (members of REPLICATION_GROUP) reach only the pipelines'
        databases (pipeline_databases), where they stream logical changes
        (`replication=database` connections match a database line); no line admits
        physical replication (`pg_basebackup` would copy the whole cluster, pg_authid too).
        With TLS on, every TCP line admits TLS connections only (`hostssl`). The file is
        replaced, never written through (cdc.core.files): its folder is the service user's."""
        admitted = self.pipeline_databases()
        databases = ",".join('"' + d.replace('"', '""') + '"' for d in admitted)
        group = f"+{REPLICATION_GROUP}"
        host = "hostssl" if tls else "host"
        remote = self.section.host not in ("127.0.0.1", "localhost", "::1")
        addresses = ["127.0.0.1/32", "::1/128", *(["0.0.0.0/0", "::/0"] if remote else [])]
        lines = [
            f"local {databases} {group} scram-sha-256",
            f"local all {group} reject",
            "local all all scram-sha-256",
            *(f"{host} {databases} {group} {a} scram-sha-256" for a in addresses),
            f"{host} all {group} all reject",
            *(f"{host} all all {a} scram-sha-256" for a in addresses),
        ]
        make_state_dir(self.settings, self._databases_file.parent, 0o700)
        write_file(self._databases_file, json.dumps(admitted), 0o600)
        user = self.service_user()
        write_file(
            self.data_path / "pg_hba.conf",
            "# written by cdc at every start: edits are lost\n" + "\n".join(lines) + "\n",
            0o600,
            (user.uid, user.gid) if user is not None else None,
        )

    def _connect(self, database: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(self.section.dsn(database), connect_timeout=3, autocommit=True)

    def ready(self) -> bool:
        with self._connect("postgres") as conn:
            conn.execute("SELECT 1")
        return True

    def after_start(self) -> None:
        with self._connect("postgres") as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.section.database,)
            ).fetchone()
            if not exists:
                conn.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.section.database))
                )

    def version(self) -> str | None:
        with self._connect("postgres") as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]).split()[0] if row else None

    def details(self) -> dict[str, Any]:
        with self._connect("postgres") as conn:
            wal_level = conn.execute("SHOW wal_level").fetchone()
            slots = conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()
        return {
            "wal_level": wal_level[0] if wal_level else None,
            "replication_slots": slots[0] if slots else 0,
        }
