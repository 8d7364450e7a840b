"""Bad input gets one clear line and leaves no half-made setup behind."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr
from rich.console import Console

from cdc.capture.connect_client import connect_client
from cdc.capture.connector_config import register_connector
from cdc.capture.snapshot.initial import run_snapshot
from cdc.capture.source_setup import prepare_source
from cdc.check.status import pipeline_status
from cdc.core.errors import ConnectorError, SnapshotError, SourceError
from cdc.stack.components.postgres import Postgres, postgres_bin_dir
from tests.conftest import Capture, RunningStack
from tests.helpers import free_ports, run_cdc
from tests.logcheck import pipeline_for, poll

pytestmark = pytest.mark.integration


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def publication_exists(settings, name: str) -> bool:  # type: ignore[no-untyped-def]
    with psycopg.connect(settings.postgres.dsn()) as conn:
        return bool(
            conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
        )


@pytest.fixture
def no_key_table(stack: RunningStack):  # type: ignore[no-untyped-def]
    name = "nokey_" + uuid.uuid4().hex[:8]
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (code text, qty int)")
    yield name
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"DROP TABLE {name}")


def test_a_table_without_a_primary_key_is_refused_with_a_way_out(
    captured: Capture,
) -> None:
    t = captured("CREATE TABLE {name} (code text, qty int)", prefix="nokey", snapshot=False)
    no_key_table, settings = t.name, t.settings
    with pytest.raises(SourceError) as info:
        prepare_source(settings)
    text = one_line(info.value)
    assert "no primary key" in text and "REPLICA IDENTITY" not in text
    assert "replica_identity" in text and "key_columns" in text
    assert not publication_exists(settings, settings.pipeline.publication)

    # the way out it names works: full replica identity and explicit key columns
    qualified = f"public.{no_key_table}"
    keyed = settings.model_copy(
        update={
            "pipeline": settings.pipeline.model_copy(
                update={
                    "replica_identity": {qualified: "full"},
                    "key_columns": {qualified: ["code"]},
                }
            )
        }
    )
    tables = prepare_source(keyed)
    assert tables[0].key == ("code",)
    with psycopg.connect(settings.postgres.dsn()) as conn:
        ident = conn.execute(
            "SELECT relreplident FROM pg_class WHERE relname = %s", (no_key_table,)
        ).fetchone()
    assert ident == ("f",)


def test_the_cli_says_it_in_one_line(stack: RunningStack, no_key_table: str) -> None:
    env = {
        **stack.env,
        "CDC_PIPELINE__TABLES": f'["public.{no_key_table}"]',
        "CDC_PIPELINE__NAME": "clierr",
    }
    result = run_cdc("setup", env=env)
    assert result.returncode == 7
    assert result.stderr.strip().count("\n") == 0
    assert "no primary key" in result.stderr


def test_a_table_keyed_by_a_generated_column_is_refused(captured: Capture) -> None:
    """PostgreSQL 15 publishes no generated value: its changes would have no key."""
    t = captured(
        "CREATE TABLE {name} (a int, id int GENERATED ALWAYS AS (a + 1) STORED PRIMARY KEY)",
        prefix="genkey",
        snapshot=False,
    )
    settings = t.settings
    with pytest.raises(SourceError) as info:
        prepare_source(settings)
    text = one_line(info.value)
    assert "keyed by the generated column id" in text and "key_columns" in text
    assert not publication_exists(settings, settings.pipeline.publication)


def test_a_missing_table_is_named(stack: RunningStack) -> None:
    settings = pipeline_for(stack.settings, ["public.no_such_table_anywhere"])
    with pytest.raises(SourceError, match=r"public\.no_such_table_anywhere does not exist"):
        prepare_source(settings)
    assert not publication_exists(settings, settings.pipeline.publication)


def test_missing_privileges_are_named_and_nothing_is_half_made(stack: RunningStack) -> None:
    role = "weak_" + uuid.uuid4().hex[:8]
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'weak'")
        conn.execute(f"CREATE TABLE {role}_t (id int PRIMARY KEY)")
    settings = pipeline_for(stack.settings, [f"public.{role}_t"])
    weak = settings.model_copy(
        update={
            "postgres": settings.postgres.model_copy(
                update={"user": role, "password": SecretStr("weak")}
            )
        }
    )
    try:
        with pytest.raises(SourceError) as info:
            prepare_source(weak)
        text = one_line(info.value)
        assert f"user {role} lacks a privilege" in text and "superuser" in text
        assert "weak" not in text.replace(role, "")  # no password in the message
        assert not publication_exists(settings, settings.pipeline.publication)
    finally:
        with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {role}_t")
            conn.execute(f"DROP ROLE {role}")


def test_wrong_credentials_are_named_without_the_secret(stack: RunningStack) -> None:
    settings = stack.settings.model_copy(
        update={
            "postgres": stack.settings.postgres.model_copy(
                update={"password": SecretStr("not-it-42")}
            )
        }
    )
    with pytest.raises(SourceError) as info:
        prepare_source(settings)
    text = one_line(info.value)
    assert "refused the password" in text and "not-it-42" not in text


def test_wal_level_not_logical_is_refused(stack: RunningStack) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-wal-"))
    data_dir.chmod(0o755)
    port = free_ports(1)[0]
    settings = stack.settings.model_copy(
        update={
            "data_dir": data_dir,
            "postgres": stack.settings.postgres.model_copy(update={"port": port}),
        }
    )

    class ReplicaOnly(Postgres):
        def command(self):  # type: ignore[no-untyped-def]
            argv, env = super().command()
            return [a.replace("wal_level=logical", "wal_level=replica") for a in argv], env

    server = ReplicaOnly(settings)
    server.start()
    try:
        with pytest.raises(SourceError) as info:
            prepare_source(settings)
        text = one_line(info.value)
        assert "wal_level=replica" in text and "wal_level=logical" in text
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_slot_in_use_is_not_taken_over(captured: Capture) -> None:
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="busy", snapshot=False)
    settings = t.settings
    pg = settings.postgres
    recvlogical = str(postgres_bin_dir() / "pg_recvlogical")  # type: ignore[operator]
    dsn = f"host={pg.host} port={pg.port} dbname={pg.database} user={pg.user}"
    env = {"PGPASSWORD": pg.password.get_secret_value()}
    slot = settings.pipeline.slot
    subprocess.run(
        [recvlogical, "-d", dsn, "--slot", slot, "--create-slot", "-P", "pgoutput"],
        check=True,
        env=env,
    )
    consumer = subprocess.Popen(
        [
            recvlogical,
            "-d",
            dsn,
            "--slot",
            slot,
            "--start",
            "-f",
            "/dev/null",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={settings.pipeline.publication}",
        ],
        env=env,
    )
    try:
        with psycopg.connect(pg.dsn()) as conn:
            poll(
                lambda: bool(
                    conn.execute(
                        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    ).fetchone()
                    == (True,)
                ),
                30,
                "pg_recvlogical to hold the slot",
            )
        with pytest.raises(SnapshotError) as info:
            run_snapshot(settings, Console(file=io.StringIO()))
        text = one_line(info.value)
        assert f"slot {slot} is in use by pid" in text
    finally:
        consumer.terminate()
        consumer.wait()


def test_a_failing_connector_is_summarized(captured: Capture) -> None:
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="fail", snapshot=False)
    name, settings = t.name, t.settings
    tables = prepare_source(settings)
    # refused at registration: Debezium cannot log in
    bad = settings.model_copy(
        update={
            "pipeline": settings.pipeline.model_copy(
                update={"replication_password": SecretStr("nope-7")}
            )
        }
    )
    with pytest.raises(ConnectorError) as info:
        register_connector(bad, tables, timeout=30)
    assert "nope-7" not in one_line(info.value)

    # failing while streaming: the publication disappears under it
    run_snapshot(settings, Console(file=io.StringIO()))
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"DROP PUBLICATION {settings.pipeline.publication}")
        conn.execute(f"INSERT INTO {name} VALUES (1)")
    deadline = time.monotonic() + 60
    status = pipeline_status(settings)
    while not (status.connector and status.connector.get("error")):
        assert time.monotonic() < deadline, status
        time.sleep(1)
        status = pipeline_status(settings)
    assert "FAILED" in status.connector["tasks"]
    assert "publication" in status.connector["error"].lower()
    assert "\n" not in status.connector["error"]


def test_a_table_name_that_would_leave_its_warehouse_folder_is_refused(captured: Capture) -> None:
    """A role that may create tables in a captured schema names one so that its warehouse
    folder would be another table's (`<schema>/<name>/current`): setup refuses it."""
    t = captured(
        'CREATE TABLE public."{name}/../../public/victim" (id int PRIMARY KEY)',
        prefix="path",
        tables=["public.{name}*"],
        snapshot=False,
    )
    result = run_cdc("setup", env=t.env)
    assert result.returncode == 7, result.stderr
    said = result.stderr.strip()
    assert said.count("\n") == 0, said
    assert f"table public.{t.name}/../../public/victim cannot be captured" in said, said
    assert "path separator" in said, said


