"""A store of the tests' own, to show what adding a store takes: this package, and one
entry point line (`notes = "tests.notes_store:DECLARATION"` in the group `cdc.stores`).
It keeps one JSON file per key, under its own setting `[stores.notes] folder` (by
default `<data_dir>/notes`), in a folder per pipeline."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr

from cdc.core.store_declarations import StoreDeclaration


class NotesSettings(BaseModel):
    """The notes store's own section, `[stores.notes]`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: Path | None = None  # default: <data_dir>/notes
    token: SecretStr | None = None  # a secret of its own (the settings must mask it)


DECLARATION = StoreDeclaration(
    name="notes",
    summary="JSON files, one per row (the tests' store)",
    make="tests.notes_store.store:make",
    slo_s=10.0,
    settings=NotesSettings,
)
