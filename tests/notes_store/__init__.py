"""A store of the tests' own, to show what adding a store takes: this package, and one
entry point line (`notes = "tests.notes_store:DECLARATION"` in the group `cdc.stores`).
It keeps one JSON file per key under `<data_dir>/notes/<pipeline>`."""

from __future__ import annotations

from cdc.core.store_declarations import StoreDeclaration

DECLARATION = StoreDeclaration(
    name="notes",
    summary="JSON files, one per row (the tests' store)",
    make="tests.notes_store.store:make",
    slo_s=10.0,
)
