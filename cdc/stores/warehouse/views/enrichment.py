"""Stream-table joins (`apply.joins` of kind `stream_table`), under
`<warehouse>/<prefix>/_views/<name>`: each creation event of a table enriched with the
referenced row as it was then.

Each row inserted into the stream table after the snapshot (a creation event, op "c")
is an event: it stays in the view when its row is later changed or deleted. It is
enriched with the referenced row as it was when the event committed: of the referenced
key's versions in its history, the one with the greatest position (commit LSN, change
LSN) at or before the event's; NULLs when that version is a delete, or was ended by a
TRUNCATE before the event's commit time, or when there is none. A change of the
referenced row sorts after the events before it, so it never rewrites them.

The view is a function of the two tables' histories, kept after each warehouse batch:
- the batch's creation events are enriched (from the histories as the batch left them)
  and merged on the event's key and position, so a replayed or redelivered insert is
  one event;
- a version of a referenced row that reaches the warehouse after events it precedes
  (its topic read behind the stream's) enriches those events again: the events of its
  key at a later position. In the steady state every new version is newer than every
  enriched event, and the view is not read.

`cdc verify` enriches each creation event again from the change log, read with a
Kafka consumer of its own (`expected`): the referenced key's latest change at or
before its position (`enrich`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc.core.catalog import TRUNCATIONS_TABLE, Table
from cdc.core.settings.views import StreamTableJoin
from cdc.core.topics import ChangeRecord
from cdc.log.envelope import event_position
from cdc.log.position import Position
from cdc.stores.base import Expected, ValueForm, Verifier
from cdc.stores.warehouse.conflicts import retried
from cdc.stores.warehouse.native import NativeWriter, null_safe_match
from cdc.stores.warehouse.native import datafusion_quoted as dq
from cdc.stores.warehouse.steps import Keep, Kept, as_frame
from cdc.stores.warehouse.views.base import NOW, ReferencingJoin
from cdc.stores.warehouse.views.streams import logged_changes
from cdc.types.decode import decode_value
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "EVENT_COLUMNS",
    "EnrichmentView",
    "Version",
    "enrich",
    "latest_at_or_before",
    "refresh_enrichment_arrow",
]

log = logging.getLogger(__name__)

# after the stream table's columns: the event's commit time and position
EVENT_COLUMNS = ("event_ts", "_cdc_commit_lsn", "_cdc_lsn")


class EnrichmentView(ReferencingJoin):
    """A stream-table join (StreamTableJoin), refreshed after each warehouse batch."""

    settings: StreamTableJoin
    added = EVENT_COLUMNS

    def __init__(self, settings: StreamTableJoin) -> None:
        super().__init__(settings)
        self.newest: tuple[int, int] | None = None  # its newest event's position (None: not read)

    @property
    def verified_as(self) -> str:
        return "stream-table join equals its events enriched again from the log"

    def verify(self, by: Verifier) -> Any:
        return by.against_log(self)

    def keeps(self) -> dict[str, set[Keep]]:
        keep: dict[str, set[Keep]] = {self.settings.table: {"created"}}
        keep.setdefault(self.settings.references, set()).add("versions")  # (may be the same)
        return keep

    def refresh(
        self,
        spark: Any,
        root: str,
        tables: dict[str, Table],
        kept: dict[str, Kept],
        truncated: set[str],
        native: NativeWriter | None = None,
    ) -> None:
        """Its stream got inserts, or its referenced table changed, in the batch; every
        event again after a TRUNCATE of the referenced table (read after events it came
        before: it ends the versions they took)."""
        join = self.settings
        if not set(self.sides) <= set(tables):
            return
        created = kept.get(join.table, Kept()).created
        versions = kept.get(join.references, Kept()).versions
        again = join.references in truncated
        if created is None and versions is None and not again:
            return
        # read from the view again if this refresh fails (it may have written)
        newest, self.newest = self.newest, None
        if native is not None and not again and isinstance(created, pa.Table):
            # the batch was shaped on the driver: the steady state is enriched in Arrow
            self.newest = refresh_enrichment_arrow(
                root, join, tables, created, versions, newest, native
            )
            if self.newest is not None:
                return
        created, versions = as_frame(spark, created), as_frame(spark, versions)
        self.newest = refresh_enrichment(
            spark, root, join, tables, created, versions, newest, everything=again, native=native
        )

    def expected(
        self, tables: dict[str, Table], logs: dict[str, list[ChangeRecord]], form: ValueForm
    ) -> Expected:
        """Per creation event of the stream table ((its key values..., commit LSN,
        LSN)): the referenced columns as of its position, due at once (`logs` also holds
        the TRUNCATEs' table)."""
        join = self.settings
        stream, referenced = tables[join.table], tables[join.references]
        log = _referenced_log(referenced, logs[referenced.qualified], logs[TRUNCATIONS_TABLE])
        expected: Expected = {}
        key = [*stream.key, join.on]
        for event in logged_changes(logs[stream.qualified], stream, key, ("c",)):
            identity = (*[form(stream.column(k), event.values[k]) for k in stream.key], *event.at)
            versions = log.versions.get(event.values[join.on], [])
            chosen = enrich(versions, log.truncates, event.at, event.ms)
            expected[identity] = (
                tuple(
                    None
                    if chosen is None or chosen.after is None
                    else form(
                        referenced.column(c),
                        decode_value(referenced.column(c), chosen.after.get(c)),
                    )
                    for c in join.columns
                ),
                NOW,
            )
        return expected

    def held(self, frame: DataFrame, tables: dict[str, Table], form: ValueForm) -> dict[Any, Any]:
        join = self.settings
        stream, referenced = tables[join.table], tables[join.references]
        carried = [referenced.column(c) for c in join.columns]
        return {
            (
                *[form(stream.column(k), row[k]) for k in stream.key],
                row["_cdc_commit_lsn"],
                row["_cdc_lsn"],
            ): tuple(form(c, row[join.column_prefix + c.name]) for c in carried)
            for batch in frame.toArrow().to_batches()
            for row in batch.to_pylist()
        }


def enrichment_fields(join: StreamTableJoin, stream: Table, referenced: Table) -> list[Any]:
    from pyspark.sql import types as T

    fields = [T.StructField(c.name, spark_type(c)) for c in stream.columns]
    event_ts, commit_lsn, lsn = EVENT_COLUMNS
    fields += [
        T.StructField(event_ts, T.TimestampType()),
        T.StructField(commit_lsn, T.LongType()),
        T.StructField(lsn, T.LongType()),
    ]
    fields += [
        T.StructField(join.column_prefix + c, spark_type(referenced.column(c)))
        for c in join.columns
    ]
    return fields


def refresh_enrichment_arrow(
    root: str,
    join: StreamTableJoin,
    tables: dict[str, Table],
    created: pa.Table,
    versions: pa.Table | None,
    newest: tuple[int, int] | None,
    native: NativeWriter,
) -> tuple[int, int] | None:
    """`refresh_enrichment` in its steady state without Spark: every creation event of
    the batch (`created`, Arrow) is newer than every event the view holds, and no
    version of the batch's referenced rows (`versions`) precedes one, so the events are
    enriched from the referenced history (read by delta-rs) and appended, one delta-rs
    commit. Returns the newest event position the view holds then; None, having
    written nothing, where it cannot (the view not made yet or without a column it
    needs, a TRUNCATE in the history read, a table delta-rs does not read, a type Arrow
    does not take): the caller refreshes with Spark."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from cdc.stores.warehouse.history import TRUNCATE_OP
    from cdc.stores.warehouse.tables import history_path, view_path

    stream, referenced = tables[join.table], tables[join.references]
    path = view_path(root, join.name)
    held = native.dataset(path)
    history = native.dataset(history_path(root, referenced.qualified))
    names = [c.name for c in stream.columns] + list(EVENT_COLUMNS) + join.carried
    if held is None or history is None or set(names) - set(held.schema.names):
        return None
    if newest is None:
        newest = _newest_held(held.to_table(columns=["_cdc_commit_lsn", "_cdc_lsn"]))
    first, last = _span(created)
    if first is None or last is None:  # no creation: nothing to enrich
        first = last = newest
    if first <= newest and created.num_rows:  # a replay: the view may hold them
        return None
    if versions is not None and versions.num_rows:
        earliest, _ = _span(versions)
        if earliest is not None and earliest < newest:  # events to enrich again
            return None
    if not created.num_rows:
        return newest
    (key,) = referenced.key
    try:
        key_type = history.schema.field(key).type
        wanted = pc.cast(pc.unique(created.column(join.on).drop_null()), key_type)
        read = history.to_table(
            columns=[key, "_cdc_op", "_cdc_commit_lsn", "_cdc_lsn", *join.columns],
            filter=ds.field(key).isin(wanted) | (ds.field("_cdc_op") == TRUNCATE_OP),
        )
        if pc.any(pc.equal(read.column("_cdc_op"), TRUNCATE_OP)).as_py():
            return None  # a TRUNCATE ends versions early: Spark derives their ends
        refs = pc.cast(created.column(join.on), key_type)
        chosen = latest_at_or_before(
            read.column(key),
            read.column("_cdc_commit_lsn"),
            read.column("_cdc_lsn"),
            refs,
            created.column("_cdc_commit_lsn"),
            created.column("_cdc_lsn"),
        )
        # a delete's version carries nothing
        deleted = pc.fill_null(pc.equal(pc.take(read.column("_cdc_op"), chosen), "d"), False)
        taken = pc.if_else(deleted, pa.nulls(len(chosen), pa.int64()), chosen)
        columns = {c.name: created.column(c.name) for c in stream.columns}
        event_ts, commit_lsn, lsn = EVENT_COLUMNS
        columns[event_ts] = pc.cast(created.column("_cdc_commit_ms"), pa.int64()).cast(
            pa.timestamp("ms", tz="UTC")
        )
        columns[commit_lsn] = created.column("_cdc_commit_lsn")
        columns[lsn] = created.column("_cdc_lsn")
        for c in join.columns:
            columns[join.column_prefix + c] = pc.take(read.column(c), taken)
        schema = held.schema
        rows = pa.Table.from_arrays(
            [pc.cast(columns[f.name], f.type) for f in schema if f.name in columns],
            names=[f.name for f in schema if f.name in columns],
        )
    except (pa.ArrowException, ValueError, TypeError) as exc:
        log.info("stream-table join %s: enriched by Spark (%s)", join.name, exc)
        return None
    if not native.append(path, rows):
        return None
    return max(newest, last)


def latest_at_or_before(
    keys: Any, commits: Any, lsns: Any, refs: Any, at_commits: Any, at_lsns: Any
) -> pa.Array:
    """Per event (its referenced key `refs`, position `at_commits`, `at_lsns`): the
    index of the version (of `keys`, `commits`, `lsns`, in any order) of that key with
    the greatest position at or before the event's; NULL where there is none."""
    import numpy as np
    import pyarrow.compute as pc

    distinct = pc.unique(keys)
    version_code = pc.index_in(keys, value_set=distinct).to_numpy(zero_copy_only=False)
    event_code = pc.fill_null(pc.index_in(refs, value_set=distinct), -1)
    versions, events = len(version_code), len(refs)
    code = np.concatenate([version_code, event_code.to_numpy(zero_copy_only=False)])
    commit = np.concatenate([_ints(commits), _ints(at_commits)])
    lsn = np.concatenate([_ints(lsns), _ints(at_lsns)])
    # at one position the version sorts before the event: at or before
    kind = np.concatenate([np.zeros(versions, np.int8), np.ones(events, np.int8)])
    order = np.lexsort((kind, lsn, commit, code))
    # per place in that order, the place of the last version at or before it
    place = np.where(kind[order] == 0, np.arange(len(order)), -1)
    last = np.maximum.accumulate(place) if len(place) else place
    is_event = kind[order] == 1
    found = np.full(events, -1, np.int64)
    seen = last[is_event]
    found[order[is_event] - versions] = np.where(seen >= 0, order[np.maximum(seen, 0)], -1)
    # the last version before it in that order is of another key: none of its own
    valid = found >= 0
    valid[valid] = version_code[found[valid]] == code[versions:][valid]
    return pa.array(found, pa.int64(), mask=~valid)


def _ints(column: Any) -> Any:
    import numpy as np
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), np.int64)


