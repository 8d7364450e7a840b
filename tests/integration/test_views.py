"""Derived data in the warehouse: a join view and a windowed aggregate equal the same
queries run on PostgreSQL, after changes on either side of the join."""

from __future__ import annotations

import shutil
from datetime import UTC
from decimal import Decimal

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.check.status import pipeline_status
from cdc.check.view_checks import view_checks
from cdc.core.settings import Settings
from cdc.core.settings.views import HoppingWindow, TableJoin, TumblingWindow
from cdc.stores.warehouse.tables import view_path, warehouse_root
from tests.conftest import Capture
from tests.helpers import query_checkpoint
from tests.logcheck import table_info, wait_until_equal

pytestmark = pytest.mark.integration


def view_rows(settings: Settings, name: str) -> list[tuple]:  # type: ignore[type-arg]
    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    frame = spark.read.format("delta").load(view_path(warehouse_root(settings), name))
    return sorted(tuple(r) for r in frame.collect())


def test_join_view_and_window_aggregate_equal_postgres(captured: Capture) -> None:
    t = captured(
        "CREATE TABLE {name}_cust (id int PRIMARY KEY, name text NOT NULL, country char(2))",
        "CREATE TABLE {name}_ord (id int PRIMARY KEY, customer_id int REFERENCES "
        "{name}_cust (id) ON DELETE CASCADE, total numeric(12, 2) NOT NULL)",
        "INSERT INTO {name}_cust SELECT g, 'Customer ' || g, 'NL' FROM generate_series(1, 20) g",
        "INSERT INTO {name}_ord SELECT g, 1 + g % 20, g * 1.25 FROM generate_series(1, 50) g",
        prefix="view",
        tables=["public.{name}_cust", "public.{name}_ord"],
    )
    suffix = t.name
    customers, orders = f"{suffix}_cust", f"{suffix}_ord"
    settings = t.settings
    join = TableJoin(
        name=f"enriched_{suffix}",
        table=f"public.{orders}",
        references=f"public.{customers}",
        on="customer_id",
        columns=["name", "country"],
    )
    window = TumblingWindow(name=f"per_minute_{suffix}", table=f"public.{orders}", sum="total")
    # 3-minute windows starting every minute: each order is in three of them
    hopping = HoppingWindow(
        name=f"per_3_minutes_{suffix}",
        table=f"public.{orders}",
        sum="total",
        kind="hopping",
        window="3 minutes",
        slide="1 minute",
    )
    apply = settings.apply.model_copy(update={"joins": [join], "windows": [window, hopping]})
    settings = settings.model_copy(update={"apply": apply})
    dsn = t.dsn

    def expected_join() -> list[tuple]:  # type: ignore[type-arg]
        with psycopg.connect(dsn) as conn:
            return sorted(
                conn.execute(
                    f"SELECT o.id, o.customer_id, o.total, c.name, c.country FROM {orders} o "
                    f"LEFT JOIN {customers} c ON c.id = o.customer_id"
                ).fetchall()
            )

    def expected_windows() -> list[tuple]:  # type: ignore[type-arg]
        # orders created after the snapshot (id > 50), never updated: their xmin is the
        # inserting transaction, whose commit time is the event time
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT date_trunc('minute', pg_xact_commit_timestamp(xmin)) AS w, "
                f"count(*), sum(total) FROM {orders} WHERE id > 50 GROUP BY 1"
            ).fetchall()
        return sorted((w.astimezone(UTC).replace(tzinfo=None), n, total) for w, n, total in rows)

    def expected_hopping() -> list[tuple]:  # type: ignore[type-arg]
        # each order in the windows starting in its commit's minute and the two before
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT date_trunc('minute', pg_xact_commit_timestamp(xmin)) "
                "- g * interval '1 minute' AS w, count(*), sum(total) "
                f"FROM {orders}, generate_series(0, 2) g WHERE id > 50 GROUP BY 1"
            ).fetchall()
        return sorted((w.astimezone(UTC).replace(tzinfo=None), n, total) for w, n, total in rows)

    def hopping_now() -> list[tuple]:  # type: ignore[type-arg]
        return [
            (start, n, Decimal(total)) for start, _, n, total in view_rows(settings, hopping.name)
        ]

    def windows_now() -> list[tuple]:  # type: ignore[type-arg]
        return [
            (start, n, Decimal(total)) for start, _end, n, total in view_rows(settings, window.name)
        ]

    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(51, 111, 6):  # new orders, six per transaction
            conn.execute(
                f"INSERT INTO {orders} SELECT g, 1 + g % 10, g * 0.5 "
                f"FROM generate_series({first}, {first + 5}) g"
            )
        conn.execute(f"UPDATE {customers} SET name = 'Renamed ' || id WHERE id <= 5")
        conn.execute(f"UPDATE {orders} SET customer_id = 7 WHERE id BETWEEN 1 AND 4")
        conn.execute(f"DELETE FROM {orders} WHERE id BETWEEN 5 AND 8")
        # cascades to its orders (all from before the snapshot: not creations)
        conn.execute(f"DELETE FROM {customers} WHERE id = 20")
    for name in (customers, orders):
        wait_until_equal(settings, table_info(settings, f"public.{name}"))
    run_apply(settings, ["warehouse"], once=True)
    first_join = view_rows(settings, join.name)
    assert first_join == expected_join()
    assert any(row[3].startswith("Renamed") for row in first_join)
    assert windows_now() == expected_windows()
    assert sum(n for _, n, _ in windows_now()) == 60
    assert hopping_now() == expected_hopping()
    assert sum(n for _, n, _ in hopping_now()) == 3 * 60
    assert pipeline_status(settings).late_events == {window.name: 0, hopping.name: 0}

    # a change on the referenced side only: the joined rows follow
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {customers} SET country = 'FR' WHERE id BETWEEN 6 AND 9")
        conn.execute(f"INSERT INTO {orders} VALUES (200, 6, 99.99)")
    for name in (customers, orders):
        wait_until_equal(settings, table_info(settings, f"public.{name}"))
    run_apply(settings, ["warehouse"], once=True)
    assert view_rows(settings, join.name) == expected_join()
    assert windows_now() == expected_windows()
    assert sum(n for _, n, _ in windows_now()) == 61

    # `cdc verify` checks both (the join against PostgreSQL's, the windows against the
    # log): in sync now; a view row or a window changed behind the pipeline's back fails
    captured = [f"public.{customers}", f"public.{orders}"]
    tables = {name: table_info(settings, name) for name in captured}
    checks = {c.table: c for c in view_checks(settings, tables)}
    assert [(c.ok, c.observed) for c in checks.values()] == [
        (True, "0 missing, 0 extra, 0 different"),
        (True, f"0 of {len(expected_windows())} windows differ"),
        (True, f"0 of {len(expected_hopping())} windows differ"),
    ]
    from cdc.core.spark import spark_session

    spark = spark_session(settings, "test")
    root = warehouse_root(settings)
    spark.sql(f"UPDATE delta.`{view_path(root, join.name)}` SET customer_name = 'x' WHERE id = 200")
    spark.sql(f"UPDATE delta.`{view_path(root, window.name)}` SET rows = rows + 1")
    spark.sql(
        f"DELETE FROM delta.`{view_path(root, hopping.name)}` "
        f"WHERE window_start = TIMESTAMP '{expected_hopping()[0][0]}'"
    )
    checks = {c.table: c for c in view_checks(settings, tables)}
    assert not checks[f"view {hopping.name}"].ok
    assert checks[f"view {join.name}"].observed.startswith("0 missing, 0 extra, 1 different")
    assert not checks[f"view {join.name}"].ok
    assert not checks[f"view {window.name}"].ok

    # a window query starting afresh (a new pipeline, or its checkpoint lost) recomputes
    # the whole table from the log: no window it did not count is left behind, neither
    # the one changed above nor one from outside the log
    spark.sql(
        f"INSERT INTO delta.`{view_path(root, window.name)}` VALUES "
        "(TIMESTAMP '2000-01-01 00:00:00', TIMESTAMP '2000-01-01 00:01:00', 3, 7.50)"
    )
    # (the two windows share one query: both start afresh)
    assert query_checkpoint(settings, window.name) == query_checkpoint(settings, hopping.name)
    shutil.rmtree(query_checkpoint(settings, window.name))
    run_apply(settings, ["warehouse"], once=True)
    assert windows_now() == expected_windows()
    assert view_checks(settings, tables)[1].ok
