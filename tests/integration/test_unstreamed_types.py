"""A column of a type Debezium does not stream is captured nowhere (cdc.core.streamed_types).

Debezium leaves such a column out of its events (box, tsquery, name, multiranges,
arrays of xml...), or carries it in another shape than PostgreSQL's (point as a struct,
int2vector always empty). The snapshot, which PostgreSQL formats itself, wrote those
values into every store, where the stream never changed them: a row updated after the
snapshot kept its old box in the cache, and a row inserted after it had none. Now no
store holds such a column, on rows from the snapshot or from the stream, the rest of
each row is exact, `cdc verify` finds no drift, and `cdc snapshot` says which columns
are left out. The stores are read with the test's own readers (tests/stores.py)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.check.verify import verify
from cdc.core.catalog import unstreamed_note
from tests import stores
from tests.conftest import Capture
from tests.logcheck import table_info, wait_until_captured

pytestmark = [pytest.mark.integration]

STORES = ["cache", "search", "warehouse"]
CAPTURED = ["id", "label", "n", "tags"]
LEFT_OUT = {
    "p": "point",
    "b": "box",
    "q": "tsquery",
    "nm": "name",
    "mr": "int4multirange",
    "docs": "xml[]",
    "b_text": "generated from b",
}


def _held(row: dict[str, Any]) -> dict[str, Any]:
    """A store's row in the source's values (the cache holds texts, JSON for arrays)."""
    tags = row.get("tags")
    return {
        "id": int(row["id"]),
        "label": row.get("label"),
        "n": None if row.get("n") is None else int(row["n"]),
        "tags": json.loads(tags) if isinstance(tags, str) else tags and list(tags),
    }


def _source(conn: psycopg.Connection[Any], name: str) -> dict[int, dict[str, Any]]:
    rows = conn.execute(f"SELECT id, label, n, tags FROM {name}").fetchall()
    return {r[0]: dict(zip(CAPTURED, r, strict=True)) for r in rows}


def test_a_column_debezium_does_not_stream_is_in_no_store(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, label text, n int, tags text[], "
        "p point, b box, q tsquery, nm name, mr int4multirange, docs xml[], "
        "b_text text GENERATED ALWAYS AS (b::text) STORED)",
        "INSERT INTO {name} SELECT g, 'l' || g, g, ARRAY['t' || g], point(g, g), "
        "box(point(0, 0), point(g, g)), 'fat & rat'::tsquery, 'n' || g, "
        "int4multirange(int4range(1, g + 2)), ARRAY['<a/>'::xml] FROM generate_series(1, 5) g",
        prefix="unstreamed",
    )
    name, settings = t.name, t.settings
    info = table_info(settings, t.table)
    assert dict(info.unstreamed) == LEFT_OUT
    assert [c.name for c in info.columns] == CAPTURED
    note = unstreamed_note(info)
    assert note is not None and all(f"{c} ({why})" in note for c, why in LEFT_OUT.items())
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {name} VALUES (6, 'new', 6, '{{x}}', point(9, 9), box(point(1, 1), "
            "point(2, 2)), 'cat'::tsquery, 'six', '{[1,2)}', ARRAY['<b/>'::xml])"
        )
        conn.execute(f"UPDATE {name} SET b = box(point(5, 5), point(7, 7)), n = 10 WHERE id = 1")
        conn.execute(f"UPDATE {name} SET p = point(3, 4) WHERE id = 2")  # nothing captured
        conn.execute(f"DELETE FROM {name} WHERE id = 3")
    wait_until_captured(settings)
    run_apply(settings, STORES, once=True)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        wanted = _source(conn, name)
    found = stores.stores(settings, t.table)
    for store in STORES:
        held = found[store]
        assert sorted(int(k) for k in held) == sorted(wanted), (store, sorted(held))
        for key, row in held.items():
            kept = set(row) & set(LEFT_OUT)
            assert not kept, (store, key, {c: row[c] for c in kept})
            assert _held(row) == wanted[int(key)], (store, key, row)
    results = verify(settings, [info], STORES, timeout=60)
    assert [(d.store, d.ok, d.store_rows) for d in results] == [(s, True, 5) for s in STORES], [
        (d.store, d.missing[:3], d.extra[:3], d.different[:3]) for d in results
    ]
