"""Store against source, and the warehouse history's rules.

Rows: the keys the store lacks, the keys only the store has, the keys whose values
differ (with both sides). History (Delta, SCD type 2), per table:
  - no two versions of a key at the same position (`_cdc_commit_lsn`, `_cdc_lsn`);
  - `valid_from <= valid_to`;
  - at most one open version (`valid_to IS NULL`) per key, and it is the newest;
  - each key's newest version equals its current row (values, position), and a key
    without a current row has a delete for its newest version,
    and every current row has versions.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.readers import Current, Rows, TableSpec, Version

__all__ = ["HistoryReport", "TableDiff", "balance", "check_history", "diff_rows"]

EXAMPLES = 5


@dataclass
class TableDiff:
    store: str
    table: str
    source_rows: int
    store_rows: int
    missing: int = 0
    extra: int = 0
    differing: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.missing + self.extra + self.differing

    def describe(self) -> str:
        head = (
            f"{self.store} {self.table}: {self.source_rows} rows in the source, "
            f"{self.store_rows} in the store; {self.missing} missing, {self.extra} only in "
            f"the store, {self.differing} differing"
        )
        return "\n".join([head, *(f"    {e}" for e in self.examples)])


def diff_rows(store: str, spec: TableSpec, source: Rows, stored: Rows) -> TableDiff:
    result = TableDiff(store, spec.qualified, len(source), len(stored))
    columns = spec.names
    for key in sorted(source.keys() | stored.keys()):
        have, want = stored.get(key), source.get(key)
        if have == want:
            continue
        if have is None:
            result.missing += 1
        elif want is None:
            result.extra += 1
        else:
            result.differing += 1
        if len(result.examples) < EXAMPLES:
            result.examples.append(
                {
                    "key": {spec.key: key},
                    "source": None if want is None else dict(zip(columns, want, strict=True)),
                    "store": None if have is None else dict(zip(columns, have, strict=True)),
                }
            )
    return result


def balance(rows: Rows) -> int:
    """The sum of the accounts' balances (their first column)."""
    return sum(int(r[0]) for r in rows.values())


@dataclass
class HistoryReport:
    table: str
    position: list[str]  # the columns that identify a version's place in the source
    versions: int = 0
    keys: int = 0
    duplicates: int = 0  # (key, position) held by more than one version
    inverted: int = 0  # valid_from > valid_to
    open_many: int = 0  # keys with more than one open version
    newest_closed: int = 0  # keys whose newest version has a valid_to
    newest_differs: int = 0  # keys whose newest version is not their current row
    no_history: int = 0  # current rows without any version
    no_current: int = 0  # keys with versions but no current row
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def problems(self) -> int:
        return (
            self.duplicates
            + self.inverted
            + self.open_many
            + self.newest_closed
            + self.newest_differs
            + self.no_history
            + self.no_current
        )

    def describe(self) -> str:
        head = (
            f"warehouse history {self.table}: {self.versions} versions of {self.keys} keys; "
            f"duplicates {self.duplicates}, valid_from > valid_to {self.inverted}, "
            f"keys with several open versions {self.open_many}, newest version closed "
            f"{self.newest_closed}, "
            f"newest version != current row {self.newest_differs}, "
            f"current rows without history {self.no_history}, history without current row "
            f"{self.no_current}"
        )
        lines = [head]
        for kind, rows in self.examples.items():
            lines += [f"    {kind}: {r}" for r in rows]
        return "\n".join(lines)


def _version(v: Version) -> dict[str, Any]:
    return {
        "key": v.key,
        "op": v.op,
        "position": v.position,
        "valid_from": str(v.valid_from),
        "valid_to": None if v.valid_to is None else str(v.valid_to),
        "values": v.values,
    }


def _place(v: Version) -> tuple[int, ...]:
    return tuple(-1 if p is None else int(p) for p in v.position)


def check_history(
    table: str, position: list[str], versions: list[Version], current: dict[int, Current]
) -> HistoryReport:
    report = HistoryReport(table, position, versions=len(versions))

    def example(kind: str, value: dict[str, Any]) -> None:
        shown = report.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(value)

    by_key: dict[int, list[Version]] = defaultdict(list)
    for version in versions:
        by_key[version.key].append(version)
    report.keys = len(by_key)
    for key, held in by_key.items():
        for place, n in Counter(v.position for v in held).items():
            if n > 1:
                report.duplicates += n - 1
                example("duplicates", {"key": key, "position": place, "versions": n})
        for v in held:
            if v.valid_to is not None and v.valid_from > v.valid_to:
                report.inverted += 1
                example("valid_from > valid_to", _version(v))
        open_versions = [v for v in held if v.valid_to is None]
        if len(open_versions) > 1:
            report.open_many += 1
            example("several open versions", {"key": key, "open": len(open_versions)})
        newest = max(held, key=_place)
        row = current.get(key)
        if row is None:  # a deleted key: its newest version is the delete; a key a
            # TRUNCATE (or `cdc setup`'s cut of a swapped table) took out: it ends there
            if newest.op != "d" and newest.valid_to is None:
                report.no_current += 1
                example("history without current row", _version(newest))
            continue
        if newest.valid_to is not None:
            report.newest_closed += 1
            example("newest version closed", _version(newest))
        differs = newest.op == "d" or row.values != newest.values or row.position != newest.position
        if differs:
            report.newest_differs += 1
            example(
                "newest version != current row",
                {"newest": _version(newest), "current": row.__dict__},
            )
    for key in current.keys() - by_key.keys():
        report.no_history += 1
        example("current row without history", {"key": key, **current[key].__dict__})
    return report
