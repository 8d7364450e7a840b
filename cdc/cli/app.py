"""`cdc`: run the Postgres change-data-capture stack.

Thin subcommands over the modules (cli/commands/, one module per family, on the app of
cli/base.py); every error is one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import inspect
import sys
from typing import NoReturn

import typer
from rich.text import Text

from cdc.cli.base import app, err
from cdc.cli.commands import apply, capture, check, stack
from cdc.core.errors import CdcError, unanswered

__all__ = ["app", "main"]

COMMANDS = (stack, capture, apply, check)  # each registered its commands on `app`
# the order `cdc --help` lists them in: the flow's
ORDER = [
    *(stack.up, stack.down, stack.status, stack.show_config, stack.demo),
    *(capture.setup, capture.snapshot, capture.backfill, apply.apply_),
    *(check.query, check.search, check.get, check.verify, capture.resync),
    *(apply.metrics, apply.rebuild, capture.drop),
]
app.registered_commands.sort(
    key=lambda c: ORDER.index(c.callback) if c.callback in ORDER else len(ORDER)
)


def _reflowed(text: str) -> str:
    """A docstring as help: each paragraph on one line, for the terminal to wrap at its
    width (the docstring's own line breaks would cut sentences in the middle of a line)."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _reflow_help(typer_app: typer.Typer) -> None:
    """Give every command of `typer_app` (and of its groups) its help reflowed, and its
    first paragraph as the line of the command list."""
    for command in typer_app.registered_commands:
        text = command.help or (command.callback.__doc__ if command.callback else None)
        if text:
            command.help = _reflowed(text)
            command.short_help = command.short_help or command.help.split("\n\n")[0]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


_reflow_help(app)


def _error(exc: CdcError) -> NoReturn:
    err.print(Text.assemble(("error:", "red"), " ", str(exc)), highlight=False, soft_wrap=True)
    sys.exit(exc.exit_code)


def main() -> None:
    try:
        app()
    except CdcError as exc:
        _error(exc)
    except Exception as exc:
        # a component that stopped answering where no step expected it: one line, too
        if (down := unanswered(exc)) is None:
            raise
        _error(down)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
