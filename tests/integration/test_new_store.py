"""A new store is one package and one entry point line: the tests' own store
(tests/notes_store), installed the way a package would be (its entry point in a
`.dist-info` on the path), is named in `cdc --help`, applied by `cdc apply`, shown by
`cdc status`, and compared with the source by `cdc verify`, which finds the row taken
out of it behind its back."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.conftest import Capture
from tests.helpers import ROOT, run_cdc

pytestmark = pytest.mark.integration


def installed(folder: Path) -> dict[str, str]:
    """The environment in which `tests.notes_store` is an installed store."""
    info = folder / "cdc_notes_store-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cdc-notes-store\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[cdc.stores]\nnotes = tests.notes_store:DECLARATION\n")
    return {"PYTHONPATH": f"{folder}:{ROOT}"}


def test_a_store_of_ones_own_is_applied_shown_and_verified(
    captured: Capture, tmp_path: Path
) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, note text)",
        "INSERT INTO {name} SELECT g, 'n' || g FROM generate_series(1, 20) g",
        prefix="notes",
    )
    folder = tmp_path / "notes"
    env = {
        **t.env,
        **installed(tmp_path),
        "CDC_APPLY__STORES": '["notes"]',
        "CDC_STORES__NOTES__FOLDER": str(folder),  # its own section of the settings
    }
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {t.name} SET note = 'changed' WHERE id = 3")
        conn.execute(f"DELETE FROM {t.name} WHERE id = 4")

    shown = run_cdc("apply", "--help", env=env)
    assert "notes: JSON files" in " ".join(shown.stdout.split())

    applied = run_cdc("apply", "--store", "notes", "--once", env=env, timeout=600)
    assert applied.returncode == 0, applied.stderr
    # the store's own reader: its files
    folder = folder / t.settings.pipeline.name / t.table
    notes = {n["key"]: n for n in (json.loads(p.read_text()) for p in folder.glob("*.json"))}
    live = {json.loads(k)["id"]: n["after"]["note"] for k, n in notes.items() if not n["deleted"]}
    assert live == {i: ("changed" if i == 3 else f"n{i}") for i in range(1, 21) if i != 4}

    status = run_cdc("status", "-o", "json", env=env)
    stores = json.loads(status.stdout)["pipeline"]["stores"]
    assert list(stores) == ["notes"]
    assert stores["notes"]["backlog_events"] == 0
    assert stores["notes"]["freshness"]["slo_s"] == 10.0  # its declared default

    verified = run_cdc("verify", "--store", "notes", "-o", "json", env=env, timeout=600)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    (drift,) = json.loads(verified.stdout)["results"]
    assert (drift["store"], drift["source_rows"], drift["store_rows"]) == ("notes", 19, 19)

    (seventh,) = [
        p for p in folder.glob("*.json") if json.loads(p.read_text())["key"] == '{"id":7}'
    ]
    seventh.unlink()
    drifted = run_cdc("verify", "--store", "notes", "-o", "json", env=env, timeout=600)
    assert drifted.returncode != 0
    (drift,) = [d for d in json.loads(drifted.stdout)["results"] if d["store"] == "notes"]
    assert drift["missing"] == ['{"id":7}'] and not drift["extra"] and not drift["different"]
