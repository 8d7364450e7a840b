"""The demo's settings (its views, columns, masks and row filter) go to the settings file,
so the commands run after it read what the demo ran with; the user's own file keeps what
it says."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cdc.cli.demo import demo_settings, keep_demo_settings, with_demo_choice, with_demo_views
from cdc.core.settings import Settings, load_settings


def as_the_demo_ran(settings: Settings) -> tuple[object, ...]:
    demo = with_demo_choice(with_demo_views(settings))
    return _chosen(demo)


def _chosen(s: Settings) -> tuple[object, ...]:
    return s.pipeline.table, s.pipeline.replica_identity, s.apply.joins, s.apply.windows


def test_the_commands_after_the_demo_read_its_settings(clean_env: None, tmp_path: Path) -> None:
    said: list[str] = []
    path = keep_demo_settings(load_settings(), said.append)
    assert path == tmp_path / "cdc.toml" and path.is_file()
    assert said and str(path) in said[0] and not [s for s in said if "warning" in s]
    after = load_settings()  # what `cdc apply`, `cdc verify`, `cdc query` read
    assert _chosen(after) == as_the_demo_ran(Settings())
    assert after.pipeline.table and after.apply.joins and after.apply.windows
    assert demo_settings(after) == {}  # the demo adds nothing more: it runs on them too
    written = path.read_text()
    assert keep_demo_settings(after, said.append) == path and path.read_text() == written


def test_a_users_file_keeps_what_it_says(clean_env: None, tmp_path: Path) -> None:
    path = tmp_path / "cdc.toml"
    mine = (
        '# my settings\n[pipeline]\nname = "shop"  # keep\n'
        'replica_identity = { "public.orders" = "full" }\n\n'
        "[apply]\njoins = []\n"
    )
    path.write_text(mine)
    before = load_settings()
    keep_demo_settings(before, lambda _: None)
    text = path.read_text()
    assert text.startswith('# my settings\n[pipeline]\nname = "shop"  # keep\n')
    after = load_settings()
    assert after.pipeline.name == "shop"
    assert after.pipeline.replica_identity == {"public.orders": "full", "public.products": "full"}
    assert _chosen(after) == as_the_demo_ran(before)
    assert tomllib.loads(text)["apply"]["joins"]  # an empty setting takes the demo's


def test_views_of_the_users_own_are_left_alone(clean_env: None, tmp_path: Path) -> None:
    path = tmp_path / "cdc.toml"
    path.write_text('[[apply.windows]]\nname = "mine"\ntable = "public.orders"\nsum = "total"\n')
    keep_demo_settings(load_settings(), lambda _: None)
    after = load_settings()
    assert [w.name for w in after.apply.windows] == ["mine"] and not after.apply.joins
    assert after.pipeline.table  # the choice of columns and rows is the demo's still
    assert _chosen(after) == as_the_demo_ran(after)


def test_the_environment_overriding_the_file_is_said(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_APPLY__JOINS", "[]")  # a list given replaces the file's
    said: list[str] = []
    keep_demo_settings(load_settings(), said.append)
    assert [s for s in said if s.startswith("warning") and "CDC_APPLY__JOINS" in s], said
