"""Another engine writing the warehouse's `current` tables while `cdc apply` runs, as
people do (docs/stores.md, "Other writers on the same tables"): in turn a DELETE of a row
it appended (as a GDPR erasure removes one), an UPDATE of one, an OPTIMIZE and a VACUUM
(default retention), by delta-rs. Its rows carry keys PostgreSQL never holds (negative),
and each is gone before the next turn: the tables end as the apply leaves them."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa

__all__ = ["KINDS", "OtherWriter", "committed", "foreign_rows"]

KINDS = ("delete", "update", "optimize", "vacuum")


def foreign_rows(path: str, key: str, ids: list[int]) -> Any:
    """Rows of the Delta table at `path` keyed `key` = each of `ids`, every other column NULL."""
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    return pa.Table.from_arrays(
        [pa.array(ids, f.type) if f.name == key else pa.nulls(len(ids), f.type) for f in schema],
        schema=schema,
    )


def committed(step: Any) -> None:
    """Run `step` (one commit of the other writer) until it wins its commit: it loses some
    to the apply, as the apply loses some to it."""
    from deltalake.exceptions import CommitFailedError

    for _ in range(100):
        try:
            step()
            return
        except CommitFailedError:
            time.sleep(random.uniform(0.05, 0.3))
    raise AssertionError("the other writer lost 100 commits in a row")


class OtherWriter(threading.Thread):
    """Writes each of `tables` (path, key column) in turn, one kind of write every
    `pause` seconds, until `stop()`; `done` counts the writes of each kind, `error` holds
    what ended it early."""

    def __init__(self, tables: list[tuple[str, str]], pause: float = 0.3) -> None:
        super().__init__(name="other-writer", daemon=True)
        self.tables = tables
        self.pause = pause
        self.done: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=120)

    def run(self) -> None:
        turn = 0
        try:
            while not self._halt.wait(self.pause):
                path, key = self.tables[turn % len(self.tables)]
                kind = KINDS[(turn // len(self.tables)) % len(KINDS)]
                turn += 1
                self.write(path, key, kind)
                self.done[kind] += 1
        except BaseException as exc:  # said by the test that reads `error`
            self.error = exc

    def write(self, path: str, key: str, kind: str) -> None:
        from deltalake import DeltaTable, write_deltalake

        foreign = -random.randint(1, 1_000_000)
        if kind in ("delete", "update"):
            row = foreign_rows(path, key, [foreign])
            committed(lambda: write_deltalake(path, row, mode="append"))
        if kind == "update":
            committed(
                lambda: DeltaTable(path).update(
                    predicate=f'"{key}" = {foreign}', updates={f'"{key}"': f'"{key}" - 1'}
                )
            )
            foreign -= 1
        if kind in ("delete", "update"):
            committed(lambda: DeltaTable(path).delete(f'"{key}" = {foreign}'))
        elif kind == "optimize":
            committed(lambda: DeltaTable(path).optimize.compact())
        else:
            # as people run it: the default retention (7 days). A shorter one removes
            # files that readers of older versions still read (docs/stores.md)
            committed(lambda: DeltaTable(path).vacuum(dry_run=False))
