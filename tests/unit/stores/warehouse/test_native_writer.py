"""The warehouse's delta-rs writer (native.py) on tables of its own, without Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc.core.catalog import Column, Table
from cdc.stores.warehouse.native import NativeWriter, datafusion_quoted, key_match, null_safe_match
from cdc.stores.warehouse.write import _arrow_batch as arrow_batch
from cdc.stores.warehouse.write._merge import current_clauses

# the demo's order_items: a key of two columns
ITEMS = Table(
    "public",
    "order_items",
    tuple(
        Column(name, kind, kind, "N", False, None, False)
        for name, kind in (("order_id", "int8"), ("line", "int2"), ("unit_price", "numeric"))
    ),
    ("order_id", "line"),
    "d",
    0,
    0,
)
TS = pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * 2, pa.timestamp("us", "UTC"))


def current(path: Path) -> None:
    write_deltalake(
        str(path),
        pa.table(
            {
                "order_id": pa.array([1, 1], pa.int64()),
                "line": pa.array([1, 2], pa.int16()),
                "unit_price": pa.array([Decimal("1.00")] * 2, pa.decimal128(10, 2)),
                "_cdc_offset": pa.array([1, 2], pa.int64()),
                "_cdc_partition": pa.array([0, 0], pa.int32()),
                "_cdc_lsn": pa.array([1, 2], pa.int64()),
                "_cdc_commit_ts": TS,
                "_cdc_commit_lsn": pa.array([10, 10], pa.int64()),
            }
        ),
    )


def test_a_merge_on_a_key_of_two_columns_is_written_by_delta_rs(tmp_path: Path) -> None:
    """DataFusion's parser read `a IS NOT DISTINCT FROM b AND c ...` as `a IS NOT
    DISTINCT FROM (b AND c) ...`: every table of a composite key was refused
    ("type_coercion") and written by Spark's MERGE, seconds a batch."""
    current(tmp_path)
    source = pa.table(
        {
            "_cdc_k_order_id": pa.array([1, 1], pa.int64()),
            "_cdc_k_line": pa.array([2, 3], pa.int16()),
            "unit_price": pa.array([Decimal("2.50"), Decimal("3.00")], pa.decimal128(10, 2)),
            "_cdc_commit_lsn": pa.array([20, 20], pa.int64()),
            "_cdc_lsn": pa.array([1, 2], pa.int64()),
            "_cdc_offset": pa.array([3, 4], pa.int64()),
            "_cdc_partition": pa.array([0, 0], pa.int32()),
            "_cdc_op": pa.array(["u", "c"]),
            "_cdc_commit_ts": TS,
        }
    )
    writer = NativeWriter()
    on = null_safe_match([(k, f"_cdc_k_{k}") for k in ITEMS.key])
    assert writer.merge(str(tmp_path), source, on, current_clauses(ITEMS, set(), datafusion_quoted))
    assert writer.refused == {}
    rows = DeltaTable(str(tmp_path)).to_pyarrow_table().sort_by([("line", "ascending")])
    assert rows.column("line").to_pylist() == [1, 2, 3]
    assert rows.column("unit_price").to_pylist() == [
        Decimal("1.00"),
        Decimal("2.50"),
        Decimal("3.00"),
    ]


def test_keys_are_looked_up_in_the_table_and_a_missing_column_appended_as_null(
    tmp_path: Path,
) -> None:
    current(tmp_path)
    writer = NativeWriter()
    assert writer.holds(str(tmp_path), ["order_id", "line"], {(1, 2)})
    assert not writer.holds(str(tmp_path), ["order_id", "line"], {(1, 3), (2, 1)})
    # a row without unit_price (a column PostgreSQL dropped): NULL
    row = pa.table(
        {
            "order_id": pa.array([2], pa.int64()),
            "line": pa.array([1], pa.int16()),
            "_cdc_offset": pa.array([5], pa.int64()),
            "_cdc_partition": pa.array([0], pa.int32()),
            "_cdc_lsn": pa.array([1], pa.int64()),
            "_cdc_commit_ts": TS.slice(0, 1),
            "_cdc_commit_lsn": pa.array([30], pa.int64()),
        }
    )
    assert writer.append(str(tmp_path), row)
    table = DeltaTable(str(tmp_path)).to_pyarrow_table()
    assert table.num_rows == 3
    assert table.filter(pa.compute.equal(table.column("order_id"), 2)).column(
        "unit_price"
    ).to_pylist() == [None]
    assert writer.holds(
        str(tmp_path),
        ["order_id", "line"],
        arrow_batch.keys(
            ITEMS, pa.table({"_cdc_k_order_id": [2], "_cdc_k_line": pa.array([1], pa.int16())})
        ),
    )


def test_a_join_view_refreshed_in_arrow_follows_both_sides(tmp_path: Path) -> None:
    """refresh_join_arrow: the rows of the keys touched on either side, joined again
    from the current states as delta-rs reads them; a row gone from the left leaves."""
    from cdc.core.settings.views import TableJoin
    from cdc.stores.warehouse.tables import current_path, view_path
    from cdc.stores.warehouse.views.table_join import refresh_join_arrow

    def column(name: str) -> Column:
        return Column(name, "int8", "int8", "N", False, None, False)

    orders = Table("public", "orders", (column("id"), column("customer_id")), ("id",), "d", 0, 0)
    customers = Table("public", "customers", (column("id"), column("tier")), ("id",), "d", 0, 0)
    tables = {"public.orders": orders, "public.customers": customers}
    join = TableJoin(
        name="orders_tiers",
        table="public.orders",
        references="public.customers",
        on="customer_id",
        columns=["tier"],
    )
    root = str(tmp_path)

    def write(path: str, rows: dict[str, list[int | None]], mode: str = "overwrite") -> None:
        write_deltalake(
            path, pa.table({k: pa.array(v, pa.int64()) for k, v in rows.items()}), mode=mode
        )

    write(current_path(root, "public.orders"), {"id": [1, 2, 3], "customer_id": [10, 10, 20]})
    write(current_path(root, "public.customers"), {"id": [10, 20], "tier": [1, 2]})
    write(
        view_path(root, join.name),
        {"id": [1, 2, 3], "customer_id": [10, 10, 20], "customer_tier": [1, 1, 2]},
    )
    # the batch: customer 10's tier changed, order 3 deleted, order 4 placed
    write(current_path(root, "public.customers"), {"id": [10, 20], "tier": [5, 2]})
    write(current_path(root, "public.orders"), {"id": [1, 2, 4], "customer_id": [10, 10, 30]})
    touched = {
        "public.orders": pa.table({"id": pa.array([3, 4], pa.int64())}),
        "public.customers": pa.table({"id": pa.array([10], pa.int64())}),
    }
    assert refresh_join_arrow(root, join, tables, touched, NativeWriter())
    view = DeltaTable(view_path(root, join.name)).to_pyarrow_table().sort_by("id").to_pylist()
    assert view == [
        {"id": 1, "customer_id": 10, "customer_tier": 5},
        {"id": 2, "customer_id": 10, "customer_tier": 5},
        {"id": 4, "customer_id": 30, "customer_tier": None},
    ]


def test_a_merge_that_loses_a_commit_conflict_is_written_again_not_counted(
    tmp_path: Path,
) -> None:
    """Another writer (a user's DELETE, `cdc verify --repair`) commits between the
    version the MERGE read and its commit: delta-rs refuses the commit. It was counted as
    written (the table's version had moved), and the batch's changes never reached the
    table; it is written again on the newest version."""
    current(tmp_path)
    path = str(tmp_path)
    writer = NativeWriter()
    read = DeltaTable(path)  # the version the MERGE reads
    writer._table = lambda p: read  # type: ignore[method-assign]
    DeltaTable(path).delete("line = 1")  # the other writer's commit, after the read
    source = pa.table(
        {
            "_cdc_k_order_id": pa.array([1], pa.int64()),
            "_cdc_k_line": pa.array([2], pa.int16()),
            "unit_price": pa.array([Decimal("9.99")], pa.decimal128(10, 2)),
            "_cdc_commit_lsn": pa.array([20], pa.int64()),
            "_cdc_lsn": pa.array([1], pa.int64()),
            "_cdc_offset": pa.array([3], pa.int64()),
            "_cdc_partition": pa.array([0], pa.int32()),
            "_cdc_op": pa.array(["u"]),
            "_cdc_commit_ts": TS.slice(0, 1),
        }
    )
    on = null_safe_match([(k, f"_cdc_k_{k}") for k in ITEMS.key])
    assert writer.merge(path, source, on, current_clauses(ITEMS, set(), datafusion_quoted))
    assert writer.refused == {}
    rows = DeltaTable(path).to_pyarrow_table()
    assert rows.column("line").to_pylist() == [2]  # the other writer's delete stays
    assert rows.column("unit_price").to_pylist() == [Decimal("9.99")]  # the batch is in


def test_a_failed_write_with_no_other_writer_is_handed_to_spark(tmp_path: Path) -> None:
    """A write delta-rs cannot make, with nothing else committed meanwhile: not
    written (False), and Spark writes the table from then on."""
    current(tmp_path)
    path = str(tmp_path)
    writer = NativeWriter()
    wrong = pa.table({"_cdc_k_order_id": pa.array([1], pa.int64())})  # no column `_cdc_k_line`
    on = null_safe_match([(k, f"_cdc_k_{k}") for k in ITEMS.key])
    assert not writer.merge(path, wrong, on, current_clauses(ITEMS, set(), datafusion_quoted))
    assert path in writer.refused
    assert DeltaTable(path).version() == 0


def _ranges(path: Path, ids: list[int | None]) -> None:
    """A current state of four files, each a range of keys (as a snapshot leaves it)."""
    for part in range(4):
        chunk = ids[part * len(ids) // 4 : (part + 1) * len(ids) // 4]
        write_deltalake(
            str(path),
            pa.table({"id": pa.array(chunk, pa.int64()), "n": pa.array([0] * len(chunk))}),
            mode="append",
        )


def _keyed(not_null: bool) -> Table:
    return Table(
        "public",
        "accounts",
        (
            Column("id", "bigint", "int8", "N", False, None, not_null),
            Column("n", "bigint", "int8", "N", False, None, False),
        ),
        ("id",),
        "f" if not not_null else "d",
        0,
        0,
    )


def test_a_key_held_not_null_prunes_the_files_a_merge_reads(tmp_path: Path) -> None:
    """A primary key is NOT NULL: the current state's MERGE compares it with `=`, which
    delta-rs turns into the batch's key range, so a batch of recent keys reads the one
    file that holds them, not the whole table (1.5 s against 0.16 s a batch at 10M rows)."""
    _ranges(tmp_path, list(range(400)))
    on = key_match(_keyed(not_null=True))
    assert on == '(t."id" = s."_cdc_k_id")'
    source = pa.table({"_cdc_k_id": pa.array([390, 391], pa.int64()), "n": pa.array([1, 2])})
    done = (
        DeltaTable(str(tmp_path))
        .merge(source, on, source_alias="s", target_alias="t", streamed_exec=False)
        .when_matched_update({"n": "s.n"})
        .execute()
    )
    assert done["num_target_files_scanned"] == 1, done
    assert done["num_target_rows_updated"] == 2, done


def test_a_nullable_key_still_matches_null_to_null(tmp_path: Path) -> None:
    """A table keyed by pipeline.key_columns may hold a NULL key: it is matched NULL to
    NULL (and every file is read), so its row is updated, not inserted again."""
    _ranges(tmp_path, [None, *range(1, 8)])
    on = key_match(_keyed(not_null=False))
    assert on == '(t."id" IS NOT DISTINCT FROM s."_cdc_k_id")'
    source = pa.table({"_cdc_k_id": pa.array([None], pa.int64()), "n": pa.array([5])})
    done = (
        DeltaTable(str(tmp_path))
        .merge(source, on, source_alias="s", target_alias="t", streamed_exec=False)
        .when_matched_update({"n": "s.n"})
        .when_not_matched_insert({"id": "s._cdc_k_id", "n": "s.n"})
        .execute()
    )
    assert done["num_target_rows_updated"] == 1 and done["num_target_rows_inserted"] == 0
    rows = DeltaTable(str(tmp_path)).to_pyarrow_table().to_pylist()
    assert [r["n"] for r in rows if r["id"] is None] == [5]


def test_the_key_probe_reads_only_the_files_whose_statistics_may_hold_a_key(
    tmp_path: Path,
) -> None:
    """Before a plain append the warehouse asks whether `current` holds any of the
    batch's keys: the files' statistics (Delta's min and max of the key) leave out the
    files that cannot, so keys above every key held (a serial key's inserts) read no
    file, whatever the table's size."""
    from cdc.stores.warehouse.native import _files_in_range

    _ranges(tmp_path, [2 * i for i in range(400)])  # even keys: 0-198, ..., 600-798
    table = DeltaTable(str(tmp_path))
    field = pa.field("id", pa.int64())
    actions = pa.table(table.get_add_actions(flatten=True))
    by_range = {
        low: path.rsplit("/", 1)[-1]
        for path, low in zip(
            actions.column("path").to_pylist(), actions.column("min.id").to_pylist(), strict=True
        )
    }
    assert sorted(by_range) == [0, 200, 400, 600]
    assert _files_in_range(table, field, pa.array([801, 900, 10**9], pa.int64())) == set()
    assert _files_in_range(table, field, pa.array([401, 403], pa.int64())) == {by_range[400]}
    both_ends = _files_in_range(table, field, pa.array([1, 797, 799], pa.int64()))
    assert both_ends == {by_range[0], by_range[600]}
    assert _files_in_range(table, field, pa.array([1, None], pa.int64())) is None
    assert _files_in_range(table, pa.field("id", pa.string()), pa.array(["1"])) is None
    writer, at = NativeWriter(), str(tmp_path)
    assert not writer.holds(at, ["id"], {(801,), (900,)})  # no file read
    assert not writer.holds(at, ["id"], {(401,), (403,)})  # in a file's range, not held
    assert writer.holds(at, ["id"], {(401,), (404,)})
    assert writer.holds(at, ["id"], {(0,)})
    assert writer.holds(at, ["id"], {(798,)})
