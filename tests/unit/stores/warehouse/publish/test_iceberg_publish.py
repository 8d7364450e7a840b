"""The Iceberg publisher (apply.iceberg) on Delta logs and Parquet files made here: what
it reads of a Delta log, the Iceberg schema it makes, and the Iceberg tables PyIceberg
reads after each Delta commit, a publisher that starts afresh included."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from cdc.core.errors import StoreError
from cdc.stores.warehouse.publish.iceberg import NESTED_IDS, IcebergPublisher, iceberg_schema
from cdc.stores.warehouse.read.delta_log import read_delta

FIELDS = [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "note", "type": "string", "nullable": True, "metadata": {}},
    {
        "name": "tags",
        "type": {"type": "array", "elementType": "string", "containsNull": True},
        "nullable": True,
        "metadata": {},
    },
    {"name": "newest", "type": "boolean", "nullable": True, "metadata": {}},
]


def _meta(fields: list[dict[str, Any]], table_id: str = "t-1", **configuration: str) -> dict:
    return {
        "metaData": {
            "id": table_id,
            "schemaString": json.dumps({"type": "struct", "fields": fields}),
            "partitionColumns": ["newest"],
            "configuration": configuration,
        }
    }


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(json.dumps(a) for a in actions)
    (log / f"{version:020d}.json").write_text(lines + "\n")


def _parquet(table: Path, name: str, ids: list[int], newest: bool, **extra: list) -> dict:
    """A Parquet file of rows `ids` in the partition folder Delta would write, without
    its partition column (as Delta writes it), and its log's `add`."""
    folder = f"newest={str(newest).lower()}"
    (table / folder).mkdir(parents=True, exist_ok=True)
    columns = {
        "id": pa.array(ids, pa.int64()),
        "note": pa.array([f"n {i}" for i in ids]),
        "tags": pa.array([[f"t{i}", "x"] for i in ids], pa.list_(pa.string())),
        **{k: pa.array(v) for k, v in extra.items()},
    }
    pq.write_table(pa.table(columns), table / folder / name)
    relative = f"{folder}/{name}".replace("=", "%3D")  # the log URL-encodes its paths
    return {"add": {"path": relative, "partitionValues": {"newest": str(newest).lower()}}}


def _iceberg_rows(base: Path, name: tuple[str, ...]) -> list[dict[str, Any]]:
    catalog = SqlCatalog("cdc", uri=f"sqlite:///{base / '_iceberg_catalog.db'}")
    rows = catalog.load_table(name).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def test_the_log_is_replayed_and_then_read_from_where_it_was(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _meta(FIELDS), {"add": {"path": "a%20b.parquet", "partitionValues": {}}})
    first = read_delta(str(table))
    assert first is not None and first.version == 0
    assert list(first.files) == [f"{table}/a b.parquet"]
    assert read_delta(str(table), first) is first  # nothing new: nothing read
    _commit(table, 1, {"remove": {"path": "a%20b.parquet"}}, {"add": {"path": "c.parquet"}})
    second = read_delta(str(table), first)
    assert second is not None and second.version == 1
    assert list(second.files) == [f"{table}/c.parquet"]
    assert list(first.files) == [f"{table}/a b.parquet"]  # the one read before stays as it was
    assert read_delta(str(tmp_path / "none")) is None


def test_a_table_made_again_in_its_folder_is_read_whole(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _meta(FIELDS), {"add": {"path": "a.parquet"}})
    _commit(table, 1, {"add": {"path": "b.parquet"}})
    before = read_delta(str(table))
    (table / "_delta_log").rename(tmp_path / "old-log")
    _commit(table, 0, _meta(FIELDS, table_id="t-2"), {"add": {"path": "c.parquet"}})
    assert os.stat(table / "_delta_log").st_ino != os.stat(tmp_path / "old-log").st_ino
    again = read_delta(str(table), before)
    assert again is not None and again.table_id == "t-2"
    assert list(again.files) == [f"{table}/c.parquet"]


def test_a_deletion_vector_is_refused_in_one_line(tmp_path: Path) -> None:
    table = tmp_path / "t"
    vector = {"storageType": "u", "pathOrInlineDv": "x", "sizeInBytes": 1, "cardinality": 1}
    _commit(table, 0, _meta(FIELDS), {"add": {"path": "a.parquet", "deletionVector": vector}})
    with pytest.raises(StoreError, match="deletion vector") as caught:
        read_delta(str(table))
    assert "\n" not in str(caught.value)


