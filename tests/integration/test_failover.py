"""Failover without a new snapshot (PostgreSQL 17+): a primary and a physical standby of
its own on this machine, the pipeline's slot a failover slot that the standby's slot
sync worker keeps, and `synchronized_standby_slots` on the primary so the connector
never gets a change the standby lacks. Under load the primary dies (an immediate
shutdown), the standby is promoted, and the pipeline is pointed at it (`cdc setup`
under its address). Capture goes on from the promoted server's copy of the slot: no
new snapshot, no change lost or doubled, and every store, read by the test's own
readers, equals the promoted server. The timeline guard accepts the promotion (the
stores had applied nothing past the fork) and records the new timeline.

The standby is made with PostgreSQL's low-level backup API (pg_backup_start, a copy
of the files, pg_backup_stop's label): the fetched builds have no pg_basebackup."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rich.console import Console

from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import logged_position
from cdc.capture.pipeline import drop_pipeline
from cdc.capture.slot import lsn_to_int
from cdc.capture.snapshot.initial import run_snapshot
from cdc.capture.snapshot.record import read_state
from cdc.core.settings import Settings
from cdc.log.progress import progress_file
from cdc.stack.components.postgres import Postgres
from tests.conftest import RunningStack
from tests.helpers import apply_process, free_ports, run_cdc
from tests.logcheck import pipeline_env, pipeline_for
from tests.stores import cache, history_rows, search, warehouse

pytestmark = [pytest.mark.integration, pytest.mark.long]

MAJOR = 17  # failover slots and their sync worker came in 17
STORES = ["cache", "search", "warehouse"]
STANDBY_SLOT = "standby1"


@dataclass
class Pair:
    """A primary and its physical standby: settings of each, and their components."""

    primary: Settings
    standby: Settings
    primary_pg: Postgres
    standby_pg: Postgres


def _copy_data(source: Path, target: Path) -> None:
    """The files of a running cluster, as a base backup takes them: no WAL (the standby
    streams it from its slot), no slot state, no pid or options file."""

    def skipped(folder: str, names: list[str]) -> list[str]:
        inside = Path(folder).relative_to(source).as_posix()
        if inside in ("pg_wal", "pg_replslot", "pg_stat_tmp"):
            return [n for n in names if n != "archive_status"]
        if inside == "pg_wal/archive_status":
            return names
        return [n for n in names if n in ("postmaster.pid", "postmaster.opts")]

    shutil.copytree(source, target, ignore=skipped, symlinks=True)


@pytest.fixture
def pair(stack: RunningStack) -> Iterator[Pair]:
    """A PostgreSQL 17 primary and a streaming standby of it, each in a folder of its own."""
    folders = [Path(tempfile.mkdtemp(prefix=f"cdc-{role}-")) for role in ("primary", "standby")]
    ports = free_ports(2)
    made = []
    for folder, port in zip(folders, ports, strict=True):
        folder.chmod(0o755)  # the service user runs PostgreSQL when the tests run as root
        made.append(
            stack.settings.model_copy(
                update={
                    "data_dir": folder,
                    "postgres": stack.settings.postgres.model_copy(
                        update={"port": port, "version": MAJOR}
                    ),
                }
            )
        )
    primary, standby = made
    primary_pg, standby_pg = Postgres(primary), Postgres(standby)
    try:
        primary_pg.start()
        pg = primary.postgres
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            # the standby streams as the superuser: a physical replication line for it
            hba = primary_pg.data_path / "pg_hba.conf"
            line = f"host replication {pg.user} 127.0.0.1/32 scram-sha-256\n"
            hba.write_text(hba.read_text() + line)
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", (STANDBY_SLOT,))
            conn.execute("SELECT pg_backup_start('standby', true)")
            _copy_data(primary_pg.data_path, standby_pg.data_path)
            row = conn.execute("SELECT labelfile, spcmapfile FROM pg_backup_stop(false)").fetchone()
            assert row is not None
            # the logical walsenders wait for the standby: the connector never gets a
            # change the standby lacks (after the copy: the standby must not inherit it)
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
            conn.execute("SELECT pg_reload_conf()")
        copy = standby_pg.data_path
        (copy / "backup_label").write_text(row[0])
        if row[1]:
            (copy / "tablespace_map").write_text(row[1])
        (copy / "standby.signal").write_text("")
        conninfo = pg.conninfo(pg.user, pg.password, application_name="standby1")
        escaped = conninfo.replace("\\", "\\\\").replace("'", "''")  # a conf string
        with (copy / "postgresql.auto.conf").open("a") as auto:
            auto.write(
                f"primary_conninfo = '{escaped}'\n"
                f"primary_slot_name = '{STANDBY_SLOT}'\n"
                "hot_standby_feedback = on\n"
                "sync_replication_slots = on\n"
            )
        (standby_pg.state_dir / "run").mkdir()
        standby_pg.start()
        yield Pair(primary, standby, primary_pg, standby_pg)
    finally:
        for component in (standby_pg, primary_pg):
            component.stop()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


class Load:
    """Small transactions against one server until stopped or the server goes: each
    inserts a new row and adds one to another row's n."""

    def __init__(self, dsn: str, table: str, first_id: int) -> None:
        self.dsn, self.table, self.next_id = dsn, table, first_id
        self.committed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._stop.wait(0.03):
                    with conn.transaction():
                        conn.execute(
                            f"INSERT INTO {self.table} VALUES (%s, 0, 'load')", (self.next_id,)
                        )
                        conn.execute(
                            f"UPDATE {self.table} SET n = n + 1 WHERE id = %s",
                            (self.next_id % 200 + 1,),
                        )
                    self.next_id += 1
                    self.committed += 1
        except psycopg.OperationalError:
            return  # the server went away (the failover)


