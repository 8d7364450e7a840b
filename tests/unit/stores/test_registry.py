"""The store registry: every store is found by its declaration (the `cdc.stores` entry
points), made as the half a caller asks for, and a name that is no store is refused at
once, in one line, before anything runs."""

from __future__ import annotations

import json

import pytest

from cdc.core import store_declarations
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from cdc.core.store_declarations import StoreDeclaration, declared, register, store_help
from cdc.stores.base import (
    DerivedViews,
    FrameReader,
    FrameStore,
    RowStore,
    SqlReader,
    StoreReader,
    TextSearcher,
    ViewReader,
)
from cdc.stores.registry import (
    check_store_names,
    derived_views,
    executor_settings,
    make_reader,
    make_writer,
)
from tests.helpers import run_cdc


def test_every_installed_store_is_declared_and_made_as_both_halves() -> None:
    stores = declared()
    assert set(stores) >= {"warehouse", "search", "cache"}
    settings = Settings()
    assert settings.apply.stores == list(stores)  # the default: every store
    for name in ("cache", "search"):  # made without connecting
        store = make_writer(settings, name)
        assert isinstance(store, RowStore) and not isinstance(store, FrameStore)
        assert isinstance(store, StoreReader) and store.name == name
        store.close()
    from cdc.stores.warehouse.store import WarehouseStore

    assert issubclass(WarehouseStore, FrameStore) and not issubclass(WarehouseStore, RowStore)
    assert issubclass(WarehouseStore, StoreReader)
    assert stores["warehouse"].abilities == {
        "views",
        "own_process",
        "expectations",
        "sql",
        "snapshot",
    }
    assert stores["search"].abilities == {"text_search"}
    assert settings.apply.slo_s("cache") == 5.0 and settings.apply.slo_s("warehouse") == 30.0
    assert "cache: Redis" in store_help() and "warehouse: Delta Lake" in store_help()


def test_a_store_with_an_ability_reads_as_that_ability_asks() -> None:
    """Each ability a store declares is a reader of its kind (cdc/stores/base.py), which
    is all that verify, the quality checks and the queries ask of it."""
    readers = {
        "views": ViewReader,
        "expectations": FrameReader,
        "sql": SqlReader,
        "text_search": TextSearcher,
    }
    checked = 0
    for declaration in declared().values():
        made = declaration.factory()
        store_class = made.__annotations__.get("return")
        module = __import__(made.__module__, fromlist=["_"])
        kind = getattr(module, store_class) if isinstance(store_class, str) else store_class
        for ability in declaration.abilities & set(readers):
            wanted = readers[ability]
            missing = [
                m
                for m in dir(wanted)
                if not m.startswith("_") and callable(getattr(wanted, m, None))
                if not callable(getattr(kind, m, None))
            ]
            assert not missing, (declaration.name, ability, missing)
            checked += 1
    assert checked >= 4


def test_a_store_that_keeps_the_views_declares_their_door() -> None:
    """The apply job and the checks reach the derived views through the door of the store
    that keeps them (its declaration's `views`), never by its name."""
    keepers = [d for d in declared().values() if "views" in d.abilities]
    assert keepers
    for declaration in keepers:
        assert isinstance(declaration.views_door(), DerivedViews), declaration.name
    settings = Settings()
    door = derived_views(settings)
    assert door is not None and door.of(settings) == []  # no view declared
    assert derived_views(settings, ["cache", "search"]) is None


def test_a_name_that_is_no_store_is_refused_in_one_line() -> None:
    check_store_names(["cache", "warehouse"])
    with pytest.raises(ConfigError, match=r"unknown store typo: choose from .*warehouse"):
        check_store_names(["cache", "typo"])
    with pytest.raises(ConfigError):
        make_reader(Settings(), "typo")
    with pytest.raises(ConfigError, match=r"invalid setting apply.stores.*unknown store typo"):
        load_settings(apply={"stores": ["cache", "typo"]})
    with pytest.raises(ConfigError, match=r"invalid setting apply.freshness_slo_s"):
        load_settings(apply={"freshness_slo_s": {"typo": 1.0}})


