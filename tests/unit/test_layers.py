"""The import graph, read from the modules' own import statements (those inside
functions too): each floor imports only itself and the floors below, and no modules
import each other in a circle. The floors are docs/layout.md."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdc", "snapshot", "materializers", "commands")
LOCAL_STACK = ("cdc.stack",)
CAPTURE = "cdc.capture"  # what makes the log: above the library's base, below the engines
# floor -> the floors it may import
MAY_IMPORT = {
    "library": {"library"},
    "capture": {"library", "capture"},
    "local stack": {"library", "capture", "local stack"},
    "engines": {"library", "capture", "engines"},
    "commands": {"library", "capture", "local stack", "engines", "commands"},
}


def floor(module: str) -> str:
    if module.startswith("commands"):
        return "commands"
    if module.startswith(("snapshot", "materializers")):
        return "engines"
    if any(module == m or module.startswith(m + ".") for m in LOCAL_STACK):
        return "local stack"
    if module == CAPTURE or module.startswith(CAPTURE + "."):
        return "capture"
    return "library"


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
    upward = sorted(
        f"{a} ({floor(a)}) -> {b} ({floor(b)})"
        for a, targets in edges.items()
        for b in targets
        if floor(b) not in MAY_IMPORT[floor(a)]
    )
    assert not upward


# materializers' rooms, in the order of the data flow: each imports only the rooms
# before it (materializers/__init__.py)
ROOMS = ("log", "stores", "views", "check", "apply")


def room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "materializers" or len(parts) < 2:
        return None
    if parts[1] not in ROOMS:
        return "outside every room"
    return parts[1]


def test_materializers_rooms_import_only_the_rooms_before_them() -> None:
    edges = _graph()
    modules = [m for m in _modules() if m.startswith("materializers.")]
    assert all(room(m) in ROOMS for m in modules), [m for m in modules if room(m) not in ROOMS]
    backwards = sorted(
        f"{a} ({room(a)}) -> {b} ({room(b)})"
        for a, targets in edges.items()
        if room(a) in ROOMS
        for b in targets
        if room(b) in ROOMS and ROOMS.index(room(b)) > ROOMS.index(room(a))  # type: ignore[arg-type]
    )
    assert len([a for a in edges if room(a) in ROOMS]) > 20  # the rooms were read
    assert not backwards


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
