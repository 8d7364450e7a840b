"""`cdc verify` as one step: each store compared with the source at a consistent cut
(cdc/check/verify.py), what drifted mended and compared again when asked (a
`Mend`: `cdc verify --repair` gives cdc/check/repair.py's), then the Great
Expectations suites over the warehouse (cdc/check/quality.py) and each
derived view's check (cdc/check/view_checks.py). Verifying only reads; one
report, which the CLI and the demo both render."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from cdc.check.quality import Check, expectations
from cdc.check.verify import Drift, verify
from cdc.check.view_checks import view_checks
from cdc.core.catalog import Table
from cdc.core.say import Say, quiet
from cdc.core.settings import Settings
from cdc.core.store_declarations import with_ability

__all__ = ["Mend", "VerifyReport", "reconcile"]

# mends what drifted (the drifts of a verify), saying one line per thing it did
Mend = Callable[[list[Drift]], list[str]]


@dataclass
class VerifyReport:
    drifts: list[Drift]  # per (store, table)
    checks: list[Check] = field(default_factory=list)  # the expectations over the warehouse
    repairs: list[str] = field(default_factory=list)  # what --repair did, one line each
    # table -> keys whose change the capture held back (kafka.oversized = "dead_letter"),
    # not replayed yet: `cdc dlq replay` once kafka.max_message_bytes is raised
    held_back: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.drifts) and all(c.ok for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "results": [asdict(d) for d in self.drifts],
            "expectations": [asdict(c) for c in self.checks],
            "repairs": self.repairs,
            "held_back": self.held_back,
        }


def reconcile(
    settings: Settings,
    tables: list[Table],
    stores: list[str],
    timeout: float = 120.0,
    mend: Mend | None = None,
    say: Say = quiet,
    quality: bool = True,
) -> VerifyReport:
    """Verify `stores` against the source for `tables`; with `mend`, mend what drifted
    and verify again; then, with `quality`, run the warehouse's expectations and its
    views' checks (if it is one of `stores`).

    With `mend`, the first comparison is not repeated for what it found (verify's
    rounds): a key it names only because it changed while it was read is mended too,
    which does no harm (the repair takes its row from the source as it is then, and
    removes a key only the source still lacks), and each round would read every row of
    the stores again. The comparison after the repair looks only at the keys the first
    named (a repair changes no other key), key by key where they are few
    (cdc/check/keyed.py), with its rounds."""
    say(f"verifying {len(tables)} tables in {', '.join(stores)} at a consistent cut")
    rounds = 1 if mend is not None else 3
    report = VerifyReport(verify(settings, tables, stores, timeout, rounds=rounds, say=say))
    if mend is not None and not all(d.ok for d in report.drifts):
        report.repairs = mend(report.drifts)
        for line in report.repairs:
            say(line)
        say("verifying the mended keys again once the stores have applied the repair")
        report.drifts = verify(settings, tables, stores, timeout, say=say, again=report.drifts)
    if quality and (expected := with_ability(stores, "expectations")):
        say("running the expectations over the warehouse")
        counts = {d.table: d.source_rows for d in report.drifts if d.store in expected}
        report.checks += expectations(settings, tables, counts, timeout=timeout)
        report.checks += view_checks(settings, {t.qualified: t for t in tables}, timeout)
    return report