def test_field_ids_stay_with_their_names_and_mapped_tables_keep_deltas() -> None:
    table = tmp_path_free_snapshot(FIELDS)
    made = iceberg_schema(table, None)
    ids = {f.name: f.field_id for f in made.fields}
    assert made.parquet_ids == {
        "id": ids["id"],
        "note": ids["note"],
        "tags.list.element": made.fields[2].field_type.element_id,
        "tags": ids["tags"],
        "newest": ids["newest"],
    }
    from pyiceberg.schema import Schema

    previous = Schema(*made.fields)
    wider = tmp_path_free_snapshot(
        [{"name": "city", "type": "string", "nullable": True, "metadata": {}}, *FIELDS]
    )
    again = iceberg_schema(wider, previous)
    assert {f.name: f.field_id for f in again.fields if f.name != "city"} == ids
    assert (
        next(f.field_id for f in again.fields if f.name == "city") == previous.highest_field_id + 1
    )

    mapped_fields = [
        {
            **f,
            "metadata": {
                "delta.columnMapping.id": 7 + i,
                "delta.columnMapping.physicalName": f"col-{i}",
            },
        }
        for i, f in enumerate(FIELDS)
    ]
    mapped = iceberg_schema(
        tmp_path_free_snapshot(mapped_fields, **{"delta.columnMapping.mode": "name"}), None
    )
    assert [f.field_id for f in mapped.fields] == [7, 8, 9, 10]
    assert mapped.fields[2].field_type.element_id >= NESTED_IDS
    assert [m.names for m in mapped.mapping] == [["col-0"], ["col-1"], ["col-2"], ["col-3"]]
    assert mapped.parquet_ids["col-2.list.element"] == mapped.fields[2].field_type.element_id


def tmp_path_free_snapshot(fields: list[dict[str, Any]], **configuration: str) -> Any:
    from cdc.stores.warehouse.read.delta_log import DeltaSnapshot

    return DeltaSnapshot("/t", 0, "t-1", 1, {"fields": fields}, ["newest"], configuration)


