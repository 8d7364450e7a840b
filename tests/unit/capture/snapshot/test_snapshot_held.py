"""What a store holds of the change topics because the snapshot wrote it there itself
(cdc/capture/snapshot/held.py): the record, and when a store's progress is past it."""

from __future__ import annotations

from pathlib import Path

from cdc.capture.snapshot.held import Held, forget_held, read_held, record_held
from cdc.core.settings import Settings


def test_a_store_is_past_what_it_holds_once_it_applied_every_held_partitions_last_record() -> None:
    held = Held(100, {"p.public.t:0": 10, "p.public.t:1": 5, "p.public.t:2": 0})
    assert not held.covers({})
    assert not held.covers({"p.public.t:0": 9, "p.public.t:1": 3})
    assert held.covers({"p.public.t:0": 9, "p.public.t:1": 4})  # a partition with none: past
    assert held.covers({"p.public.t:0": 12, "p.public.t:1": 4, "other:0": 1})
    assert Held(100).covers({})  # nothing written yet


def test_the_record_is_kept_per_store_and_forgotten_by_a_new_snapshot_or_a_rebuild(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path)
    assert read_held(settings, "warehouse") is None
    record_held(settings, "warehouse", Held(7, {"t:0": 3}))
    record_held(settings, "other", Held(7, {"t:0": 2}))
    assert read_held(settings, "warehouse") == Held(7, {"t:0": 3})
    forget_held(settings, "warehouse")  # rebuilt from the log: it reads them again
    assert read_held(settings, "warehouse") is None
    assert read_held(settings, "other") == Held(7, {"t:0": 2})
    forget_held(settings)  # a new snapshot: no store holds anything of it
    assert read_held(settings, "other") is None


def test_a_damaged_record_counts_as_none(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    record_held(settings, "warehouse", Held(7, {"t:0": 3}))
    folder = tmp_path / "checkpoints" / settings.pipeline.name
    (folder / "snapshot-held-warehouse.json").write_text("{not json")
    assert read_held(settings, "warehouse") is None
