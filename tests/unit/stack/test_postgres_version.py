"""postgres.version: which binaries the local stack runs, and the one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.core.errors import ComponentError, NotInstalledError
from cdc.core.settings import Settings
from cdc.stack.components.postgres import Postgres, postgres_bin_dir


def fetched(root: Path, major: int) -> Path:
    """A fake of what ./install.sh extracts for `major` under <cache>/jvm/postgres."""
    bin_dir = root / "jvm" / "postgres" / str(major) / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("postgres", "initdb", "pg_ctl"):
        (bin_dir / tool).touch()
    return bin_dir


def stack(tmp_path: Path, version: int | None) -> Postgres:
    return Postgres(
        Settings(
            data_dir=tmp_path / "data",
            cache_dir=tmp_path / "cache",
            postgres={"version": version},  # type: ignore[arg-type]
        )
    )


def test_a_version_runs_the_binaries_fetched_for_it(tmp_path: Path) -> None:
    if Path("/usr/lib/postgresql/16/bin/postgres").exists():
        pytest.skip("this machine's package gives 16 itself")
    bin_dir = fetched(tmp_path / "cache", 16)
    postgres = stack(tmp_path, 16)
    assert postgres._bin("postgres") == str(bin_dir / "postgres")
    assert postgres_bin_dir(16, tmp_path / "cache" / "jvm" / "postgres") == bin_dir


def test_a_version_not_installed_is_said_in_one_line(tmp_path: Path) -> None:
    if Path("/usr/lib/postgresql/16/bin/postgres").exists():
        pytest.skip("this machine's package gives 16 itself")
    with pytest.raises(NotInstalledError) as refused:
        stack(tmp_path, 16).check_installed()
    message = str(refused.value)
    assert "PostgreSQL 16 is not installed (postgres.version)" in message
    assert "./install.sh" in message and "\n" not in message


def test_a_cluster_keeps_the_major_that_made_it(tmp_path: Path) -> None:
    fetched(tmp_path / "cache", 17)
    fetched(tmp_path / "cache", 14)
    made = stack(tmp_path, None)
    made.data_path.mkdir(parents=True)
    (made.data_path / "PG_VERSION").write_text("17\n")
    assert made.major == 17  # no version set: the cluster's own
    with pytest.raises(ComponentError) as refused:
        stack(tmp_path, 14).check_installed()
    message = str(refused.value)
    assert "is PostgreSQL 17, but postgres.version is 14" in message
    assert "postgres.version = 17" in message and "\n" not in message


def test_the_slot_is_made_in_each_majors_syntax() -> None:
    from cdc.capture.slot import _create_slot

    assert _create_slot("s", 140020) == "CREATE_REPLICATION_SLOT s LOGICAL pgoutput EXPORT_SNAPSHOT"
    made_15 = "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (SNAPSHOT 'export')"
    assert _create_slot("s", 150018) == made_15
    failover = "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)"
    assert _create_slot("s", 170011) == failover
    assert _create_slot("s", 180006) == failover
