"""No room of cdc/ outgrows the house: each folder (its own modules; a sub-room such as
stores/warehouse/write/ or capture/snapshot/ is a room of its own) holds at most 15% of
cdc/'s lines, and no module is over 800 lines (docs/layout.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "cdc"


def _lines() -> dict[Path, int]:
    return {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}


def test_no_room_holds_more_than_15_percent_of_the_lines() -> None:
    lines = _lines()
    total = sum(lines.values())
    assert total > 20_000  # the package was read
    rooms: Counter[str] = Counter()
    for path, n in lines.items():
        rooms[str(path.parent.relative_to(ROOT))] += n
    over = {room: f"{100 * n / total:.1f}%" for room, n in rooms.items() if n > 0.15 * total}
    assert not over


def test_no_module_is_over_800_lines() -> None:
    over = {str(p.relative_to(ROOT)): n for p, n in _lines().items() if n > 800}
    assert not over
