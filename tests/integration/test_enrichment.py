"""A stream-table join (`apply.joins` of kind stream_table): each insert into the stream
table enriched with the referenced row as it was when the insert committed. The expected
enrichment is what the test itself set before each insert; the view is read with the
test's own Delta reader."""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.check.view_checks import view_checks
from cdc.core.catalog import Column, Table
from cdc.core.settings.views import StreamTableJoin
from cdc.log.checkpoints import checkpoint
from cdc.stores.warehouse.store import WarehouseStore
from cdc.stores.warehouse.tables import view_path, warehouse_root
from cdc.stores.warehouse.views import enrichment
from cdc.stores.warehouse.views.enrichment import EnrichmentView
from tests.conftest import Capture, RunningStack
from tests.helpers import EVENTS
from tests.logcheck import table_info, wait_until_equal
from tests.stores import engines

pytestmark = pytest.mark.integration


def enriched(spark: Any, root: str, name: str) -> list[tuple[Any, ...]]:
    """(item id, product id, qty, product name, price) per event, in the view."""
    frame = spark.read.format("delta").load(view_path(root, name))
    return sorted(
        (r["id"], r["product_id"], r["qty"], r["product_name"], r["product_price"])
        for r in frame.collect()
    )


def test_each_insert_is_enriched_with_the_referenced_row_as_of_its_commit(
    captured: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = captured(
        "CREATE TABLE {name}_prod (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2))",
        # the last four named like what the view's own work once used (review M9)
        "CREATE TABLE {name}_item (id int PRIMARY KEY, product_id int, qty int NOT NULL, "
        "lsn bigint, commit_lsn text, commit_ms int, ref int)",
        "INSERT INTO {name}_prod SELECT g, 'P' || g, g * 10 FROM generate_series(1, 5) g",
        "INSERT INTO {name}_item VALUES (1, 1, 1), (2, 2, 1)",  # before the snapshot
        prefix="enrich",
        tables=["public.{name}_prod", "public.{name}_item"],
    )
    products, items = f"{t.name}_prod", f"{t.name}_item"
    join = StreamTableJoin(
        name=f"items_priced_{t.name}",
        kind="stream_table",
        table=f"public.{items}",
        references=f"public.{products}",
        on="product_id",
        columns=["name", "price"],
    )
    settings = t.settings.model_copy(
        update={"apply": t.settings.apply.model_copy(update={"joins": [join]})}
    )
    expected: list[tuple[Any, ...]] = []

    def insert(conn: Any, item: int, product: int, qty: int, known: Any) -> None:
        conn.execute(f"INSERT INTO {items} VALUES (%s, %s, %s)", (item, product, qty))
        expected.append((item, product, qty, *known))

    with psycopg.connect(t.dsn, autocommit=True) as conn:
        insert(conn, 101, 1, 1, ("P1", Decimal("10.00")))
        insert(conn, 102, 2, 2, ("P2", Decimal("20.00")))
        conn.execute(f"UPDATE {products} SET price = 11 WHERE id = 1")
        insert(conn, 103, 1, 3, ("P1", Decimal("11.00")))
        with conn.transaction():  # the change before the insert, in one transaction
            conn.execute(f"UPDATE {products} SET price = 21, name = 'P2b' WHERE id = 2")
            insert(conn, 104, 2, 4, ("P2b", Decimal("21.00")))
        with conn.transaction():  # the insert before the change, in one transaction
            insert(conn, 105, 3, 5, ("P3", Decimal("30.00")))
            conn.execute(f"UPDATE {products} SET price = 31 WHERE id = 3")
        conn.execute(f"DELETE FROM {products} WHERE id = 4")
        insert(conn, 106, 4, 6, (None, None))  # its product deleted before it
        insert(conn, 107, 99, 7, (None, None))  # no such product
    for name in (products, items):
        wait_until_equal(settings, table_info(settings, f"public.{name}"))
    run_apply(settings, ["warehouse"], once=True)

    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    root = warehouse_root(settings)
    assert enriched(spark, root, join.name) == sorted(expected)

    # later changes of the products, and of the items, rewrite no event: an event is the
    # insert as it committed, enriched as of then
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {products} SET price = price + 100")
        conn.execute(f"UPDATE {items} SET qty = 0 WHERE id = 101")
        conn.execute(f"DELETE FROM {items} WHERE id = 102")
        conn.execute(f"INSERT INTO {products} VALUES (4, 'P4 again', 44)")
        insert(conn, 108, 1, 8, ("P1", Decimal("111.00")))
        insert(conn, 109, 4, 9, ("P4 again", Decimal("44.00")))
    for name in (products, items):
        wait_until_equal(settings, table_info(settings, f"public.{name}"))
    # a batch of the steady state, shaped on the driver, is enriched in Arrow (the first
    # made the view: Spark), and appended by delta-rs
    by_spark: list[Any] = []
    spark_path = enrichment.refresh_enrichment
    monkeypatch.setattr(
        enrichment, "refresh_enrichment", lambda *a, **k: by_spark.append(a) or spark_path(*a, **k)
    )
    run_apply(settings, ["warehouse"], once=True)
    monkeypatch.undo()
    assert enriched(spark, root, join.name) == sorted(expected)
    assert not by_spark and engines(view_path(root, join.name))[-1] == "delta-rs"

    # `cdc verify` enriches the events again from the log: equal now; an event's price
    # changed behind the pipeline's back, or an event removed, is found
    tables = {f"public.{n}": table_info(settings, f"public.{n}") for n in (products, items)}
    (check,) = view_checks(settings, tables)
    assert (check.ok, check.observed) == (True, "9 events: 0 missing, 0 extra, 0 different")
    path = view_path(root, join.name)
    spark.sql(f"UPDATE delta.`{path}` SET product_price = 1 WHERE id = 103")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 104")
    (check,) = view_checks(settings, tables)
    assert not check.ok
    assert check.observed.startswith("9 events: 1 missing, 0 extra, 1 different")

    # replayed from offset 0 over itself: the event removed is there again, and the
    # price changed is as of the insert again: every event is there once, as it was
    shutil.rmtree(Path(checkpoint(settings, "warehouse").path))
    run_apply(settings, ["warehouse"], once=True)
    assert enriched(spark, root, join.name) == sorted(expected)

    # and from the log alone, into an empty warehouse
    shutil.rmtree(Path(checkpoint(settings, "warehouse").path))
    shutil.rmtree(root)
    run_apply(settings, ["warehouse"], once=True)
    assert enriched(spark, root, join.name) == sorted(expected)


PRODUCT = Table(
    "public",
    "prod",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("price", "integer", "int4", "N", False, None, False),
    ),
    ("id",),
    "d",
    1,
    1,
)
ITEM = Table(
    "public",
    "item",
    (
        Column("id", "integer", "int4", "N", False, None, True),
        Column("product_id", "integer", "int4", "N", False, None, False),
    ),
    ("id",),
    "d",
    1,
    1,
)


