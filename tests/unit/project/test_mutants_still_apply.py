"""`make mutants` changes one line per mutant: each line must still be in its file, and
its tests must exist, or the mutant would test nothing."""

from __future__ import annotations

from pathlib import Path

from tests.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[3]


def test_every_mutant_finds_its_line_and_its_tests() -> None:
    assert MUTANTS
    for mutant in MUTANTS:
        assert (ROOT / mutant.path).read_text().count(mutant.before) == 1, mutant.name
        for test in mutant.tests:
            path, _, name = test.partition("::")
            text = (ROOT / path).read_text()
            assert not name or f"def {name}(" in text, (mutant.name, test)