def _span(positions: pa.Table) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The least and greatest position (_cdc_commit_lsn, _cdc_lsn) of the rows."""
    import pyarrow.compute as pc

    commits, lsns = positions.column("_cdc_commit_lsn"), positions.column("_cdc_lsn")

    def at(commit: Any, pick: Any) -> tuple[int, int] | None:
        if commit is None:
            return None
        return (commit, pick(lsns.filter(pc.equal(commits, commit))).as_py())

    return at(pc.min(commits).as_py(), pc.min), at(pc.max(commits).as_py(), pc.max)


def _newest_held(positions: pa.Table) -> tuple[int, int]:
    _, last = _span(positions)
    return last if last is not None else (0, 0)


def refresh_enrichment(
    spark: Any,
    root: str,
    join: StreamTableJoin,
    tables: dict[str, Table],
    created: DataFrame | None,
    versions: DataFrame | None,
    newest: tuple[int, int] | None,
    everything: bool = False,
    native: NativeWriter | None = None,
) -> tuple[int, int] | None:
    """Enrich the batch's creation events of the stream table (`created`: its columns,
    _cdc_commit_lsn, _cdc_lsn, _cdc_commit_ms), and again the view's events that a
    version of the batch's referenced rows precedes (`versions`: `_cdc_ref` the
    referenced key, _cdc_commit_lsn, _cdc_lsn; work columns are all `_cdc_…`, which no
    column may be named), when one is older than `newest`, the newest event position the view held
    before the batch (None: not known, read from the view); with `everything`, every
    event of the view again (after a TRUNCATE of the referenced table). Returns the
    newest event position the view holds now."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from cdc.stores.warehouse.tables import aligned_rows, ensure_delta, view_path

    stream, referenced = tables[join.table], tables[join.references]
    target = ensure_delta(
        spark, view_path(root, join.name), enrichment_fields(join, stream, referenced)
    )
    held = target.toDF()
    if newest is None:
        top = held.agg(F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
        newest = tuple(top["m"]) if top and top["m"] is not None else (0, 0)
    columns = [F.col(q(c.name)) for c in stream.columns]
    parts = []
    position = F.struct("_cdc_commit_lsn", "_cdc_lsn")
    span = (
        created.agg(F.min(position).alias("first"), F.max(position).alias("last")).first()
        if created is not None
        else None
    )
    if created is not None and span and span["first"] is not None:  # updates only: none
        parts.append(created.select(*columns, "_cdc_commit_lsn", "_cdc_lsn", "_cdc_commit_ms"))
    if everything:
        parts.append(_held_events(held, columns))
    elif versions is not None:
        first = versions.agg(F.min(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
        if first and first["m"] is not None and tuple(first["m"]) < newest:
            earliest = versions.groupBy("_cdc_ref").agg(
                F.min(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("_cdc_first")
            )
            event = F.struct(F.col("_cdc_commit_lsn"), F.col("_cdc_lsn"))
            parts.append(
                _held_events(
                    held.join(earliest, F.col(q(join.on)) == F.col("_cdc_ref")).where(
                        event > F.col("_cdc_first")
                    ),
                    columns,
                )
            )
    if not parts:
        return newest
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    if len(parts) == 1 and span and span["first"] is not None and tuple(span["first"]) > newest:
        # the steady state: every event of the batch is newer than the view's newest, so
        # none is in the view (a replayed batch's are not newer): a plain append
        path = view_path(root, join.name)
        rows = aligned_rows(target, _as_of(spark, root, join, stream, referenced, events))
        if native is None or not native.append(path, rows):
            rows.write.format("delta").mode("append").save(path)
        return max(newest, tuple(span["last"]))
    events = events.dropDuplicates([*stream.key, "_cdc_commit_lsn", "_cdc_lsn"]).localCheckpoint()
    enriched = _as_of(spark, root, join, stream, referenced, events)
    identity = " AND ".join(
        [f"v.{q(k)} <=> s.{q(k)}" for k in stream.key]
        + ["v._cdc_commit_lsn = s._cdc_commit_lsn", "v._cdc_lsn = s._cdc_lsn"]
    )
    if native is not None and not everything:  # every event: Spark's tasks stream them
        names = [join.column_prefix + c for c in join.columns]
        clauses: list[Any] = [
            ("update", None, {dq(c): f"s.{dq(c)}" for c in names}),
            ("insert", None, None),
        ]
        on = " AND ".join(
            [
                null_safe_match([(k, k) for k in stream.key]),
                "(t._cdc_commit_lsn = s._cdc_commit_lsn)",
                "(t._cdc_lsn = s._cdc_lsn)",
            ]
        )
        rows = aligned_rows(target, enriched)
        if native.merge(view_path(root, join.name), rows, on, clauses):
            return _newest_of(events, newest)
    carried: dict[str, Any] = {
        q(join.column_prefix + c): f"s.{q(join.column_prefix + c)}" for c in join.columns
    }
    retried(
        f"the MERGE into the view {join.name}",
        lambda: (
            DeltaTable.forPath(spark, view_path(root, join.name))
            .alias("v")
            .merge(enriched.alias("s"), identity)
            .whenMatchedUpdate(set=carried)
            .whenNotMatchedInsertAll()
            .execute()
        ),
    )
    return _newest_of(events, newest)


def _newest_of(events: DataFrame, newest: tuple[int, int]) -> tuple[int, int]:
    """The newest event position of `events` and `newest`."""
    from pyspark.sql import functions as F

    top = events.agg(F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("m")).first()
    if top and top["m"] is not None:
        return max(newest, tuple(top["m"]))
    return newest


def _held_events(held: DataFrame, columns: list[Any]) -> DataFrame:
    """The view's rows as events to enrich again."""
    from pyspark.sql import functions as F

    return held.select(
        *columns,
        "_cdc_commit_lsn",
        "_cdc_lsn",
        F.unix_millis("event_ts").alias("_cdc_commit_ms"),
    )


def _as_of(
    spark: Any,
    root: str,
    join: StreamTableJoin,
    stream: Table,
    referenced: Table,
    events: DataFrame,
) -> DataFrame:
    """Each event with the referenced row's columns as of its position (module doc)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from cdc.stores.warehouse.history import TRUNCATE_OP, derived_history
    from cdc.stores.warehouse.tables import history_path

    (key,) = referenced.key
    wanted = events.select(F.col(q(join.on)).alias("_cdc_ref")).distinct()
    by_position = Window.partitionBy(q(key)).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    written = spark.read.format("delta").load(history_path(root, referenced.qualified))
    # the wanted keys' versions and every TRUNCATE (which ends the versions before it)
    read = written.join(wanted, F.col(q(key)) == F.col("_cdc_ref"), "left_semi").unionByName(
        written.where(F.col("_cdc_op") == TRUNCATE_OP)
    )
    versions = (
        derived_history(spark, read, [key])
        # the next version's start: a valid_to that is not it is a TRUNCATE's
        .withColumn("_cdc_v_next", F.lead("valid_from").over(by_position))
        .select(
            F.col(q(key)).alias("_cdc_ref"),
            F.col("_cdc_commit_lsn").alias("_cdc_v_commit"),
            F.col("_cdc_lsn").alias("_cdc_v_lsn"),
            F.col("_cdc_op").alias("_cdc_v_op"),
            F.col("valid_to").alias("_cdc_v_to"),
            "_cdc_v_next",
            *[F.col(q(c)).alias(join.column_prefix + c) for c in join.columns],
        )
    )
    at_or_before = (F.col("_cdc_v_commit") < F.col("_cdc_commit_lsn")) | (
        (F.col("_cdc_v_commit") == F.col("_cdc_commit_lsn"))
        & (F.col("_cdc_v_lsn") <= F.col("_cdc_lsn"))
    )
    latest = Window.partitionBy(*[q(k) for k in stream.key], "_cdc_commit_lsn", "_cdc_lsn").orderBy(
        F.col("_cdc_v_commit").desc_nulls_last(), F.col("_cdc_v_lsn").desc_nulls_last()
    )
    event_ts = F.timestamp_millis("_cdc_commit_ms")
    live = (
        F.col("_cdc_v_op").isNotNull()
        & (F.col("_cdc_v_op") != "d")
        & (
            F.col("_cdc_v_to").isNull()
            | F.col("_cdc_v_to").eqNullSafe(F.col("_cdc_v_next"))
            | (F.col("_cdc_v_to") >= event_ts)
        )
    )
    return (
        events.join(versions, (F.col(q(join.on)) == F.col("_cdc_ref")) & at_or_before, "left")
        .withColumn("_cdc_rank", F.row_number().over(latest))
        .where("_cdc_rank = 1")
        .select(
            *[F.col(q(c.name)) for c in stream.columns],
            event_ts.alias("event_ts"),
            "_cdc_commit_lsn",
            "_cdc_lsn",
            *[
                F.when(live, F.col(q(join.column_prefix + c))).alias(join.column_prefix + c)
                for c in join.columns
            ],
        )
    )


@dataclass(frozen=True)
class Version:
    """A change of a referenced row: its position, op, after image and commit time."""

    at: Position
    op: str
    after: dict[str, Any] | None
    ms: int


@dataclass
class _Log:
    versions: dict[Any, list[Version]] = field(default_factory=dict)  # per key, by position
    truncates: list[tuple[Position, int]] = field(default_factory=list)


def enrich(
    versions: list[Version], truncates: list[tuple[Position, int]], at: Position, ms: int
) -> Version | None:
    """The change that gives an event at position `at`, committed at `ms`, its values:
    the latest of `versions` (of one key, in position order) at or before `at`; None when
    there is none, or it is a delete, or a TRUNCATE (position, commit time) after it ended
    it before `ms` (as the history caps a version's valid_to)."""
    earlier = [v for v in versions if v.at <= at]
    if not earlier:
        return None
    chosen = earlier[-1]
    later = [v for v in versions if v.at > chosen.at]
    following = later[0] if later else None
    ends = following.ms if following else None
    for cut, cut_ms in truncates:
        if chosen.at < cut and (following is None or cut < following.at):
            ends = cut_ms if ends is None else min(ends, cut_ms)
    if chosen.op == "d":
        return None
    if ends is None or (following is not None and ends == following.ms) or ends >= ms:
        return chosen
    return None


def _referenced_log(table: Table, records: list[ChangeRecord], cuts: list[ChangeRecord]) -> _Log:
    """The referenced table's changes per key in position order (each position once),
    and its TRUNCATEs (`cuts`: the log of every TRUNCATE)."""
    log = _Log()
    (key,) = table.key
    seen: set[tuple[Any, Position]] = set()
    for record in records:
        value = record.value
        if not value or record.key is None:
            continue
        at = event_position(value["op"], value.get("source") or {})
        name = decode_value(table.column(key), record.key.get(key))
        if at is None or (name, at) in seen:
            continue
        seen.add((name, at))
        version = Version(at, value["op"], value.get("after"), value["source"]["ts_ms"])
        log.versions.setdefault(name, []).append(version)
    for versions in log.versions.values():
        versions.sort(key=lambda v: v.at)
    for record in cuts:
        value = record.value
        if not value or value.get("op") not in ("c", "r"):
            continue
        if (value.get("after") or {}).get("table_name") != table.qualified:
            continue
        at = event_position(value["op"], value.get("source") or {})
        if at is not None:
            log.truncates.append((at, value["source"]["ts_ms"]))
    return log