@pytest.mark.parametrize(
    ("column", "said"),
    [
        ("_cdc_note", "its column _cdc_note starts with _cdc_"),
        ("valid_from", "its column valid_from is one the warehouse history adds"),
        ("_id", "its column _id is one of OpenSearch's metadata fields"),
    ],
)
def test_a_column_named_like_one_a_store_adds_is_refused(
    captured: Capture, column: str, said: str
) -> None:
    """A store's own columns (positions, flags, the history's validity, OpenSearch's
    metadata fields) cannot be a table's too: setup says which column, in one line."""
    t = captured(
        f"CREATE TABLE {{name}} (id int PRIMARY KEY, {column} text)",
        prefix="own",
        snapshot=False,
    )
    result = run_cdc("setup", env=t.env)
    assert result.returncode == 7, result.stderr
    line = result.stderr.strip()
    assert line.count("\n") == 0, line
    assert f"table public.{t.name} cannot be captured: {said}" in line, line


def test_a_command_meeting_kafka_down_where_no_step_expected_it_says_one_line() -> None:
    """`cdc dlq list` reads the dead-letter topic with no step of its own for a Kafka
    that does not answer: the CLI says it in one line, exit 5 (a traceback before)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    result = run_cdc("dlq", "list", env={"CDC_KAFKA__PORT": str(closed)}, timeout=120)
    assert result.returncode == 5, result.stderr[-2000:]
    line = result.stderr.strip()
    assert line.count("\n") == 0 and "Traceback" not in line, line
    assert line.startswith("error: Kafka could not be reached (") and str(closed) in line, line


def test_a_drop_that_cannot_reach_postgresql_changes_nothing(captured: Capture) -> None:
    """`cdc drop` with PostgreSQL not answering says so and leaves the connector and its
    offsets (before, it deleted them, then failed at the slot: a slot kept WAL for a
    connector that was gone)."""
    t = captured("CREATE TABLE {name} (id int PRIMARY KEY)", prefix="keep")
    (closed,) = free_ports(1)
    env = {**t.env, "CDC_POSTGRES__PORT": str(closed)}
    result = run_cdc("drop", "--yes", "--keep-role", env=env)
    assert result.returncode == 5, result.stdout[-1000:] + result.stderr[-2000:]
    line = result.stderr.strip()
    assert line.count("\n") == 0 and f"PostgreSQL at 127.0.0.1:{closed} does not answer" in line
    client = connect_client(t.settings)
    assert t.settings.pipeline.connector in client.connectors()
    client.wait_running(t.settings.pipeline.connector, timeout=60)
