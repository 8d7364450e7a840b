"""`cdc tables add` refuses what `cdc setup` would refuse before it writes the settings
file: a refused name never reaches pipeline.tables, so later commands are unaffected."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from tests.conftest import RunningStack
from tests.helpers import run_cdc

pytestmark = pytest.mark.integration


def test_a_refused_table_is_not_written_to_the_settings_file(
    stack: RunningStack, tmp_path: Path
) -> None:
    name = f"tc{uuid.uuid4().hex[:8]}"
    kept, odd = f"{name}_ok", f"../{name}/evil"
    config = tmp_path / "cdc.toml"
    config.write_text(f'[pipeline]\nname = "{name}"\ntables = ["public.{kept}"]\n')
    before = config.read_text()
    env = {**stack.env, "CDC_CONFIG": str(config)}
    dsn = stack.settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {kept} (id int PRIMARY KEY)")
        conn.execute(f'CREATE TABLE "{odd}" (id int PRIMARY KEY)')
    try:
        for table, why in ((f"public.{odd}", "path separator"), (f"public.{name}_no", "")):
            result = run_cdc("tables", "add", table, env=env)
            said = result.stderr.strip()
            assert result.returncode != 0 and why in said, said
            assert len(said.splitlines()) == 1 and "Traceback" not in said, said
            assert config.read_text() == before  # nothing written
        shown = run_cdc("config", env=env)  # the file is still good
        assert shown.returncode == 0 and f"public.{kept}" in shown.stdout, shown.stderr
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS {kept}, "{odd}"')