def test_a_store_registered_in_a_process_is_a_store_like_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A declaration is all the settings, the help, the posture and the registry need."""
    monkeypatch.setattr(store_declarations, "_REGISTERED", {})  # this test's only
    register(
        StoreDeclaration(
            name="notes",
            summary="a test's store",
            make="tests.unit.stores.test_registry:_make_notes",
            slo_s=7.0,
            section="redis",
            posture=lambda s: "notes.tls" if not s.redis.tls else None,
            reserved=lambda column: "is the notes' own" if column == "note" else None,
        )
    )
    settings = load_settings(apply={"stores": ["notes"]})
    assert settings.apply.slo_s("notes") == 7.0
    assert "notes: a test's store" in store_help()
    with pytest.raises(ConfigError, match=r"posture = production needs .*notes\.tls"):
        load_settings(apply={"stores": ["notes"]}, posture="production")
    from cdc.core.catalog import reserved_problem

    assert "is the notes' own" in (reserved_problem(["id", "note"], ["notes"]) or "")
    assert reserved_problem(["id", "note"], ["cache"]) is None
    # its worker settings keep its own section's secret, as the cache's do
    kept = executor_settings(settings.model_copy(), "notes")
    assert kept.redis == settings.redis
    with pytest.raises(ConfigError, match="store notes is not a StoreWriter"):
        make_writer(settings, "notes")


def _make_notes(settings: Settings, spark: object) -> object:
    return object()


@pytest.mark.parametrize("command", ["verify", "apply"])
def test_the_cli_refuses_an_unknown_store_before_it_waits(command: str) -> None:
    result = run_cdc(command, "--store", "typo", env={"CDC_POSTGRES__PORT": "1"}, timeout=60)
    assert result.returncode == 2
    assert "unknown store typo" in result.stderr


def test_a_stores_own_settings_are_validated_masked_and_kept_from_other_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.notes_store import DECLARATION

    monkeypatch.setattr(store_declarations, "_REGISTERED", {})
    register(DECLARATION)
    settings = load_settings(stores={"notes": {"folder": "/n", "token": "s3cret"}})
    assert str(settings.store_section("notes").folder) == "/n"
    assert "s3cret" not in json.dumps(settings.masked())
    assert executor_settings(settings, "notes").store_section("notes").token is not None
    assert executor_settings(settings, "cache").store_section("notes").token is None
    assert Settings().store_section("notes").folder is None  # its defaults
    with pytest.raises(ConfigError, match=r"invalid setting stores.*typo"):
        load_settings(stores={"notes": {"typo": 1}})
    with pytest.raises(ConfigError, match=r"invalid setting stores.*no settings of its own"):
        load_settings(stores={"cache": {}})


def test_names_opensearch_takes_for_one_field_are_refused_for_the_index() -> None:
    """A dot in a field name is a path in OpenSearch: `a` and `a.b` would be a field and
    an object at once, `x.` is `x`, `.x` and `a..b` no field; each is refused in one line
    for the search index only. Other dotted names are fields like any other."""
    from cdc.core.catalog import reserved_problem

    for columns, found in [
        (["id", "a.b", "a"], "its columns a and a.b are a field and a field of it"),
        (["id", "a", "a.b.c"], "its columns a and a.b.c are a field and a field of it"),
        (["id", "x."], "its column x. is no field OpenSearch can map"),
        (["id", ".x"], "its column .x is no field OpenSearch can map"),
        (["id", "a..b"], "its column a..b is no field OpenSearch can map"),
        (["id", "_id.x"], "its column _id.x is one of OpenSearch's metadata fields"),
    ]:
        problem = reserved_problem(columns, ["search"]) or ""
        assert found in problem and "\n" not in problem, (columns, problem)
        assert reserved_problem(columns, ["cache", "warehouse"]) is None
    assert reserved_problem(["id", "dot.ted", "a.b.c", "a.bc", "a.b c"], ["search"]) is None


def test_the_warehouses_old_keys_are_read_as_its_section_with_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The keys the warehouse kept in `[apply]` before `[stores.warehouse]` are read as its
    section's for one release, each with one line saying what to set instead."""
    from cdc.core import settings as settings_module
    from cdc.stores.warehouse.settings import warehouse_settings

    monkeypatch.setattr(settings_module, "_SAID", set())  # said once per process
    monkeypatch.setenv("CDC_APPLY__WAREHOUSE_WRITER", "spark")
    monkeypatch.setenv("CDC_APPLY__WAREHOUSE_NICE", "9")
    monkeypatch.setenv("CDC_STORES__WAREHOUSE__MAX_OFFSETS_PER_TRIGGER", "1500")
    settings = load_settings()
    own = warehouse_settings(settings)
    assert (own.writer, own.max_offsets_per_trigger, own.iceberg) == ("spark", 1500, False)
    assert settings.apply.own_process_nice == 9
    said = capsys.readouterr().err
    assert "apply.warehouse_writer is deprecated: set [stores.warehouse] writer" in said
    assert "apply.warehouse_nice is deprecated: set [apply] own_process_nice" in said
    # the new key wins over the old one
    monkeypatch.setenv("CDC_STORES__WAREHOUSE__WRITER", "delta-rs")
    assert warehouse_settings(load_settings()).writer == "delta-rs"
