"""Where the streaming queries keep their Spark checkpoints (`[apply] checkpoints`), and
what the driver reads of one (cdc/log/checkpoints.py); the bucket case is
tests/integration/test_object_storage.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cdc.core.settings import Settings
from cdc.core.settings.apply import ApplySettings
from cdc.log.checkpoints import checkpoint, checkpoints_of_pipeline
from cdc.log.progress import forget_other_view_queries, progress_file


def _settings(tmp_path: Path, where: str | None = None) -> Settings:
    return Settings(data_dir=tmp_path / "data", apply=ApplySettings(checkpoints=where))  # type: ignore[call-arg]


def _commit(folder: Path, *batches: int) -> None:
    (folder / "commits").mkdir(parents=True, exist_ok=True)
    for batch in batches:
        (folder / "commits" / str(batch)).write_text("v1\n{}")
    (folder / "metadata").write_text('{"id": "3f1c"}')


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("form", ["folder", "file-url"])
def test_checkpoints_in_a_folder_of_their_own_and_the_records_stay_in_data_dir(
    tmp_path: Path, form: str
) -> None:
    elsewhere = tmp_path / "shared" / "checkpoints"
    settings = _settings(tmp_path, str(elsewhere) if form == "folder" else f"file://{elsewhere}")
    name = settings.pipeline.name
    query = checkpoint(settings, "warehouse")
    assert query.path == str(elsewhere / name / "warehouse")
    assert str(query).endswith(f"{elsewhere}/{name}/warehouse")  # as Spark is given it
    assert query.last_committed_batch() is None  # before its first batch
    _commit(elsewhere / name / "warehouse", 0, 1, 7)
    _commit(elsewhere / name / "window-w", 0)
    assert query.last_committed_batch() == 7
    assert query.query_id() == "3f1c"
    assert query.read("commits/7").startswith("v1")
    assert sorted(c.label for c in checkpoints_of_pipeline(settings)) == ["warehouse", "window-w"]
    # the driver's own records are not moved with them
    assert progress_file(settings, "warehouse").parent == tmp_path / "data" / "checkpoints" / name
    # a view query that left: its checkpoint there and its definition here both go
    records = progress_file(settings, "x").parent
    records.mkdir(parents=True)
    (records / "window-w.definition").write_text("d")
    forget_other_view_queries(settings, set())
    assert not (elsewhere / name / "window-w").exists()
    assert not (records / "window-w.definition").exists()
    assert (elsewhere / name / "warehouse").exists()  # a store's: kept
    query.remove()
    assert query.last_committed_batch() is None and not Path(query.path).exists()
    query.remove()  # nothing left: nothing to do


def test_the_default_is_data_dir(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    query = checkpoint(settings, "cache")
    assert query.path == str(tmp_path / "data" / "checkpoints" / settings.pipeline.name / "cache")
    assert checkpoints_of_pipeline(settings) == []


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("hdfs://nn/checkpoints", "cannot read (hdfs://)"),
        ("/", "give a folder or s3://bucket/prefix"),
    ],
)
def test_a_place_the_driver_cannot_read_is_refused(where: str, said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ApplySettings(checkpoints=where)
    assert said in str(refused.value)


def test_a_bucket_without_a_name_is_one_line(tmp_path: Path) -> None:
    from cdc.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[apply\] checkpoints 's3:///x' names no bucket"):
        checkpoint(_settings(tmp_path, "s3:///x"), "cache")
