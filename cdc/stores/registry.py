"""The store registry: every store the apply job, verify, rebuild and the CLI can name,
and how each is made from the settings. The names are `cdc.core.apply_settings.STORE_NAMES` (the
settings validate them); a store is one module under cdc/stores/, a
RowStore or a FrameStore (cdc/stores/base.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, SecretStr

from cdc.core.apply_settings import STORE_NAMES
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings
from cdc.stores.base import RowStore, Store
from cdc.stores.warehouse.tables import warehouse_root

__all__ = [
    "FACTORIES",
    "STORE_NAMES",
    "check_store_names",
    "executor_settings",
    "make_row_store",
    "make_store",
]


def check_store_names(names: Iterable[str]) -> None:
    """Raise ConfigError, in one line, for a name that is not a store."""
    unknown = [n for n in names if n not in STORE_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown store {', '.join(unknown)}: choose from {', '.join(STORE_NAMES)}"
        )


def _cache(settings: Settings, spark: Any) -> Store:
    from cdc.stores.cache.store import CacheStore

    return CacheStore(
        settings.redis,
        settings.pipeline.topic_prefix,
        settings.apply.deleted_marker_ttl_s,
        settings.apply.store_retry_s,
    )


def _search(settings: Settings, spark: Any) -> Store:
    from cdc.stores.search.store import SearchStore

    return SearchStore(
        settings.opensearch, settings.pipeline.topic_prefix, settings.apply.store_retry_s
    )


def _warehouse(settings: Settings, spark: Any) -> Store:
    from cdc.stores.warehouse.store import WarehouseStore

    if spark is None:
        from cdc.core.spark import spark_session

        spark = spark_session(settings, f"cdc-{settings.pipeline.name}")
    return WarehouseStore(spark, warehouse_root(settings), writer=settings.apply.warehouse_writer)


# a store's module is imported when the store is made (the warehouse's brings Delta)
FACTORIES: dict[str, Callable[[Settings, Any], Store]] = {
    "cache": _cache,
    "search": _search,
    "warehouse": _warehouse,
}


def make_store(settings: Settings, name: str, spark: Any = None) -> Store:
    """The store `name` (the warehouse runs in `spark`, or in a session of its own)."""
    check_store_names([name])
    return FACTORIES[name](settings, spark)


# the settings section that holds each store's connection (and its secrets)
_SECTIONS = {"cache": "redis", "search": "opensearch"}


def executor_settings(settings: Settings, name: str) -> Settings:
    """The settings Spark's Python workers get to open store `name`: every secret but
    that store's own is blanked (the settings travel pickled with each task)."""

    def blanked(section: BaseModel) -> BaseModel:
        secret = {
            field: None if info.default is None else SecretStr("")
            for field, info in type(section).model_fields.items()
            if isinstance(getattr(section, field), SecretStr)
        }
        return section.model_copy(update=secret)

    keep = _SECTIONS.get(name)
    update: dict[str, Any] = {
        field: blanked(getattr(settings, field))
        for field, info in type(settings).model_fields.items()
        if field != keep and isinstance(getattr(settings, field), BaseModel)
    }
    update["spark"] = settings.spark.model_copy(update={"conf": {}})
    return settings.model_copy(update=update)


def make_row_store(settings: Settings, name: str) -> RowStore:
    """The row store `name`, as each Python worker opens it."""
    store = make_store(settings, name)
    if not isinstance(store, RowStore):
        raise TypeError(f"store {name} is not written row by row")
    return store