def change(table: str, after: dict[str, int], op: str, at: tuple[int, int]) -> dict[str, Any]:
    return {
        "table": f"public.{table}",
        "topic": f"p.public.{table}",
        "partition": 0,
        "offset": at[0],
        "key": json.dumps({"id": after["id"]}),
        "op": op,
        "after": None if op == "d" else json.dumps(after),
        "commit_ms": at[0] * 10,
        "commit_lsn": at[0],
        "lsn": at[1],
        "error": None,
        "value": "{}",
        "cut_ms": None,
    }


@pytest.mark.long
def test_a_referenced_change_read_after_the_events_it_precedes_enriches_them_again(
    stack: RunningStack, tmp_path: Path
) -> None:
    """The products' topic read behind the items' (another topic, another partition): a
    price change committed before an insert reaches the warehouse a batch after it. The
    event is enriched again with it; a change committed after the insert leaves it."""
    from cdc.core.spark import spark_session

    spark = spark_session(stack.settings, "test-enrichment")
    root = str(tmp_path / "warehouse")
    join = StreamTableJoin(
        name="priced",
        kind="stream_table",
        table="public.item",
        references="public.prod",
        on="product_id",
        columns=["price"],
    )
    store = WarehouseStore(spark, root, [EnrichmentView(join)])
    tables = {"public.prod": PRODUCT, "public.item": ITEM}
    store.prepare(tables.values())

    def write(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        frame = spark.createDataFrame(rows, EVENTS)
        store.write_frame(tables, frame, {r["table"] for r in rows})
        view = spark.read.format("delta").load(view_path(root, "priced"))
        return sorted((r["id"], r["product_price"]) for r in view.collect())

    assert write(
        [
            change("prod", {"id": 1, "price": 10}, "r", (100, 0)),
            change("item", {"id": 7, "product_id": 1}, "c", (300, 1)),
            change("item", {"id": 8, "product_id": 1}, "c", (150, 1)),
        ]
    ) == [(7, 10), (8, 10)]
    # committed at 200, between the two inserts, read a batch later
    assert write([change("prod", {"id": 1, "price": 15}, "u", (200, 1))]) == [(7, 15), (8, 10)]
    # committed after both, and the first batch delivered again: nothing changes
    assert write(
        [
            change("prod", {"id": 1, "price": 20}, "u", (400, 1)),
            change("item", {"id": 7, "product_id": 1}, "c", (300, 1)),
        ]
    ) == [(7, 15), (8, 10)]
    # the product deleted before a later insert: no price for it
    assert write(
        [
            change("prod", {"id": 1}, "d", (500, 1)),
            change("item", {"id": 9, "product_id": 1}, "c", (600, 1)),
        ]
    ) == [(7, 15), (8, 10), (9, None)]
    # a TRUNCATE of the products, read after an insert it came before (cdc.truncations
    # read behind the items' topic): the insert's product had ended when it committed
    assert write(
        [
            change("prod", {"id": 2, "price": 5}, "c", (650, 1)),
            change("item", {"id": 10, "product_id": 2}, "c", (700, 1)),
        ]
    ) == [(7, 15), (8, 10), (9, None), (10, 5)]
    store.truncate(PRODUCT, (680, 1), 6_800)
    assert write([change("prod", {"id": 3, "price": 1}, "c", (800, 1))]) == [
        (7, 15),
        (8, 10),
        (9, None),
        (10, None),
    ]
