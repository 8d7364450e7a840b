"""Edits to the settings file that keep its comments and layout (tomlkit)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomlkit

from cdc.core.errors import ConfigError

__all__ = ["add_settings", "config_path", "edit_tables"]


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


def add_settings(values: Mapping[str, Any]) -> tuple[Path, list[str]]:
    """Add `values` (nested as the file's tables are) to the settings file (CDC_CONFIG,
    else ./cdc.toml, made when missing), keeping its comments and layout. A setting the
    file gives already keeps its value (one empty, `[]` or `{}`, takes the new one):
    the file only gains what it did not say. Returns the file and the settings added,
    dotted (pipeline.table."public.products"); nothing added, the file is not written."""
    path = config_path()
    document = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    added = _add(document, values, "")
    if added:
        try:
            path.write_text(tomlkit.dumps(document))
        except OSError as exc:
            raise ConfigError(
                f"cannot write the settings file {path} ({exc.strerror}): make it writable, "
                "or name another with CDC_CONFIG"
            ) from None
    return path, added


def _add(container: Any, values: Mapping[str, Any], prefix: str) -> list[str]:
    added = []
    for key, value in values.items():
        where = f"{prefix}{_toml_key(key)}"
        existing = container.get(key)
        if existing is None and not prefix and isinstance(value, Mapping):  # a section
            container[key] = tomlkit.table()
            added += _add(container[key], value, where + ".")
        elif isinstance(existing, Mapping) and existing and isinstance(value, Mapping):
            added += _add(existing, value, where + ".")
        elif existing is None or (isinstance(existing, Mapping | list) and not existing):
            container[key] = _toml(value)
            added.append(where)
    return added


def _toml(value: Any) -> Any:
    """A value as the file shows it: a table of plain values inline (`mask = { email =
    "hash" }`), one holding tables as a table of its own, a list of tables as an array of
    tables (`[[apply.joins]]`)."""
    if isinstance(value, Mapping):
        if any(isinstance(v, Mapping) or _tables(v) for v in value.values()):
            table = tomlkit.table()
            for key, item in value.items():
                table[key] = _toml(item)
            return table
        inline = tomlkit.inline_table()
        inline.update({key: _toml(item) for key, item in value.items()})
        return inline
    if _tables(value):
        array = tomlkit.aot()
        for item in value:
            array.append(_toml_table(item))
        return array
    return value


def _toml_table(value: Mapping[str, Any]) -> Any:
    table = tomlkit.table()
    for key, item in value.items():
        table[key] = _toml(item)
    return table


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else f'"{key}"'
