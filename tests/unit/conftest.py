"""Fixtures of the fast tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings read as on a machine without CDC_* variables, from a folder without a
    cdc.toml (unless the test writes one)."""
    for key in list(os.environ):
        if key.startswith("CDC_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
