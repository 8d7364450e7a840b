"""`cdc --help` and every command's help wrap at the terminal's width: a docstring's own
line breaks never cut a sentence in the middle of a line."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from cdc.cli.app import app


def _commands(typer_app: typer.Typer, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [
        (*prefix, c.name or c.callback.__name__)
        for c in typer_app.registered_commands
        if c.callback is not None
    ]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None and group.name:
            found += _commands(group.typer_instance, (*prefix, group.name))
    return found


def test_every_help_paragraph_is_one_line_on_a_wide_terminal() -> None:
    runner = CliRunner()
    commands = _commands(app)
    assert len(commands) > 15
    for command in [(), *commands]:
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, (command, result.output)
        paragraphs = [
            line.strip()
            for line in result.output.split("╭")[0].splitlines()
            if line.strip() and not line.strip().startswith("Usage:")
        ]
        # on a 400-column terminal each paragraph of the help fits on its line: a line
        # that ends before the width ends its sentence
        for line in paragraphs:
            assert line.endswith((".", ":", ")", "`")) or len(line) > 380, (command, line)
    demo = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "400"}).output
    assert "with a join view and a per-minute window aggregate" in demo
