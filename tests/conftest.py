"""Two tiers: tests/unit (pure logic, seconds) and tests/integration (the real stack).

The integration tier starts the real stack once per test run, on free ports in
a temporary directory, and always stops it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
from psycopg import sql
from rich.console import Console

from cdc.capture.pipeline import drop_pipeline
from cdc.capture.snapshot.initial import run_snapshot
from cdc.core.settings import Settings
from tests.helpers import free_ports, run_cdc
from tests.logcheck import pipeline_env, pipeline_for


@dataclass(frozen=True)
class RunningStack:
    """The running test stack: its settings and the CDC_* environment that selects it."""

    settings: Settings
    env: dict[str, str]


def pytest_configure(config: pytest.Config) -> None:
    """No test reads the cdc.toml of the folder it runs in (`make demo` and `cdc tables
    add` write one there): `cdc` and Settings() read an empty one unless a test names
    its own (CDC_CONFIG)."""
    if "CDC_CONFIG" not in os.environ:
        empty = Path(tempfile.mkdtemp(prefix="cdc-test-config-")) / "cdc.toml"
        empty.write_text("# the tests' settings file (tests/conftest.py): empty\n")
        os.environ["CDC_CONFIG"] = str(empty)


def stack_env(data_dir: Path) -> dict[str, str]:
    ports = free_ports(8)
    # the stack's settings file, empty: not the cdc.toml of the folder `cdc` runs in
    config = data_dir / "cdc.toml"
    config.write_text("# the test stack's settings file (tests/conftest.py): empty\n")
    return {
        "CDC_CONFIG": str(config),
        "CDC_DATA_DIR": str(data_dir),
        # a password with a space and a quote: every connection string must quote it
        "CDC_POSTGRES__PASSWORD": f"pg {uuid.uuid4().hex[:12]} 'pw",
        "CDC_POSTGRES__PORT": str(ports[0]),
        "CDC_KAFKA__PORT": str(ports[1]),
        "CDC_KAFKA__CONTROLLER_PORT": str(ports[2]),
        "CDC_CONNECT__PORT": str(ports[3]),
        "CDC_OPENSEARCH__PORT": str(ports[4]),
        "CDC_OPENSEARCH__TRANSPORT_PORT": str(ports[5]),
        "CDC_REDIS__PORT": str(ports[6]),
        "CDC_KAFKA__HEAP": "512m",
        "CDC_CONNECT__HEAP": "512m",
        "CDC_OPENSEARCH__HEAP": "512m",
        # the PostgreSQL major of the test stack (`make test` runs the pg_matrix tests on a
        # second one, `make test-long` on each of 14 to 18); none: the machine's package
        **(
            {"CDC_POSTGRES__VERSION": os.environ["CDC_TEST_POSTGRES_VERSION"]}
            if os.environ.get("CDC_TEST_POSTGRES_VERSION")
            else {}
        ),
    }


def settings_for(env: dict[str, str]) -> Settings:
    saved = {k: v for k, v in os.environ.items() if k.startswith("CDC_")}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for key in env:
            del os.environ[key]
        os.environ.update(saved)


@pytest.fixture(scope="session")
def stack() -> Iterator[RunningStack]:
    reuse = os.environ.get("CDC_TEST_STACK")
    if reuse:  # a stack someone else runs (tests/mutants.py): its CDC_* environment
        env = json.loads(Path(reuse).read_text())
        yield RunningStack(settings_for(env), env)
        return
    # PostgreSQL and OpenSearch run as the unprivileged service user when tests run as root:
    # the state directory must be reachable by it.
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-test-"))
    data_dir.chmod(0o755)
    env = stack_env(data_dir)
    try:
        result = run_cdc("up", env=env)
        if result.returncode != 0:
            pytest.fail(f"`cdc up` failed: {result.stderr.strip()}", pytrace=False)
        yield RunningStack(settings_for(env), env)
    finally:
        run_cdc("down", "--purge", "--yes", env=env)
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass(frozen=True)
class Captured:
    """A table of the test's own (random name, in `public`) and a pipeline of its own on it."""

    settings: Settings  # the stack's, with the pipeline (random names) capturing the tables
    name: str  # the table's name: `{name}` in the statements that made it
    table: str  # public.<name>
    dsn: str
    env: dict[str, str]  # the CDC_* environment that runs `cdc` on this pipeline


class Capture(Protocol):
    def __call__(
        self,
        *statements: str,
        prefix: str = "t",
        tables: Sequence[str] = ("public.{name}",),
        snapshot: bool = True,
        **pipeline: Any,
    ) -> Captured: ...


@pytest.fixture
def captured(stack: RunningStack) -> Iterator[Capture]:
    """Make tables and a pipeline capturing them; drop both at the end, whatever happened.

    `captured("CREATE TABLE {name} (...)", "INSERT INTO {name} ...", prefix="edge")` picks
    a random name (`edge_` and 8 hex digits), runs each statement with `{name}` replaced
    by it, builds a pipeline of random names capturing `tables` (`{name}` replaced too;
    a pattern such as `public.{name}*` is fine; `pipeline` are further PipelineSettings,
    `{name}` replaced in them too)
    and takes its initial snapshot unless `snapshot=False`. On teardown the pipeline is
    dropped (`drop_pipeline`), then every table in `public` whose name starts with the
    random name (`{name}`, `{name}_child`, ...) with DROP TABLE IF EXISTS ... CASCADE,
    and every enum and domain so named (`{name}_mood`).
    """
    with ExitStack() as cleanup:  # every callback runs, last registered first

        def capture(
            *statements: str,
            prefix: str = "t",
            tables: Sequence[str] = ("public.{name}",),
            snapshot: bool = True,
            **pipeline: Any,
        ) -> Captured:
            name = f"{prefix}_{uuid.uuid4().hex[:8]}"
            settings = pipeline_for(
                stack.settings,
                [t.replace("{name}", name) for t in tables],
                **_named(pipeline, name),
            )
            dsn = settings.postgres.dsn()
            # registered before anything is made: dropped even if what follows fails
            cleanup.callback(_drop_tables, dsn, name)
            cleanup.callback(drop_pipeline, settings)
            with psycopg.connect(dsn, autocommit=True) as conn:
                for statement in statements:
                    conn.execute(statement.replace("{name}", name))
            if snapshot:
                run_snapshot(settings, Console(file=io.StringIO()))
            env = pipeline_env(stack.env, settings)
            return Captured(settings=settings, name=name, table=f"public.{name}", dsn=dsn, env=env)

        yield capture


def _named(value: Any, name: str) -> Any:
    """`value` with `{name}` replaced by `name` in every string and key within it."""
    if isinstance(value, str):
        return value.replace("{name}", name)
    if isinstance(value, dict):
        return {_named(k, name): _named(v, name) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_named(v, name) for v in value)
    return value


def _drop_tables(dsn: str, name: str) -> None:
    """Drop every table, enum and domain in `public` whose name starts with `name`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
            "AND relkind IN ('r', 'p') AND starts_with(relname, %s)",
            (name,),
        ).fetchall()
        if found:
            targets = sql.SQL(", ").join(sql.Identifier("public", r[0]) for r in found)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(targets))
        types = conn.execute(  # an enum or a domain the statements made ({name}_mood...)
            "SELECT typname FROM pg_type WHERE typnamespace = 'public'::regnamespace "
            "AND typtype IN ('e', 'd') AND starts_with(typname, %s)",
            (name,),
        ).fetchall()
        for (typname,) in types:
            conn.execute(
                sql.SQL("DROP TYPE IF EXISTS {} CASCADE").format(sql.Identifier("public", typname))
            )
