"""What each store declares about itself, where it lives (its package's `DECLARATION`):
its name, what it is, the settings section with its connection and secrets, its default
freshness SLO, what `posture = "production"` needs of it, the column names it cannot
keep, what it can do, and the function that makes it. The settings, the registry, the
commands' help and the posture check are derived from these declarations.

A store is found through the `cdc.stores` entry points (pyproject.toml: one line per
store, `name = "package:DECLARATION"`); `register` adds one in this process (a test's
store). The entry points are read when first asked, not when this module is imported:
the settings validate store names with them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol

from cdc.core.errors import ConfigError

__all__ = [
    "Ability",
    "Publisher",
    "StoreDeclaration",
    "check_store_names",
    "declared",
    "register",
    "store_help",
    "unknown_stores",
    "with_ability",
]

GROUP = "cdc.stores"

# what a store can do beyond being written and read back:
# - views: it keeps the derived views (`apply.joins`, `apply.windows`), found through its
#   declaration's `views` door, written from its batches (so the apply job that runs it
#   runs theirs: StoreWriter.take_views), and verify compares them (its reader is a
#   ViewReader, cdc/stores/base.py);
# - own_process: beside other stores, `cdc apply` may run it in a process of its own;
# - expectations: `cdc verify` also runs its data-quality expectations over its live
#   rows (its reader is a FrameReader, cdc/stores/base.py);
# - sql: `cdc query` runs Spark SQL over its tables (its reader is a SqlReader)
# - text_search: `cdc search` searches its documents by text (its reader is a TextSearcher)
# - snapshot: `cdc snapshot` writes its rows into it itself, as Kafka records, through its
#   `write_batch` (a FrameStore), and its apply skips those records
#   (cdc/apply/snapshot_into.py)
Ability = Literal["views", "own_process", "expectations", "sql", "text_search", "snapshot"]


class Publisher(Protocol):
    """What a store publishes its tables as, besides (the warehouse's Iceberg tables):
    the apply job publishes while it runs, `cdc status` shows how far it lags."""

    name: str

    def publish_all(self, say: Callable[[str], None] | None = None, strict: bool = False) -> Any:
        """Publish every table that changed since it was last published."""
        ...

    def status(self) -> dict[str, Any]:
        """How many tables there are and which lag (`tables`, `behind`), or `error`."""
        ...


@dataclass(frozen=True)
class StoreDeclaration:
    name: str  # as `apply.stores` and `--store` name it
    summary: str  # what it is, in a few words (the commands' help)
    make: str  # "module:function", function(settings, spark) -> the store; imported when made
    slo_s: float  # the default commit-to-visible p99 it is held to (apply.freshness_slo_s)
    # the settings section of its connection and secrets: one of the Settings' own
    # (`redis`), or, with `settings`, its own (`[stores.<name>]`, of that class)
    section: str | None = None
    settings: type[Any] | None = None
    # what posture = production needs of it, given the Settings (which are built from
    # these declarations), or None when they meet it
    posture: Callable[[Any], str | None] | None = None
    # why a column of this name cannot be kept beside the store's own, or None
    reserved: Callable[[str], str | None] | None = None
    # why a table's columns of these names cannot be kept side by side in the store (two
    # names it would take for one field), or None
    clashes: Callable[[list[str]], str | None] | None = None
    abilities: frozenset[Ability] = field(default_factory=frozenset)
    # "module:function", function(settings) -> its Publisher, or None when its settings
    # ask for none; imported when asked
    publisher: str | None = None
    # "module:name", its derived views (the "views" ability): a DerivedViews
    # (cdc/stores/base.py), through which the apply job and the checks reach them;
    # imported when asked
    views: str | None = None
    # why it takes one writing process at a time under the Settings, or None: its writers
    # (the apply job, a repair's removals) then hold a lock (cdc.core.one_writer)
    one_writer: Callable[[Any], str | None] | None = None
    # settings it kept elsewhere before its own section: old dotted key -> its key in
    # `[stores.<name>]`, read as it for one release with a deprecation line
    renamed: Mapping[str, str] = field(default_factory=dict)
    # what `cdc setup` checks or keeps in it, given the Settings and the tables the
    # pipeline selects ("schema.table"), before it changes anything: the lines it says;
    # a CdcError refuses the setup, in one line
    setup: Callable[[Any, list[str]], list[str]] | None = None

    def factory(self) -> Callable[[Any, Any], Any]:
        """function(settings, spark) -> the store."""
        made: Callable[[Any, Any], Any] = _imported(self.make)
        return made

    def publisher_of(self, settings: Any) -> Publisher | None:
        """The store's publisher under `settings`, or None."""
        if self.publisher is None:
            return None
        made: Publisher | None = _imported(self.publisher)(settings)
        return made

    def views_door(self) -> Any:
        """Its derived views' door (a DerivedViews, cdc/stores/base.py), or None."""
        return None if self.views is None else _imported(self.views)


def _imported(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(import_module(module), name)


_REGISTERED: dict[str, StoreDeclaration] = {}


@cache
def _installed() -> dict[str, StoreDeclaration]:
    found = {}
    for point in entry_points(group=GROUP):
        declaration = point.load()
        if not isinstance(declaration, StoreDeclaration) or declaration.name != point.name:
            raise ConfigError(
                f"the store entry point {point.name} = {point.value} is not a "
                f"StoreDeclaration named {point.name}; fix the package that declares it"
            )
        found[point.name] = declaration
    if not found:
        raise ConfigError(
            "no store is installed (no cdc.stores entry points): run ./install.sh, "
            "which installs this project with its stores"
        )
    return found


def declared() -> dict[str, StoreDeclaration]:
    """Every store, by name: the installed ones in their entry points' order, then the
    ones registered in this process."""
    return {**_installed(), **_REGISTERED}


def register(declaration: StoreDeclaration) -> None:
    """Add a store in this process (as an entry point adds one to every process)."""
    _REGISTERED[declaration.name] = declaration


def unknown_stores(names: Iterable[str]) -> str | None:
    """What is wrong with `names`, in one line, if one is not a store (None: nothing)."""
    known = declared()
    unknown = [n for n in names if n not in known]
    if unknown:
        return f"unknown store {', '.join(unknown)}: choose from {', '.join(known)}"
    return None


def check_store_names(names: Iterable[str]) -> None:
    """Raise ConfigError, in one line, for a name that is not a store."""
    if problem := unknown_stores(names):
        raise ConfigError(problem)


def with_ability(stores: Iterable[str], ability: Ability) -> list[str]:
    """Those of `stores` that declare `ability`."""
    known = declared()
    return [s for s in stores if s in known and ability in known[s].abilities]


def store_help(note: str = "") -> str:
    """The help of a `--store` option: the stores to choose from, and a `note`."""
    stores = "; ".join(f"{d.name}: {d.summary}" for d in declared().values())
    return f"{stores} ({note})" if note else stores
