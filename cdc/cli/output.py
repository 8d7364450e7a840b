"""What a command prints on standard output, in the form chosen once per command by its
`--output`: text for people (rich tables), JSON or CSV for scripts. Progress and errors
go to standard error, whatever the form."""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from rich.console import Console, RenderableType
from rich.table import Column, Table
from rich.text import Text

__all__ = ["Output", "OutputForm", "RowsForm", "console", "shown"]

# C0 and C1 control characters but tab and newline: a value holding ESC could move the
# cursor, retitle the window or write the clipboard (OSC 52) of whoever reads it
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(value: str) -> str:
    """A value as a terminal may print it: each control character as its escape (\\x1b)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", value)


class OutputForm(StrEnum):
    text = "text"
    json = "json"


class RowsForm(StrEnum):
    """The forms of a command that answers with rows."""

    text = "text"
    json = "json"
    csv = "csv"


def console(stderr: bool = False) -> Console:
    """A console; wide when it writes to a file or pipe, where nothing wraps lines for us."""
    stream = sys.stderr if stderr else sys.stdout
    # no emoji codes: a value `:fire:` is printed as it is
    return Console(stderr=stderr, width=None if stream.isatty() else 160, emoji=False)


class Output:
    """A command's standard output in one form."""

    def __init__(
        self, form: OutputForm | RowsForm = OutputForm.text, out: Console | None = None
    ) -> None:
        self.form = form.value
        self.console = out or console()

    def emit(self, document: Any, *text: RenderableType) -> None:
        """`document` as JSON for scripts, or `text` for people."""
        if self.form == "text":
            for part in text:  # text as it is: a `[` in a name or a value is no markup
                shown_part = Text(shown(part)) if isinstance(part, str) else part
                self.console.print(shown_part, highlight=False)
        else:
            sys.stdout.write(json.dumps(document, default=str, ensure_ascii=False, indent=2) + "\n")

    def rows(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Rows: a table for people, a list of records in JSON, or CSV with a header."""
        if self.form == "csv":
            writer = csv.writer(sys.stdout)
            writer.writerow(columns)
            writer.writerows(["" if v is None else v for v in row] for row in rows)
            return
        headers = (Column(header=Text(shown(c))) for c in columns)  # names, not markup
        table = Table(*headers, caption=f"{len(rows)} rows")
        for row in rows:
            table.add_row(*(Text("NULL" if v is None else shown(str(v))) for v in row))
        self.emit([dict(zip(columns, row, strict=True)) for row in rows], table)
