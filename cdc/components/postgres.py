"""A private PostgreSQL cluster with logical decoding enabled."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc.components.base import Component
from cdc.errors import INSTALL_HINT, ComponentError, NotInstalledError
from cdc.settings import PostgresSettings

__all__ = ["Postgres", "postgres_bin_dir"]


def postgres_bin_dir() -> Path | None:
    """The newest PostgreSQL server binaries on this machine (Debian layout first)."""
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

    def _bin(self, tool: str) -> str:
        bin_dir = postgres_bin_dir()
        if bin_dir is None or not (bin_dir / tool).exists():
            raise NotInstalledError(
                f"postgres is not installed (no PostgreSQL server binaries found): {INSTALL_HINT}"
            )
        return str(bin_dir / tool)

    def check_installed(self) -> None:
        self._bin("postgres")
        self._bin("initdb")

    def prepare(self) -> None:
        if (self.data_path / "PG_VERSION").exists():
            return
        user = self.service_user()
        run = self.state_dir / "run"
        run.mkdir(exist_ok=True)
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
                user=user.uid if user else None,
                group=user.gid if user else None,
                extra_groups=[] if user else None,
            )
        finally:
            os.unlink(pw.name)
        if proc.returncode != 0:
            self.log_file.write_text(proc.stdout + proc.stderr)
            raise ComponentError(f"postgres: initdb failed; see {self.log_file}")
        # Replication connections from loopback (Debezium, the snapshot's slot creation).
        hba = self.data_path / "pg_hba.conf"
        hba.write_text(
            "local all all scram-sha-256\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host all all ::1/128 scram-sha-256\n"
            "host replication all 127.0.0.1/32 scram-sha-256\n"
            "host replication all ::1/128 scram-sha-256\n"
            + ("host all all 0.0.0.0/0 scram-sha-256\n" if self.section.host != "127.0.0.1" else "")
        )

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
            "logging_collector": "off",
            # commit times of rows (pg_xact_commit_timestamp), for checking window aggregates
            "track_commit_timestamp": "on",
        }
        argv = [self._bin("postgres"), "-D", str(self.data_path)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv, {}

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
