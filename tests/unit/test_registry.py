"""The store registry: every store name has a factory, of one of the two kinds, and a
name that is no store is refused at once, before anything runs."""

from __future__ import annotations

import pytest

from cdc.core.apply_settings import STORE_NAMES
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings
from cdc.stores.base import FrameStore, RowStore
from cdc.stores.registry import FACTORIES, check_store_names, make_store
from tests.helpers import run_cdc


def test_every_store_name_has_a_factory_of_one_kind() -> None:
    assert set(FACTORIES) == set(STORE_NAMES)
    settings = Settings()
    for name in ("cache", "search"):  # made without connecting
        store = make_store(settings, name)
        assert isinstance(store, RowStore) and not isinstance(store, FrameStore)
        assert store.name == name
        store.close()
    from cdc.stores.warehouse.store import WarehouseStore

    assert issubclass(WarehouseStore, FrameStore) and not issubclass(WarehouseStore, RowStore)


def test_a_name_that_is_no_store_is_refused_in_one_line() -> None:
    check_store_names(["cache", "warehouse"])
    with pytest.raises(ConfigError, match="unknown store typo: choose from warehouse"):
        check_store_names(["cache", "typo"])
    with pytest.raises(ConfigError):
        make_store(Settings(), "typo")


@pytest.mark.parametrize("command", ["verify", "apply"])
def test_the_cli_refuses_an_unknown_store_before_it_waits(command: str) -> None:
    result = run_cdc(command, "--store", "typo", env={"CDC_POSTGRES__PORT": "1"}, timeout=60)
    assert result.returncode == 2
    assert "unknown store typo" in result.stderr
