"""The warehouse's Delta tables published as Apache Iceberg tables (`[stores.warehouse] iceberg`).

Each Delta table (current state, history, view) gets an Iceberg table over the same
Parquet files, as Delta UniForm does: Iceberg metadata beside Delta's log (`<table>/
_iceberg/`), the tables registered in a SQL catalog (SQLite, `<warehouse>/
_iceberg_catalog.db`), named as their folders are (`<prefix>.<schema>.<table>.current`,
`<prefix>._views.<view>`). Delta stays the table that is written: after its commits, the
publisher reads the new log entries (cdc/stores/warehouse/read/delta_log.py) and
commits one Iceberg snapshot that adds the files Delta added and removes those it
removed, with the Delta version it mirrors (table property `cdc.delta.version`). A
publication that fails (a crash between the two commits) is made whole by the next:
what is published is the difference between the two tables' file sets, not a replay.

Column names: an Iceberg reader finds a column of a file by the field id the file
carries (a column-mapped Delta table's files: Delta's column id, which the Iceberg schema
reuses), else by the table's name mapping (the physical name Delta wrote).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc.core.errors import ConfigError, StoreError
from cdc.core.say import Say
from cdc.stores.warehouse.read.delta_log import DeltaSnapshot, newest_version, read_delta

__all__ = ["IcebergPublisher", "catalog_uri", "iceberg_identifier", "publisher"]

log = logging.getLogger(__name__)

CATALOG_FILE = "_iceberg_catalog.db"
METADATA_FOLDER = "_iceberg"
DELTA_VERSION = "cdc.delta.version"
DELTA_TABLE_ID = "cdc.delta.table-id"
NESTED_IDS = 1_000_000  # a nested field's ids: above every column id Delta gives
KEEP_SNAPSHOTS = 50  # older Iceberg snapshots are expired (Delta's history stays)
_PROPERTIES = {
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "20",
}


def catalog_uri(base: str) -> str:
    """The SQLAlchemy URI of the catalog of the warehouse folder `base`."""
    return f"sqlite:///{Path(base).resolve() / CATALOG_FILE}"


def iceberg_identifier(base: str, path: str) -> tuple[str, ...]:
    """The Iceberg name of the Delta table at `path`: its folders under `base`."""
    return tuple(Path(path).resolve().relative_to(Path(base).resolve()).parts)


def _primitive(kind: str, column: str) -> Any:
    from pyiceberg import types as I

    simple = {
        "string": I.StringType,
        "long": I.LongType,
        "integer": I.IntegerType,
        "short": I.IntegerType,
        "byte": I.IntegerType,
        "double": I.DoubleType,
        "float": I.FloatType,
        "boolean": I.BooleanType,
        "binary": I.BinaryType,
        "date": I.DateType,
        "timestamp": I.TimestamptzType,
        "timestamp_ntz": I.TimestampType,
    }
    if kind in simple:
        return simple[kind]()
    if kind.startswith("decimal(") and kind.endswith(")"):
        precision, scale = kind[len("decimal(") : -1].split(",")
        return I.DecimalType(int(precision), int(scale))
    raise StoreError(f"column {column}: Delta type {kind} has no Iceberg type")


@dataclass
class _Schema:
    """An Iceberg schema made from a Delta schema, with its name mapping and the field
    id of each Parquet column path (for the files' statistics)."""

    fields: list[Any]
    mapping: list[Any]
    parquet_ids: dict[str, int]
    highest: int


class _Converter:
    """Delta's schema to Iceberg's, each field keeping the id it had (by its name) in
    the table's previous Iceberg schema."""

    def __init__(self, previous: Any | None, mapped: bool) -> None:
        self.known: dict[str, int] = dict(previous._name_to_id) if previous is not None else {}
        highest = previous.highest_field_id if previous is not None else 0
        self.next_id = max(highest + 1, NESTED_IDS) if mapped else highest + 1
        self.parquet_ids: dict[str, int] = {}
        self.highest = highest

    def _id(self, name: str, delta_id: int | None = None) -> int:
        if delta_id is not None:
            found = delta_id
        elif name in self.known:
            found = self.known[name]
        else:
            found = self.next_id
            self.next_id += 1
        self.highest = max(self.highest, found)
        return found

    def field(self, column: dict[str, Any], name: str, parquet: str) -> tuple[Any, Any]:
        from pyiceberg.table.name_mapping import MappedField
        from pyiceberg.types import NestedField

        meta = column.get("metadata") or {}
        physical = meta.get("delta.columnMapping.physicalName", column["name"])
        parquet_path = f"{parquet}.{physical}" if parquet else physical
        field_id = self._id(name, meta.get("delta.columnMapping.id"))
        kind, nested = self.type(column["type"], name, parquet_path)
        self.parquet_ids.setdefault(parquet_path, field_id)
        return (
            NestedField(field_id, column["name"], kind, required=not column.get("nullable", True)),
            MappedField(**{"field-id": field_id, "names": [physical], "fields": nested}),
        )

    def type(self, kind: Any, name: str, parquet: str) -> tuple[Any, list[Any]]:
        from pyiceberg import types as I
        from pyiceberg.table.name_mapping import MappedField

        if isinstance(kind, str):
            return _primitive(kind, name), []
        if kind["type"] == "array":
            element_id = self._id(f"{name}.element")
            element, nested = self.type(
                kind["elementType"], f"{name}.element", f"{parquet}.list.element"
            )
            self.parquet_ids.setdefault(f"{parquet}.list.element", element_id)
            return (
                I.ListType(element_id, element, element_required=not kind["containsNull"]),
                [MappedField(**{"field-id": element_id, "names": ["element"], "fields": nested})],
            )
        if kind["type"] == "map":
            key_id, value_id = self._id(f"{name}.key"), self._id(f"{name}.value")
            key, key_nested = self.type(kind["keyType"], f"{name}.key", f"{parquet}.key_value.key")
            value, value_nested = self.type(
                kind["valueType"], f"{name}.value", f"{parquet}.key_value.value"
            )
            self.parquet_ids.setdefault(f"{parquet}.key_value.key", key_id)
            self.parquet_ids.setdefault(f"{parquet}.key_value.value", value_id)
            return (
                I.MapType(
                    key_id, key, value_id, value, value_required=not kind["valueContainsNull"]
                ),
                [
                    MappedField(**{"field-id": key_id, "names": ["key"], "fields": key_nested}),
                    MappedField(
                        **{"field-id": value_id, "names": ["value"], "fields": value_nested}
                    ),
                ],
            )
        if kind["type"] == "struct":
            pairs = [self.field(f, f"{name}.{f['name']}", parquet) for f in kind["fields"]]
            return I.StructType(*[p[0] for p in pairs]), [p[1] for p in pairs]
        raise StoreError(f"column {name}: Delta type {kind['type']} has no Iceberg type")


def iceberg_schema(delta: DeltaSnapshot, previous: Any | None) -> _Schema:
    """The Iceberg fields, name mapping and Parquet ids of the Delta snapshot's schema."""
    mapped = delta.configuration.get("delta.columnMapping.mode", "none") != "none"
    convert = _Converter(previous, mapped)
    pairs = [convert.field(c, c["name"], "") for c in delta.schema["fields"]]
    return _Schema(
        [p[0] for p in pairs], [p[1] for p in pairs], convert.parquet_ids, convert.highest
    )


def unpromotable(before: Any, after: Any) -> list[str]:
    """The columns whose type changed from the Iceberg schema `before` to `after` in a
    way Iceberg's readers cannot promote the files already written (v2: int to long,
    float to double, a decimal's precision up, nothing else; Delta's type widening
    allows more: int to double or decimal, a decimal's scale up, date to timestamp):
    "name: old -> new" each."""
    from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType

    def promotable(old: Any, new: Any) -> bool:
        if old == new or (isinstance(old, IntegerType) and isinstance(new, LongType)):
            return True
        if isinstance(old, FloatType) and isinstance(new, DoubleType):
            return True
        return (
            isinstance(old, DecimalType)
            and isinstance(new, DecimalType)
            and new.scale == old.scale
            and new.precision >= old.precision
        )

    held = {f.field_id: f for f in before.fields}
    return [
        f"{field.name}: {held[field.field_id].field_type} -> {field.field_type}"
        for field in after.fields
        if field.field_id in held
        and field.field_type.is_primitive
        and not promotable(held[field.field_id].field_type, field.field_type)
    ]


def _partition_value(text: str | None, kind: Any) -> Any:
    """A partition value as Delta's log writes it, as Iceberg holds it."""
    import datetime as dt
    from decimal import Decimal

    from pyiceberg import types as I

    if text is None:
        return None
    if isinstance(kind, I.BooleanType):
        return text.lower() == "true"
    if isinstance(kind, I.IntegerType | I.LongType):
        return int(text)
    if isinstance(kind, I.FloatType | I.DoubleType):
        return float(text)
    if isinstance(kind, I.DecimalType):
        return Decimal(text)
    if isinstance(kind, I.DateType):
        return (dt.date.fromisoformat(text) - dt.date(1970, 1, 1)).days
    if isinstance(kind, I.StringType):
        return text
    raise StoreError(f"a Delta partition column of Iceberg type {kind}, which is not published")


def publisher(settings: Any) -> IcebergPublisher | None:
    """The warehouse's publisher under `settings` ([stores.warehouse] iceberg), or None
    (the declaration's `publisher`, cdc/core/store_declarations.py)."""
    if not settings.store_section("warehouse").iceberg:
        return None
    from cdc.stores.warehouse.tables import warehouse_base, warehouse_root

    return IcebergPublisher(warehouse_base(settings), warehouse_root(settings))


class IcebergPublisher:
    """Publishes the Delta tables under a warehouse folder as Iceberg tables."""

    name = "iceberg"

    def __init__(self, base: str, root: str) -> None:
        if "://" in base and not base.startswith("file://"):
            raise ConfigError(
                f"[stores.warehouse] iceberg publishes a local warehouse only, not {base}; "
                "turn it off, or set [stores.warehouse] path to a local folder"
            )
        self.base = base.removeprefix("file://")
        self.root = root.removeprefix("file://")
        self._catalog: Any = None
        self._delta: dict[str, DeltaSnapshot] = {}
        self._published: dict[str, tuple[str, int]] = {}  # path: (table id, Delta version)
        self._files: dict[str, dict[str, Any]] = {}  # path: Iceberg's files by path
        self._failing: dict[str, str] = {}  # path: why its last publication failed

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            Path(self.base).mkdir(parents=True, exist_ok=True)
            self._catalog = SqlCatalog(
                "cdc", uri=catalog_uri(self.base), warehouse=f"file://{self.base}"
            )
        return self._catalog

    def tables(self) -> list[str]:
        """The Delta tables under the pipeline's folder."""
        root = Path(self.root)
        found = [*root.glob("*/*/current"), *root.glob("*/*/history"), *root.glob("_views/*")]
        return sorted(str(p) for p in found if (p / "_delta_log").is_dir())

    def status(self) -> dict[str, Any]:
        """`cdc status`: how many tables there are, which of them Iceberg lags (by folder
        under the pipeline's root: Delta's version and the one published), or the one
        line of why the catalog could not be read."""
        try:
            behind = {
                path.removeprefix(self.root).lstrip("/"): list(versions)
                for path, versions in self.behind().items()
            }
        except Exception as exc:  # the catalog unreadable (locked, corrupt): said, not raised
            line = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            return {"tables": 0, "behind": {}, "error": line}
        return {"tables": len(self.tables()), "behind": behind}

    def behind(self) -> dict[str, tuple[int, int | None]]:
        """The tables whose newest Delta version Iceberg lacks: (Delta's version, the
        one published, None if none is) by table folder (`cdc status`)."""
        from pyiceberg.exceptions import NoSuchTableError

        found: dict[str, tuple[int, int | None]] = {}
        for path in self.tables():
            version = newest_version(path)
            if version is None:
                continue
            try:
                table = self.catalog.load_table(iceberg_identifier(self.base, path))
                published: int | None = int(table.properties.get(DELTA_VERSION, "-1"))
            except (NoSuchTableError, OSError, ValueError):
                published = None
            if published is None or published < version:
                found[path] = (version, None if published in (None, -1) else published)
        return found

    def publish_all(self, say: Say | None = None, strict: bool = False) -> dict[str, float]:
        """Publish every table whose Delta version is not yet in Iceberg: the seconds
        each took. A table that fails is said (`note`) and tried again next time; with
        `strict`, the first failure is raised, once every other table is published."""
        spent: dict[str, float] = {}
        failed: list[str] = []
        for path in self.tables():
            started = time.monotonic()
            try:
                if self.publish(path):
                    spent[path] = time.monotonic() - started
            except Exception as exc:
                self._forget(path)
                line = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                failed.append(f"{path} not published as an Iceberg table: {line}")
                if self._failing.get(path) != line:  # said once, not every interval
                    self._failing[path] = line
                    log.warning("iceberg: %s", failed[-1])
                    if say is not None:
                        say(f"iceberg: {failed[-1]}; trying again")
                continue
            self._failing.pop(path, None)
        if strict and failed:
            raise StoreError(failed[0])
        return spent

    def _forget(self, path: str) -> None:
        for cache in (self._delta, self._published, self._files):
            cache.pop(path, None)

    def publish(self, path: str) -> bool:
        """Publish the Delta table at `path` if Iceberg lacks its newest version: whether
        a snapshot was committed."""
        delta = read_delta(path, self._delta.get(path))
        if delta is None:
            return False
        self._delta[path] = delta
        if self._published.get(path) == (delta.table_id, delta.version):
            return False
        table = self._table(path, delta)
        if table.properties.get(DELTA_VERSION) == str(delta.version):
            self._published[path] = (delta.table_id, delta.version)
            return False
        self._commit(path, table, delta)
        self._published[path] = (delta.table_id, delta.version)
        return True

    def _table(self, path: str, delta: DeltaSnapshot) -> Any:
        """The Iceberg table of `path`, made (again) when it is missing, unreadable, or
        of another Delta table (one removed and made again)."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError

        identifier = iceberg_identifier(self.base, path)
        try:
            table = self.catalog.load_table(identifier)
        except (NoSuchTableError, OSError, ValueError):  # none, or its metadata is gone
            table = None
        if table is not None and table.properties.get(DELTA_TABLE_ID) == delta.table_id:
            return table
        self._files.pop(path, None)
        with contextlib.suppress(NoSuchTableError):  # the catalog's row only
            self.catalog.drop_table(identifier)
        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog.create_namespace(identifier[:-1])
        return self._create(identifier, path, delta)

    def _create(self, identifier: tuple[str, ...], path: str, delta: DeltaSnapshot) -> Any:
        """A new, empty Iceberg table with the Delta table's schema (its field ids ours,
        not fresh ones) and partition columns."""
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema
        from pyiceberg.table.update import (
            AddPartitionSpecUpdate,
            AddSchemaUpdate,
            SetCurrentSchemaUpdate,
            SetDefaultSpecUpdate,
        )
        from pyiceberg.transforms import IdentityTransform

        made = iceberg_schema(delta, None)
        schema = Schema(*made.fields, schema_id=1)
        spec = PartitionSpec(
            *[
                PartitionField(schema.find_field(c).field_id, 1000 + i, IdentityTransform(), c)
                for i, c in enumerate(delta.partition_columns)
            ],
            spec_id=1,
        )
        properties = {
            **_PROPERTIES,
            "write.metadata.path": f"file://{path}/{METADATA_FOLDER}",
            DELTA_TABLE_ID: delta.table_id,
        }
        # (made under a two-part name, the one PyIceberg makes tables under: the catalog
        # keeps the namespace as the dotted text that every level of it makes)
        named = (".".join(identifier[:-1]), identifier[-1])
        with self.catalog.create_table_transaction(
            named, Schema(*made.fields), location=f"file://{path}", properties=properties
        ) as tx:
            tx._apply(
                (
                    AddSchemaUpdate(schema_=schema),
                    SetCurrentSchemaUpdate(schema_id=-1),
                    AddPartitionSpecUpdate(spec=spec),
                    SetDefaultSpecUpdate(spec_id=-1),
                )
            )
        return self.catalog.load_table(identifier)

    def _current_files(self, path: str, table: Any) -> dict[str, Any]:
        if path not in self._files:
            snapshot = table.current_snapshot()
            files: dict[str, Any] = {}
            if snapshot is not None:
                for manifest in snapshot.manifests(table.io):
                    for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                        files[entry.data_file.file_path] = entry.data_file
            self._files[path] = files
        return self._files[path]

    def _commit(self, path: str, table: Any, delta: DeltaSnapshot) -> None:
        """One Iceberg snapshot: Delta's schema, the files Delta added, without those it
        removed, and the Delta version it mirrors."""
        from pyiceberg.schema import Schema
        from pyiceberg.table.name_mapping import NameMapping
        from pyiceberg.table.update import AddSchemaUpdate, SetCurrentSchemaUpdate

        made = iceberg_schema(delta, table.schema())
        schema = Schema(*made.fields, schema_id=table.schema().schema_id)
        have = self._current_files(path, table)
        wanted = {f"file://{p}" if "://" not in p else p: v for p, v in delta.files.items()}
        removed = [f for p, f in have.items() if p not in wanted]
        kept = [p for p in have if p in wanted]
        changed = unpromotable(table.schema(), schema) if kept else []
        if changed:  # its files written before would no longer be read (a rewrite is)
            raise StoreError(
                f"{', '.join(changed)}: a type change Iceberg cannot read the files written "
                "before under; the Iceberg table stays at its last version (Delta's is "
                "current): run `cdc rebuild --store warehouse` to write every file again"
            )
        with table.transaction() as tx:
            if schema.as_struct() != table.schema().as_struct():
                new_id = max(s.schema_id for s in table.schemas().values()) + 1
                tx._apply(
                    (
                        AddSchemaUpdate(schema_=Schema(*made.fields, schema_id=new_id)),
                        SetCurrentSchemaUpdate(schema_id=-1),
                    )
                )
            spec = tx.table_metadata.spec()
            added = [
                self._data_file(
                    table.io,
                    tx.table_metadata.schema(),
                    spec,
                    made,
                    p,
                    v,
                    tx.table_metadata.properties,
                )
                for p, v in wanted.items()
                if p not in have
            ]
            tx.set_properties(
                {
                    "schema.name-mapping.default": NameMapping(made.mapping).model_dump_json(),
                    DELTA_VERSION: str(delta.version),
                }
            )
            if removed or added:
                update = tx.update_snapshot(snapshot_properties={DELTA_VERSION: str(delta.version)})
                producer = update.overwrite() if removed else update.merge_append()
                for data_file in removed:
                    producer.delete_data_file(data_file)
                for data_file in added:
                    producer.append_data_file(data_file)
                producer.commit()
        for data_file in removed:
            have.pop(data_file.file_path, None)
        for data_file in added:
            have[data_file.file_path] = data_file
        self._expire(table)

    def _data_file(
        self,
        io: Any,
        schema: Any,
        spec: Any,
        made: _Schema,
        path: str,
        partition_values: dict[str, str | None],
        properties: dict[str, str],
    ) -> Any:
        """An Iceberg data file of a Parquet file Delta wrote: its counts and bounds from
        the file's footer, its partition from Delta's log."""
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
        )
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        source = io.new_input(path)
        with source.open() as stream:
            footer = pq.read_metadata(stream)
        try:
            statistics = data_file_statistics_from_parquet_metadata(
                footer, compute_statistics_plan(schema, properties), made.parquet_ids
            ).to_serialized_dict()
        except (KeyError, ValueError, TypeError):  # e.g. INT96 timestamps: counts only
            statistics = {"record_count": footer.num_rows}
        partition = Record(
            *[
                _partition_value(
                    partition_values.get(schema.find_field(f.source_id).name),
                    schema.find_field(f.source_id).field_type,
                )
                for f in spec.fields
            ]
        )
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=partition,
            file_size_in_bytes=len(source),
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **statistics,
        )
        data_file.spec_id = spec.spec_id  # (not a field of the file: from_args leaves it)
        return data_file

    def _expire(self, table: Any) -> None:
        """Expire the snapshots past the newest KEEP_SNAPSHOTS, in bulk, and remove the
        manifest lists and manifests only they used (the data files are Delta's, to
        remove with Delta's VACUUM; older Iceberg metadata files go as Iceberg's
        write.metadata.previous-versions-max says)."""
        # (the table the transaction committed holds its new metadata: no read again)
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
        old, kept = snapshots[:-KEEP_SNAPSHOTS], snapshots[-KEEP_SNAPSHOTS:]
        if len(old) < KEEP_SNAPSHOTS:  # each expiry is a commit of its own: seldom
            return
        used = {m.manifest_path for s in kept for m in s.manifests(table.io)}
        unused = {m.manifest_path for s in old for m in s.manifests(table.io)} - used
        table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in old]).commit()
        for path in [*unused, *(s.manifest_list for s in old)]:
            with contextlib.suppress(OSError):
                table.io.delete(path)
