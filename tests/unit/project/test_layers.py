"""The import graph, read from the modules' own import statements (those inside
functions too): each floor imports only itself and the floors below, and no modules
import each other in a circle. The floors are docs/layout.md."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("cdc",)
# cdc's folders, the stages of the flow from the ground floor up: each imports only
# itself and the folders before it, except the local stack, which sits beside the engines
# (log to check) and imports what makes the log and nothing above
FLOORS = ("core", "types", "capture", "log", "stores", "apply", "check", "stack", "cli")
MAY_IMPORT = {f: set(FLOORS[: i + 1]) for i, f in enumerate(FLOORS)}
MAY_IMPORT["stack"] = {"core", "types", "capture", "stack"}


def floor(module: str) -> str:
    parts = module.split(".")
    if module == "cdc.__main__":
        return "cli"
    if len(parts) < 2 or parts[1] not in FLOORS:
        return "outside every floor"
    return parts[1]


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in PACKAGES:
                    resolved = resolve(target)
                    if resolved and resolved != name:
                        edges[name].add(resolved)
    return edges


def test_each_floor_imports_only_the_floors_below() -> None:
    edges = _graph()
    assert len(edges) > 40  # the graph was read
    modules = [m for m in _modules() if m != "cdc"]
    assert all(floor(m) in FLOORS for m in modules), [m for m in modules if floor(m) not in FLOORS]
    upward = sorted(
        f"{a} ({floor(a)}) -> {b} ({floor(b)})"
        for a, targets in edges.items()
        for b in targets
        if floor(b) not in MAY_IMPORT[floor(a)]
    )
    assert not upward


def test_no_modules_import_each_other_in_a_circle() -> None:
    edges = _graph()
    circles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not circles


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in helper modules under tests/, not in a test module."""
    borrowed = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.rpartition(".")[2].startswith("test_"):
                borrowed.append(f"{path.relative_to(ROOT)}: {module}")
    assert not borrowed


# the modules outside a store's package that still name a store, each with why; every
# other module asks the registry for a store by what it can do (its abilities)
NAMES_A_STORE = {
    "cdc.cli.commands.check": "`cdc get --store` defaults to the cache",
    "cdc.cli.demo": "the demo shows each store by name",
    "cdc.core.state_folders": "the warehouse's default folder ([stores.warehouse] path unset), "
    "and the object store its path names (cdc.core.object_store)",
}


def test_no_module_outside_a_stores_package_names_it() -> None:
    """Neither an import of a store's package nor its name as a string, outside it: the
    apply job, the checks and the queries reach each store through the registry."""
    from cdc.core.store_declarations import declared

    stores = set(declared())
    found = []
    for name, path in _modules().items():
        parts = name.split(".")
        if parts[:2] == ["cdc", "stores"] and len(parts) > 2 and parts[2] in stores:
            continue  # the store's own package
        if any(name == m or name.startswith(f"{m}.") for m in NAMES_A_STORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and node.value in stores:
                found.append(f"{name}:{node.lineno} names {node.value!r}")
                continue
            else:
                continue
            for target in targets:
                bits = target.split(".")
                if bits[:2] == ["cdc", "stores"] and len(bits) > 2 and bits[2] in stores:
                    found.append(f"{name}:{node.lineno} imports {target}")
    assert not found


def test_a_sub_room_s_own_module_is_imported_only_by_it_and_the_room_above() -> None:
    """A module whose name starts with `_` (stores/warehouse/write/_marks.py) is its
    folder's own: only modules of that folder, or of the folder just above it (the door
    of the room it serves), import it."""
    modules = _modules()
    own = [m for m, path in modules.items() if path.name.startswith("_") and "__" not in path.name]
    assert own  # the sub-rooms' own modules were found
    trespass = []
    for name, targets in _graph().items():
        here = modules[name].parent
        for target in targets:
            folder = modules[target].parent
            if target in own and here not in (folder, folder.parent):
                trespass.append(f"{name} -> {target}")
    assert not trespass
