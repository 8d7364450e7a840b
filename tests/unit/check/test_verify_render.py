"""`cdc verify`'s report printed without a terminal has no markup in it (issue 49)."""

from __future__ import annotations

import io

from rich.console import Console

from cdc.check.quality import Check
from cdc.check.reconcile import VerifyReport
from cdc.check.verify import Drift
from cdc.cli.output import Output, OutputForm
from cdc.cli.render import verify_tables


def _printed(report: VerifyReport, terminal: bool) -> str:
    screen = io.StringIO()
    out = Output(OutputForm.text, Console(file=screen, width=200, force_terminal=terminal))
    out.emit(report.as_dict(), *verify_tables(report))
    return screen.getvalue()


def test_the_summary_line_is_plain_text_in_a_pipe_and_styled_on_a_terminal() -> None:
    report = VerifyReport(
        [Drift("cache", "public.[t]", 2, 2)],
        [Check("public.[t]", "expect_table_row_count_to_equal", None, True, "2")],
    )
    plain = _printed(report, terminal=False)
    summary = [line for line in plain.splitlines() if line.startswith("Great Expectations:")]
    assert summary == [
        "Great Expectations: 1 of 1 expectations met; drift in 0 of 1 (store, table) pairs"
    ]
    assert "[green]" not in plain and "[/" not in plain
    assert "public.[t]" in plain  # a value's brackets are kept, not taken as markup
    styled = _printed(report, terminal=True)
    assert "\x1b[" in styled and "[green]" not in styled