def _rows(dsn: str, table: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT id, n, note FROM {table}").fetchall()
    return {int(i): (int(n), str(note)) for i, n, note in found}


def _store_rows(settings: Settings, table: str) -> dict[str, dict[int, tuple[int, str]]]:
    readers = {"cache": cache, "search": search, "warehouse": warehouse}
    return {
        store: {
            int(k): (int(row["n"]), str(row["note"]))
            for k, row in readers[store](settings, table).items()
        }
        for store in STORES
    }


def _wait_equal(settings: Settings, dsn: str, table: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        wanted = _rows(dsn, table)
        try:
            held = _store_rows(settings, table)
        except Exception as exc:  # a store's first batch has not made its table yet
            assert time.monotonic() < deadline, exc
            time.sleep(3)
            continue
        if all(rows == wanted for rows in held.values()):
            return
        assert time.monotonic() < deadline, {
            s: sorted(set(rows.items()) ^ set(wanted.items()))[:6] for s, rows in held.items()
        }
        time.sleep(3)


def _kill(postgres: Postgres) -> None:
    """An immediate shutdown (no shutdown checkpoint, no last WAL sent to a standby)."""
    pid = int((postgres.data_path / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + 30
    while (postgres.data_path / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    postgres.stop()


def _promote(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_promote(true, 60)").fetchone() == (True,)
        timeline = conn.execute(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"
        ).fetchone()
        assert timeline is not None and int(timeline[0], 16) == 2  # a new timeline


def _synced(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return bool(row and row[0])


def _snapshot_synced(settings: Settings, standby_dsn: str, name: str, rows: int) -> None:
    """The pipeline's table made on the primary with `rows` rows, its snapshot taken, and
    its failover slot synchronized to the standby."""
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, n int, note text)")
        conn.execute(f"INSERT INTO {name} SELECT i, 0, 'v0' FROM generate_series(1, {rows}) i")
    run_snapshot(settings, Console(file=io.StringIO()))
    deadline = time.monotonic() + 120
    while not _synced(standby_dsn, settings.pipeline.slot):
        assert time.monotonic() < deadline, "the standby never synchronized the slot"
        time.sleep(1)


def test_a_promoted_standby_goes_on_from_the_synced_slot_without_a_new_snapshot(
    stack: RunningStack, pair: Pair
) -> None:
    name = "fo_" + uuid.uuid4().hex[:8]
    table = f"public.{name}"
    # the stack's settings (its Kafka, Connect and secrets) with the pair's primary
    settings = pipeline_for(
        stack.settings.model_copy(update={"postgres": pair.primary.postgres}), [table]
    )
    pipe = settings.pipeline
    addresses = {
        "CDC_POSTGRES__PORT": str(pair.primary.postgres.port),
        "CDC_POSTGRES__STANDBYS": json.dumps([f"127.0.0.1:{pair.standby.postgres.port}"]),
        "CDC_APPLY__STORES": json.dumps(STORES),
    }
    env = pipeline_env({**stack.env, **addresses}, settings)
    primary_dsn, standby_dsn = pair.primary.postgres.dsn(), pair.standby.postgres.dsn()
    try:
        _snapshot_synced(settings, standby_dsn, name, 200)
        with psycopg.connect(primary_dsn) as conn:
            snapshot = read_state(conn, pipe.name)
        assert snapshot is not None and snapshot.status == "done"
        shown = json.loads(run_cdc("status", "-o", "json", env=env).stdout)["pipeline"]["slot"]
        assert shown["failover"] is True and shown["health"] == "ok", shown["problem"]
        assert [s["synced"] for s in shown["standbys"]] == [True]

        with apply_process(env, STORES):
            with Load(primary_dsn, name, 1001) as before:
                time.sleep(15)
                # the primary dies under load
                _kill(pair.primary_pg)
            assert before.committed > 50, before.committed
        _promote(standby_dsn)

        # the pipeline pointed at the promoted server: its address, and `cdc setup`
        moved = {**env, "CDC_POSTGRES__PORT": str(pair.standby.postgres.port)}
        moved.pop("CDC_POSTGRES__STANDBYS")
        there = settings.model_copy(update={"postgres": pair.standby.postgres})
        setup = run_cdc("setup", env=moved, timeout=300)
        assert setup.returncode == 0, setup.stdout[-1500:] + setup.stderr[-1500:]
        with apply_process(moved, STORES):
            with Load(standby_dsn, name, before.next_id + 1) as after:
                time.sleep(15)
            assert after.committed > 50, after.committed
            _wait_equal(there, standby_dsn, table, 420)

        # no new snapshot: the same generation, the same consistent point
        with psycopg.connect(standby_dsn) as conn:
            state = read_state(conn, pipe.name)
        assert state is not None and (state.status, state.lsn) == ("done", snapshot.lsn)
        # no change doubled: one version per (key, position), and each of a key's
        # updates (n + 1 each) is a version of its own
        versions = [r.asDict() for r in history_rows(there, table).collect()]
        positions = [(v["id"], v["_cdc_commit_lsn"], v["_cdc_lsn"]) for v in versions]
        assert len(positions) == len(set(positions))
        counts = [(v["id"], v["n"]) for v in versions if v["_cdc_op"] in ("c", "u", "r")]
        assert len(counts) == len(set(counts))
        # the guard took the promotion: each store now records the new timeline
        for store in STORES:
            recorded = json.loads(progress_file(there, store).read_text())
            assert recorded["source"][1] == 2, (store, recorded["source"])
        status = run_cdc("status", "-o", "json", env=moved)
        slot = json.loads(status.stdout)["pipeline"]["slot"]
        assert slot["active"] is True and slot["health"] == "ok", slot["problem"]
    finally:  # the connector, topics and state; the primary's is gone with its folder
        drop_pipeline(settings.model_copy(update={"postgres": pair.standby.postgres}))


def test_a_standby_promoted_without_changes_the_log_holds_is_refused(
    stack: RunningStack, pair: Pair
) -> None:
    """Review F7: without synchronized_standby_slots the connector gets changes the
    standby lacks. Promoted, the standby's timeline leaves the old one before what the
    log holds: `cdc setup` pointing the pipeline at it refuses in one line (exit 11),
    instead of the stores applying changes the new primary never had and the connector
    skipping the new primary's own up to its stored position."""
    name = "fo_" + uuid.uuid4().hex[:8]
    table = f"public.{name}"
    settings = pipeline_for(
        stack.settings.model_copy(update={"postgres": pair.primary.postgres}), [table]
    )
    env = pipeline_env(
        {**stack.env, "CDC_POSTGRES__PORT": str(pair.primary.postgres.port)}, settings
    )
    primary_dsn, standby_dsn = pair.primary.postgres.dsn(), pair.standby.postgres.dsn()
    try:
        _snapshot_synced(settings, standby_dsn, name, 50)
        with psycopg.connect(primary_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET synchronized_standby_slots")
            conn.execute("SELECT pg_reload_conf()")
        shown = json.loads(run_cdc("status", "-o", "json", env=env).stdout)["pipeline"]["slot"]
        assert shown["health"] == "warning"
        assert "does not name the physical slot(s) standby1" in shown["problem"]
        with psycopg.connect(standby_dsn, autocommit=True) as conn:  # the standby falls behind
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 60
            while conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone() != (0,):
                assert time.monotonic() < deadline, "the standby still receives WAL"
                time.sleep(0.5)
            behind = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
        assert behind is not None
        with psycopg.connect(primary_dsn, autocommit=True) as conn:  # the standby never gets these
            conn.execute(f"UPDATE {name} SET note = 'lost' WHERE id <= 10")
            past = conn.execute("SELECT pg_current_wal_lsn() > %s::pg_lsn", (behind[0],)).fetchone()
        assert past == (True,)
        client = connect_client(settings)
        deadline = time.monotonic() + 120
        while (logged_position(client, settings.pipeline.connector) or 0) <= lsn_to_int(behind[0]):
            assert time.monotonic() < deadline, "the connector never delivered the changes"
            time.sleep(1)
        _kill(pair.primary_pg)
        _promote(standby_dsn)

        moved = {**env, "CDC_POSTGRES__PORT": str(pair.standby.postgres.port)}
        setup = run_cdc("setup", env=moved, timeout=300)
        assert setup.returncode == 11, setup.stdout[-1500:] + setup.stderr[-1500:]
        line = setup.stderr.strip().splitlines()[-1]
        assert "writes on timeline 2, which left timeline 1 at" in line, line
        assert "the log holds changes this server never had" in line, line
        assert "Traceback" not in setup.stderr
    finally:
        drop_pipeline(settings.model_copy(update={"postgres": pair.standby.postgres}))
