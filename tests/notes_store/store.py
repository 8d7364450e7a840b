"""The notes store: one JSON file per key, `{"key", "position", "deleted", "after"}`,
written when the change is newer than what the file holds (the write rule)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cdc.core.catalog import Table
from cdc.core.settings import Settings
from cdc.log.position import Event
from cdc.stores.base import Entry, Rows, RowStore, StoreReader, WriteResult
from cdc.types.decode import decode_value
from cdc.types.keys import store_key_text


class NotesStore(RowStore, StoreReader):
    name = "notes"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _table(self, table: str) -> Path:
        return self.folder / table

    def _file(self, table: str, key: str) -> Path:
        return self._table(table) / (hashlib.sha256(key.encode()).hexdigest() + ".json")

    def _notes(self, table: str) -> Iterable[dict[str, Any]]:
        folder = self._table(table)
        for path in sorted(folder.glob("*.json")) if folder.exists() else []:
            yield json.loads(path.read_text())

    def prepare(self, tables: Iterable[Table]) -> None:
        for table in tables:
            self._table(table.qualified).mkdir(parents=True, exist_ok=True)

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult()
        for event in events:
            if event.position is None:  # a tombstone: the delete before it was written
                continue
            path = self._file(event.table, event.key)
            held = json.loads(path.read_text()) if path.exists() else None
            if held is not None and tuple(held["position"]) >= event.position:
                result.stale += 1
                continue
            note = {
                "key": event.key,
                "position": list(event.position),
                "deleted": event.op == "d",
                "after": event.after,
            }
            partial = path.with_suffix(".part")
            partial.write_text(json.dumps(note))
            os.replace(partial, path)
            result.written += 1
        return result

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        for note in list(self._notes(table.qualified)):
            if tuple(note["position"]) < before:
                self._file(table.qualified, note["key"]).unlink(missing_ok=True)

    def reset(self, table: Table) -> None:
        shutil.rmtree(self._table(table.qualified), ignore_errors=True)

    def rows(self, table: Table) -> Rows:
        rows = {}
        for note in self._notes(table.qualified):
            if not note["deleted"]:
                values = {c.name: decode_value(c, note["after"].get(c.name)) for c in table.columns}
                rows[store_key_text(table, note["key"])] = self.form(table, values)
        return rows

    def form(self, table: Table, row: dict[str, Any]) -> dict[str, Any]:
        return {
            c.name: None if row.get(c.name) is None else str(row[c.name]) for c in table.columns
        }

    def remove(self, table: Table, keys: list[str]) -> None:
        gone = set(keys)
        for note in list(self._notes(table.qualified)):
            if store_key_text(table, note["key"]) in gone:
                self._file(table.qualified, note["key"]).unlink(missing_ok=True)

    def get(self, table: Table, key: str) -> Entry | None:
        path = self._file(table.qualified, key)
        if not path.exists():
            return None
        note = json.loads(path.read_text())
        return Entry(note, note["deleted"])


def make(settings: Settings, spark: Any = None) -> NotesStore:
    folder = settings.store_section("notes").folder or settings.data_dir / "notes"
    return NotesStore(folder / settings.pipeline.name)
