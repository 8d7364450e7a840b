"""Every benchmark still imports: a name it takes from cdc/ that moved or went fails here,
not on the day someone runs it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.mark.parametrize("module", sorted(p.stem for p in BENCH.glob("*.py")))
def test_a_benchmark_imports(module: str) -> None:
    importlib.import_module(f"bench.{module}")
