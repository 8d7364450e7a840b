"""Edits to the settings file that keep its comments and layout (tomlkit)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import tomlkit

from cdc.core.errors import ConfigError

__all__ = ["config_path", "edit_tables"]


def config_path() -> Path:
    named = os.environ.get("CDC_CONFIG")
    return Path(named) if named else Path.cwd() / "cdc.toml"


def edit_tables(
    add: list[str], remove: list[str], check: Callable[[list[str]], object] | None = None
) -> tuple[Path, list[str]]:
    """Add and remove entries of pipeline.tables in the settings file; returns the new list.
    `check` is given the new list first, and raises (a CdcError) to refuse it: the file
    is written only once it is accepted."""
    if "CDC_PIPELINE__TABLES" in os.environ:
        raise ConfigError(
            "pipeline.tables comes from CDC_PIPELINE__TABLES: change that variable instead"
        )
    from cdc.core.settings import load_settings

    current = list(load_settings().pipeline.tables)
    path = config_path()
    document = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    pipeline = document.setdefault("pipeline", tomlkit.table())
    tables = [t for t in current if t not in remove]
    missing = [t for t in remove if t not in current]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} is not in pipeline.tables ({', '.join(current)}); "
            "a table matched by a pattern is left out with pipeline.exclude_tables"
        )
    tables += [t if "." in t else f"public.{t}" for t in add if t not in tables]
    if check is not None:
        check(tables)
    pipeline["tables"] = tables
    path.write_text(tomlkit.dumps(document))
    return path, tables