def test_each_delta_commit_is_published_and_read_by_pyiceberg(tmp_path: Path) -> None:
    base, table = (
        tmp_path / "warehouse",
        tmp_path / "warehouse" / "cdc" / "public" / "t" / "current",
    )
    name = ("cdc", "public", "t", "current")
    a = _parquet(table, "a.parquet", [1, 2], True)
    b = _parquet(table, "b.parquet", [3], False)
    _commit(table, 0, _meta(FIELDS), a, b)
    publisher = IcebergPublisher(str(base), str(base / "cdc"))
    assert publisher.tables() == [str(table)]
    assert publisher.behind() == {str(table): (0, None)}  # what `cdc status` shows
    assert publisher.publish_all() and not publisher.publish_all()  # once per version
    assert publisher.behind() == {}
    rows = _iceberg_rows(base, name)
    assert [(r["id"], r["newest"], r["tags"]) for r in rows] == [
        (1, True, ["t1", "x"]),
        (2, True, ["t2", "x"]),
        (3, False, ["t3", "x"]),
    ]

    # a MERGE's rewrite: a file removed, one added; then a column added. A publisher
    # that starts afresh (a crash between Delta's commit and Iceberg's) catches up.
    c = _parquet(table, "c.parquet", [2], True)
    _commit(table, 1, {"remove": {"path": a["add"]["path"]}}, c)
    wider = [*FIELDS, {"name": "city", "type": "string", "nullable": True, "metadata": {}}]
    d = _parquet(table, "d.parquet", [4], False, city=["Lyon"])
    _commit(table, 2, _meta(wider), d)
    assert publisher.behind() == {str(table): (2, 0)}
    assert IcebergPublisher(str(base), str(base / "cdc")).publish_all()
    rows = _iceberg_rows(base, name)
    assert [(r["id"], r["city"]) for r in rows] == [(2, None), (3, None), (4, "Lyon")]

    # the table removed and made again in its folder: a new Iceberg table
    for path in sorted(table.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    e = _parquet(table, "e.parquet", [9], True)
    _commit(table, 0, _meta(FIELDS, table_id="t-2"), e)
    assert publisher.publish_all()
    assert [r["id"] for r in _iceberg_rows(base, name)] == [9]


def test_a_warehouse_elsewhere_than_this_machine_is_refused() -> None:
    from cdc.core.errors import ConfigError

    with pytest.raises(ConfigError, match="local warehouse only"):
        IcebergPublisher("s3://bucket/warehouse", "s3://bucket/warehouse/cdc")


def test_status_says_which_iceberg_tables_lag_their_delta_table() -> None:
    from rich.console import Console

    from cdc.check.status import PipelineStatus
    from cdc.cli.render import pipeline_table

    def line(iceberg: dict[str, Any]) -> str:
        console = Console(record=True, width=300)
        status = PipelineStatus("cdc", "done", None, None, None, published={"iceberg": iceberg})
        console.print(pipeline_table(status))
        return next(x for x in console.export_text().splitlines() if "iceberg" in x)

    assert "3 tables published" in line({"tables": 3, "behind": {}})
    lagging = line({"tables": 3, "behind": {"public/t/current": [4, None]}})
    assert "1 of 3 tables behind Delta" in lagging
    assert "public/t/current (Delta 4, Iceberg none)" in lagging


def test_old_snapshots_expire_with_the_files_only_they_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc.stores.warehouse.publish import iceberg

    monkeypatch.setattr(iceberg, "KEEP_SNAPSHOTS", 3)
    base, table = tmp_path / "w", tmp_path / "w" / "cdc" / "public" / "t" / "current"
    publisher = IcebergPublisher(str(base), str(base / "cdc"))
    last = _parquet(table, "f0.parquet", [0], True)
    _commit(table, 0, _meta(FIELDS), last)
    publisher.publish_all()
    for version in range(1, 10):  # each commit replaces the one file
        new = _parquet(table, f"f{version}.parquet", [version], True)
        _commit(table, version, {"remove": {"path": last["add"]["path"]}}, new)
        last = new
        assert publisher.publish_all()
    catalog = SqlCatalog("cdc", uri=f"sqlite:///{base / '_iceberg_catalog.db'}")
    loaded = catalog.load_table(("cdc", "public", "t", "current"))
    assert 3 <= len(loaded.snapshots()) < 6
    lists = {Path(s.manifest_list).name for s in loaded.snapshots()}
    on_disk = {p.name for p in (table / "_iceberg").glob("snap-*.avro")}
    assert on_disk == lists  # the expired snapshots' manifest lists are gone
    used = {Path(m.manifest_path).name for s in loaded.snapshots() for m in s.manifests(loaded.io)}
    manifests = {p.name for p in (table / "_iceberg").glob("*.avro")} - on_disk
    assert manifests == used
    assert [r["id"] for r in _iceberg_rows(base, ("cdc", "public", "t", "current"))] == [9]


def test_a_type_change_iceberg_cannot_promote_is_not_published(tmp_path: Path) -> None:
    """A Delta table whose files written as long stay under a double column (Delta 4's
    type widening): Iceberg's readers cannot read them (review F10), so the Iceberg table
    stays at its last version, readable, and the publisher says why. int to long is
    published, and so is the warehouse's own widening, which writes every file anew."""
    base, table = (
        tmp_path / "warehouse",
        tmp_path / "warehouse" / "cdc" / "public" / "t" / "current",
    )
    name = ("cdc", "public", "t", "current")
    qty = {"name": "qty", "type": "integer", "nullable": True, "metadata": {}}
    a = _parquet(table, "a.parquet", [1], True, qty=pa.array([5], pa.int32()))
    _commit(table, 0, _meta([*FIELDS, qty]), a)
    publisher = IcebergPublisher(str(base), str(base / "cdc"))
    assert publisher.publish_all()

    as_long = {**qty, "type": "long"}
    b = _parquet(table, "b.parquet", [2], True, qty=pa.array([6], pa.int64()))
    _commit(table, 1, _meta([*FIELDS, as_long]), b)
    assert publisher.publish_all()
    assert [(r["id"], r["qty"]) for r in _iceberg_rows(base, name)] == [(1, 5), (2, 6)]

    as_double = {**qty, "type": "double"}
    c = _parquet(table, "c.parquet", [3], True, qty=pa.array([7.5], pa.float64()))
    _commit(table, 2, _meta([*FIELDS, as_double]), c)
    said: list[str] = []  # said once, not at every interval it is tried again
    publisher.publish_all(said.append)
    publisher.publish_all(said.append)
    assert len(said) == 1 and "a type change Iceberg cannot" in said[0]
    with pytest.raises(StoreError, match="qty: long -> double: a type change Iceberg cannot"):
        publisher.publish_all(strict=True)
    assert publisher.behind() == {str(table): (2, 1)}  # `cdc status` shows it behind
    assert [(r["id"], r["qty"]) for r in _iceberg_rows(base, name)] == [(1, 5), (2, 6)]

    # the warehouse's own widening writes the table anew (every file): published
    d = _parquet(table, "d.parquet", [1, 2, 3], True, qty=pa.array([5.0, 6.0, 7.5]))
    gone = [{"remove": {"path": f["add"]["path"]}} for f in (a, b, c)]
    _commit(table, 3, _meta([*FIELDS, as_double]), *gone, d)
    assert publisher.publish_all(strict=True)
    assert [r["qty"] for r in _iceberg_rows(base, name)] == [5.0, 6.0, 7.5]


def test_status_says_in_one_line_a_publisher_it_cannot_make(tmp_path: Path) -> None:
    """A warehouse on object storage with iceberg on: `cdc status` says why under the
    store's name, and the rest of the pipeline's figures stand."""
    from cdc.check.status import _published
    from cdc.core.settings import Settings
    from cdc.stores.warehouse.settings import with_warehouse

    settings = with_warehouse(
        Settings(data_dir=tmp_path),  # type: ignore[call-arg]
        path="s3a://lake/cdc",
        iceberg=True,
    )
    found = _published(settings)
    assert "local warehouse only" in found["warehouse"]["error"]
    assert _published(Settings(data_dir=tmp_path)) == {}  # type: ignore[call-arg]
