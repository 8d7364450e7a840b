"""tests/unit/ mirrors cdc/: a newcomer finds a room's tests in the folder of the same
name (docs/tests.md), and a store's tests in its store's folder."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "tests" / "unit"
STORES = sorted(
    p.name for p in (ROOT / "cdc" / "stores").iterdir() if (p / "__init__.py").is_file()
)


def _cdc_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n == "cdc" or n.startswith("cdc."))
    return found


def test_every_folder_of_the_unit_tests_names_a_room_of_cdc() -> None:
    strays = [
        str(d.relative_to(UNIT))
        for d in UNIT.rglob("*")
        if d.is_dir()
        and d.name != "__pycache__"
        and d.relative_to(UNIT).parts[0] != "project"  # the repository as a whole
        and not (ROOT / "cdc" / d.relative_to(UNIT)).is_dir()
    ]
    assert not strays, f"tests/unit/ folders with no cdc/ room of that name: {strays}"


def test_a_module_testing_one_store_only_sits_in_that_store_s_folder() -> None:
    misplaced = []
    for path in UNIT.rglob("test_*.py"):
        imports = _cdc_imports(path)
        stores = {
            m.split(".")[2]
            for m in imports
            if m.startswith("cdc.stores.") and len(m.split(".")) > 2 and m.split(".")[2] in STORES
        }
        others = {m for m in imports if not m.startswith("cdc.stores.")}
        if len(stores) == 1 and not others - {"cdc.core.catalog", "cdc.core.settings"}:
            (store,) = stores
            if (UNIT / "stores" / store) not in path.parents:
                misplaced.append(f"{path.relative_to(UNIT)} (tests/unit/stores/{store}/)")
    assert not misplaced, f"a store's tests outside its folder: {misplaced}"
