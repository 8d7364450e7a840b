"""Every module a comment or docstring of cdc/ names (`envelope.py`, `cdc/apply/batch.py`)
exists: a module renamed or moved takes the words that point at it along."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# a file name ending in .py, alone or as a path, not part of a longer word or path
NAMED = re.compile(r"(?<![\w/.-])((?:\w+/)*\w+\.py)\b")


def test_every_module_a_comment_names_exists() -> None:
    package = ROOT / "cdc"
    names = {p.name for top in ("cdc", "tests", "bench") for p in (ROOT / top).rglob("*.py")}
    missing = []
    for path in sorted(package.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for named in NAMED.findall(line):
                if "/" in named:
                    found = any((base / named).exists() for base in (ROOT, package, path.parent))
                else:
                    found = named in names or (ROOT / named).exists()
                if not found:
                    missing.append(f"{path.relative_to(ROOT)}:{number} names {named}")
    assert len(names) > 50  # the package was read
    assert not missing
