"""Which class archive a Spark driver maps (cdc/core/class_archive.py): the one built
for its JDK and pyspark, or none; and the one it writes while install.sh builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.core.settings import Settings
from cdc.core.spark import ARCHIVE_OUT, archive_path, archive_stamp, class_archive_options


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.delenv(ARCHIVE_OUT, raising=False)
    return Settings(cache_dir=tmp_path / "cache", data_dir=tmp_path / "data")


def test_no_archive_no_option(settings: Settings) -> None:
    assert class_archive_options(settings) == ""


def test_the_archive_built_for_this_jdk_and_pyspark_is_mapped_quietly(settings: Settings) -> None:
    path = archive_path(settings)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    path.with_suffix(".stamp").write_text(archive_stamp(settings) + "\n")
    options = class_archive_options(settings).split()
    assert f"-XX:SharedArchiveFile={path}" in options
    # a JVM's note about an archive it cannot map would land in a command's output
    assert "-Xlog:cds=off,cds+dynamic=off" in options


def test_an_archive_of_another_jdk_or_pyspark_is_not_mapped(settings: Settings) -> None:
    path = archive_path(settings)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    path.with_suffix(".stamp").write_text("/usr/lib/jvm/other pyspark 3.5.0\n")
    assert class_archive_options(settings) == ""
    path.with_suffix(".stamp").unlink()
    assert class_archive_options(settings) == ""


def test_while_built_the_driver_writes_it_at_exit(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ARCHIVE_OUT, str(tmp_path / "out.jsa"))
    assert (
        class_archive_options(settings).split()[0] == f"-XX:ArchiveClassesAtExit={tmp_path}/out.jsa"
    )
