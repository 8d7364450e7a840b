"""How a long step tells the person running it what it does: a `Say`, called with one
line at a time (the CLI prints it; a test or a benchmark may keep it). The one name for
that callback everywhere; `Progress` is a store's record of what it applied
(cdc/log/progress.py), and a progress bar is rich's."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Say", "on_stderr", "quiet"]

Say = Callable[[str], None]


def quiet(line: str) -> None:
    """Say nothing."""


def on_stderr(who: str) -> Say:
    """A Say that prints each line to standard error as `<who>: <line>` (a process whose
    output a person or a parent process reads line by line)."""
    import sys

    def say(line: str) -> None:
        print(f"{who}: {line}", file=sys.stderr, flush=True)

    return say
