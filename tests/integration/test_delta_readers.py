"""The warehouse's Delta tables read the same with delta-rs (the `deltalake` package,
what Polars and DuckDB's delta extension build on) and, published as Iceberg tables
([stores.warehouse] iceberg), with PyIceberg as with Spark: every current-state, history and view
table of a pipeline with a table of many types, a stream-table join and a window
aggregate, before and after changes that rewrite, remove and add files and a column.
Only a table whose column names Parquet cannot hold uses Delta's column mapping (which
delta-rs 1.6 reads as NULLs, or refuses; Iceberg's readers read it): docs/stores.md,
"Reading the warehouse"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.check.status import pipeline_status
from cdc.core.settings.views import StreamTableJoin, TableJoin, TumblingWindow
from cdc.stores.warehouse.settings import with_warehouse
from cdc.stores.warehouse.tables import current_path, warehouse_root
from tests.conftest import Capture
from tests.logcheck import table_info, wait_until_equal
from tests.stores import column_mapped, delta_tables, iceberg_read, readers_differ

pytestmark = pytest.mark.integration

COLUMNS = (
    "id int PRIMARY KEY, customer_id int, note text, price numeric(10,2), qty int2, "
    "ratio double precision, flag boolean, day date, at timestamptz, local_at timestamp, "
    "tags text[], doc jsonb, blob bytea, during interval, uid uuid"
)
ROWS = (
    "SELECT g, g % 3, 'note ' || g, g * 1.25, g, g / 7.0, g % 2 = 0, "
    "date '2024-01-01' + g, timestamptz '2024-01-01 10:00+02' + g * interval '1 hour', "
    "timestamp '2024-01-01 10:00' + g * interval '1 minute', ARRAY['a' || g, 'b'], "
    "jsonb_build_object('n', g), decode(md5(g::text), 'hex'), g * interval '1 second', "
    "md5(g::text)::uuid FROM generate_series(1, 40) g"
)


@pytest.mark.long
def test_every_warehouse_table_reads_the_same_with_delta_rs_pyiceberg_and_spark(
    captured: Capture,
) -> None:
    t = captured(
        f"CREATE TABLE {{name}}_orders ({COLUMNS})",
        "CREATE TABLE {name}_customers (id int PRIMARY KEY, name text)",
        'CREATE TABLE {name}_odd (id int PRIMARY KEY, "first name" text)',
        f"INSERT INTO {{name}}_orders {ROWS}",
        "INSERT INTO {name}_customers SELECT g, 'c' || g FROM generate_series(0, 2) g",
        "INSERT INTO {name}_odd VALUES (1, 'x')",
        prefix="readers",
        tables=["public.{name}_orders", "public.{name}_customers", "public.{name}_odd"],
    )
    orders, customers = f"public.{t.name}_orders", f"public.{t.name}_customers"
    views = {
        "joins": [
            StreamTableJoin(
                name=f"priced_{t.name}",
                kind="stream_table",
                table=orders,
                references=customers,
                on="customer_id",
                columns=["name"],
            ),
            TableJoin(
                name=f"named_{t.name}",
                table=orders,
                references=customers,
                on="customer_id",
                columns=["name"],
            ),
        ],
        "windows": [TumblingWindow(name=f"per_minute_{t.name}", table=orders, sum="price")],
    }
    settings = t.settings.model_copy(update={"apply": t.settings.apply.model_copy(update=views)})
    settings = with_warehouse(settings, iceberg=True)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {orders} SELECT g + 100, 1, 'new' FROM generate_series(1, 5) g")
        conn.execute(f"UPDATE {orders} SET note = 'changed', price = price + 1 WHERE id <= 10")
        conn.execute(f"DELETE FROM {orders} WHERE id BETWEEN 11 AND 15")
        conn.execute(f"UPDATE {customers} SET name = 'renamed' WHERE id = 1")
    for name in (orders, customers):
        wait_until_equal(settings, table_info(settings, name))
    run_apply(settings, ["warehouse"], once=True)

    from cdc.core.spark import spark_session

    spark: Any = spark_session(settings, "test-readers")
    root = warehouse_root(settings)
    base = str(Path(root).parent)  # the warehouse's folder: root is <base>/<prefix>
    tables = delta_tables(root)

    def iceberg_differs() -> list[str]:
        return [d for p in tables for d in readers_differ(spark, p, iceberg_read(base, p))]

    odd = current_path(root, f"public.{t.name}_odd")
    assert len(tables) >= 3 * 2 + 3  # three tables' current state and history, the views
    differences = [
        d for path in tables if not column_mapped(path) for d in readers_differ(spark, path)
    ]
    assert not differences, "\n".join(differences)
    mapped = [str(path) for path in tables if column_mapped(path)]
    assert [p for p in mapped if t.name in p] and all("_odd" in p for p in mapped), mapped
    assert str(odd) in mapped
    # what the reader table of docs/stores.md says of delta-rs 1.6 and column mapping (and what
    # every table read before this version): the comparison sees it
    assert readers_differ(spark, Path(odd)), "delta-rs now reads column mapping: docs/stores.md"
    assert not iceberg_differs()
    # a table delta-rs cannot write is written by Spark, and `cdc status` names it, and why
    slow = pipeline_status(settings).stores["warehouse"]["written_by_spark"]
    assert slow and all("_odd" in path for path in slow), slow
    assert "column-mapped" in slow[str(odd)], slow

    # files rewritten (an UPDATE's MERGE), every file of a table removed, a column added:
    # the next Iceberg snapshots follow, read by a publisher that starts afresh
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {customers} ADD COLUMN city text")
        # widened types: the tables are written anew, never with a reader feature (Delta's
        # typeWidening, which delta-rs 1.6.6 refuses to read)
        conn.execute(
            f"ALTER TABLE {orders} ALTER COLUMN qty TYPE int, ALTER COLUMN price TYPE numeric(12,2)"
        )
        # (every row: the log's older events hold no city, which the log check minds)
        conn.execute(f"UPDATE {customers} SET city = CASE WHEN id = 2 THEN 'Lyon' END")
        conn.execute(f"UPDATE {orders} SET qty = 0, tags = NULL WHERE id % 4 = 0")
        conn.execute(f"DELETE FROM public.{t.name}_odd")
    for name in (orders, customers, f"public.{t.name}_odd"):
        wait_until_equal(settings, table_info(settings, name))
    run_apply(settings, ["warehouse"], once=True)
    assert not iceberg_differs()
    widened = [
        p
        for p in tables
        if "typeWidening" in "".join(log.read_text() for log in (p / "_delta_log").glob("*.json"))
    ]
    assert not widened, widened
    differences = [
        d for path in tables if not column_mapped(path) for d in readers_differ(spark, path)
    ]
    assert not differences, "\n".join(differences)
    qty = spark.read.format("delta").load(current_path(root, orders)).schema["qty"].dataType
    assert qty.typeName() == "integer"
    city = iceberg_read(base, Path(current_path(root, customers)))
    assert "Lyon" in city.column("city").to_pylist()
    assert iceberg_read(base, Path(odd)).num_rows == 0  # live rows only: the deleted row is gone
