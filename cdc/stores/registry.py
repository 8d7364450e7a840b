"""The store registry: every store the apply job, verify, rebuild and the CLI can name,
made from the settings by what it declares (cdc/core/store_declarations.py: its
package's `DECLARATION`, found through the `cdc.stores` entry points). A store is one
package under cdc/stores/ (or anywhere), a RowStore or a FrameStore with a StoreReader
(cdc/stores/base.py), and one line in pyproject.toml's entry points. The derived views
are reached the same way, by ability: `derived_views`, the views door the store that
keeps them declares."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, SecretStr

from cdc.core.errors import ConfigError, StoreUnavailableError
from cdc.core.settings import Settings
from cdc.core.store_declarations import Ability, check_store_names, declared, with_ability
from cdc.stores.base import DerivedViews, RowStore, StoreReader, StoreWriter

__all__ = [
    "check_store_names",
    "derived_views",
    "executor_settings",
    "make_reader",
    "make_row_store",
    "make_writer",
    "reach",
    "reader_with",
]


def _make(settings: Settings, name: str, spark: Any, half: type[Any]) -> Any:
    check_store_names([name])
    store = declared()[name].factory()(settings, spark)
    if not isinstance(store, half):
        raise ConfigError(f"store {name} is not a {half.__name__}: fix its package")
    return store


def make_writer(settings: Settings, name: str, spark: Any = None) -> StoreWriter:
    """The store `name` as the apply job writes it (the warehouse runs in `spark`, or in a
    session of its own); its module is imported now (the warehouse's brings Delta)."""
    writer: StoreWriter = _make(settings, name, spark, StoreWriter)
    return writer


def make_reader(settings: Settings, name: str, spark: Any = None) -> StoreReader:
    """The store `name` as verify, repair, rebuild and `cdc get` read it back."""
    reader: StoreReader = _make(settings, name, spark, StoreReader)
    return reader


def reach(reader: StoreReader) -> None:
    """Ask `reader`'s store to answer before a command reads or mends it: one that does
    not raises StoreUnavailableError saying what to do."""
    try:
        reader.ping()
    except StoreUnavailableError as exc:
        said = str(exc)
        if "does not answer" in said:  # (a refused login says what to fix)
            said += ": start it (`cdc up`) or check its settings"
        raise StoreUnavailableError(said) from None


def reader_with(settings: Settings, ability: Ability, spark: Any = None) -> StoreReader:
    """The reader of the store that has `ability`: the first of apply.stores that does,
    else the first store installed that does."""
    names = with_ability(settings.apply.stores, ability) or with_ability(declared(), ability)
    if not names:
        raise ConfigError(f"no store installed has the ability {ability!r}: install one that does")
    return make_reader(settings, names[0], spark)


def derived_views(settings: Settings, among: Iterable[str] | None = None) -> DerivedViews | None:
    """The door to the derived views (cdc/stores/base.py DerivedViews) of the store that
    keeps them: the first of `among` with the "views" ability (by default the first of
    apply.stores that has it, else the first store installed that does); None when none
    of them has it."""
    if among is None:
        names = with_ability(settings.apply.stores, "views") or with_ability(declared(), "views")
    else:
        names = with_ability(among, "views")
    if not names:
        return None
    door = declared()[names[0]].views_door()
    if not isinstance(door, DerivedViews):
        raise ConfigError(f"store {names[0]} declares the ability 'views' but no views door")
    return door


def executor_settings(settings: Settings, name: str | None, keep: tuple[str, ...] = ()) -> Settings:
    """The settings Spark's Python workers get to open store `name` (None: no store), or
    the sections `keep` (e.g. "postgres"): every secret but theirs is blanked (the
    settings travel pickled with each task)."""

    def blanked(section: BaseModel) -> BaseModel:
        secret = {
            field: None if info.default is None else SecretStr("")
            for field, info in type(section).model_fields.items()
            if isinstance(getattr(section, field), SecretStr)
        }
        return section.model_copy(update=secret)

    kept = {*keep, *([declared()[name].section] if name is not None else [])}
    update: dict[str, Any] = {
        field: blanked(getattr(settings, field))
        for field, info in type(settings).model_fields.items()
        if field not in kept and isinstance(getattr(settings, field), BaseModel)
    }
    update["stores"] = {
        store: section if store == name else blanked(section)
        for store, section in settings.stores.items()
    }
    update["spark"] = settings.spark.model_copy(update={"conf": {}})
    return settings.model_copy(update=update)


def make_row_store(settings: Settings, name: str) -> RowStore:
    """The row store `name`, as each Python worker opens it."""
    store = make_writer(settings, name)
    if not isinstance(store, RowStore):
        raise TypeError(f"store {name} is not written row by row")
    return store
