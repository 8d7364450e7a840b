"""The streaming queries that keep the streaming views: views that write in one output
mode, read the same tables and have one watermark share one query (`view_queries`),
so that each trigger is planned, scheduled and checkpointed once for all of them,
where a query per view did each of these per view (each view still reads the log
with its own readers, in the same offsets).

- Window aggregates written as they fill (tumbling, hopping) share one aggregation:
  each view's (creation, window) pairs, each deduplicated by its own step, are counted
  together, grouped by view and window (Spark allows one aggregation in update mode).
- The views written once the watermark has passed (sliding and session windows,
  stream-stream joins) keep their own steps, side by side in one query: their rows are
  one stream, each row tagged with its view (Spark allows several stateful steps in
  append mode).

Each micro-batch is split by view and each part written as that view's own query
would write it (`Branch.write`), so a view's table and its checks are the same either
way. A query has one watermark (the least of its readers', each reading the same
events): the same as each view's own, since they share it by construction. A view
alone keeps its own query, named and checkpointed as before. Another set of views
sharing a query is another definition: the query starts afresh, every view of it
computed again from the log's start.

Late events are counted per view: each stateful step's report (its events dropped by
the watermark) is the view's whose part of the plan holds it, in the order Spark
reports them (the plan's steps depth first, the views' parts in order).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from functools import reduce
from typing import TYPE_CHECKING, Any

from cdc.core.catalog import Table
from cdc.core.settings import Settings
from cdc.log.checkpoints import Checkpoint
from cdc.stores.warehouse.views.base import StreamingView
from cdc.types.spark_types import quoted as q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ViewQuery", "stateful_steps", "view_queries"]

# the shape of a shared query's plan: a checkpoint written for another cannot be read
SHARED_PLAN = 1
# a stateful step of a streaming plan, as Spark's logical plan names it (each is one
# stateful operator of the physical plan, reported once in a progress report)
_STATEFUL = {"Aggregate", "Deduplicate", "DeduplicateWithinWatermark", "Join"}


class ViewQuery:
    """One streaming query and the views it keeps (one or more)."""

    def __init__(self, members: list[StreamingView]) -> None:
        self.members = members
        # per member, which of the query's stateful steps (as its progress reports list
        # them) are its own; known once the query is made
        self.steps: list[slice] = [slice(None)] if len(members) == 1 else []

    @property
    def label(self) -> str:
        """Its checkpoint folder's name (and scheduler pool): a view alone keeps its own."""
        return self.members[0].checkpoint_label

    def name(self, settings: Settings) -> str:
        """The streaming query's name."""
        if len(self.members) == 1:
            return self.members[0].query_name(settings)
        return f"cdc-{settings.pipeline.name}-{self.label}"

    def definition(self) -> str:
        """What its checkpoint was written for: another starts it afresh."""
        if len(self.members) == 1:
            return self.members[0].definition()
        return json.dumps([m.definition() for m in self.members]) + f" shared {SHARED_PLAN}"

    def query(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> Any:
        """The streaming query, ready for a trigger and start()."""
        if len(self.members) == 1:
            return self.members[0].query(spark, settings, tables, checkpoint)
        if self.members[0].mode == "update":
            frame, writes = self._counted_together(spark, settings, tables, checkpoint)
        else:
            frame, writes = self._side_by_side(spark, settings, tables, checkpoint)

        def write(batch: DataFrame, batch_id: int) -> None:
            from pyspark.sql import functions as F

            batch = batch.persist()  # each view's part read from it, computed once
            try:
                for index, (columns, write_part) in enumerate(writes):
                    part = batch.where(F.col("__view") == index)
                    write_part(part.select(*columns), batch_id)
            finally:
                batch.unpersist()

        return (
            frame.writeStream.queryName(self.name(settings))
            .outputMode(self.members[0].mode)
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(write)
        )

    def _side_by_side(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> tuple[DataFrame, list[tuple[list[Any], Any]]]:
        """Each view's steps, their rows one stream: view i's columns as `__v<i>_<j>`,
        NULL in the other views' rows."""
        from pyspark.sql import functions as F

        branches = [m.branch(spark, settings, tables, checkpoint) for m in self.members]
        fields = [list(b.frame.schema.fields) for b in branches]
        parts = []
        for index, branch in enumerate(branches):
            columns = [F.lit(index).alias("__view")]
            for other, its in enumerate(fields):
                for j, field in enumerate(its):
                    name = f"__v{other}_{j}"
                    value = branch.frame[q(field.name)] if other == index else F.lit(None)
                    columns.append(value.cast(field.dataType).alias(name))
            parts.append(branch.frame.select(*columns))
        counts = [0]
        for branch in branches:
            counts.append(counts[-1] + stateful_steps(branch.frame))
        self.steps = [slice(a, b) for a, b in itertools.pairwise(counts)]
        writes = [
            ([F.col(f"__v{i}_{j}").alias(f.name) for j, f in enumerate(its)], b.write)
            for i, (its, b) in enumerate(zip(fields, branches, strict=True))
        ]
        return reduce(lambda a, b: a.unionByName(b), parts), writes

    def _counted_together(
        self, spark: Any, settings: Settings, tables: dict[str, Table], checkpoint: Checkpoint
    ) -> tuple[DataFrame, list[tuple[list[Any], Any]]]:
        """Window aggregates written as they fill: each view's (creation, window) pairs,
        then one aggregation by view and window, a total per view (`__total_<i>`, of
        its sum's type)."""
        from pyspark.sql import functions as F

        from cdc.stores.warehouse.views.windows import FillingWindowView

        members = [m for m in self.members if isinstance(m, FillingWindowView)]
        made = [m.parts(spark, settings, tables, checkpoint) for m in members]
        types = [amount_type for _, _, amount_type, _ in made]
        parts = []
        for index, (member, (created, _, _, _)) in enumerate(zip(members, made, strict=True)):
            amounts = [
                (F.col("__amount") if other == index else F.lit(None)).cast(t).alias(f"__a{other}")
                for other, t in enumerate(types)
            ]
            pairs = member.paired(created)
            parts.append(pairs.select(F.lit(index).alias("__view"), "window", *amounts))
        # the aggregation is reported first, then each view's pairs
        self.steps = [slice(1 + i, 2 + i) for i in range(len(members))]
        counted = (
            reduce(lambda a, b: a.unionByName(b), parts)
            .groupBy("__view", "window")
            .agg(
                F.count("*").alias("rows"),
                *[F.sum(f"__a{i}").alias(f"__total{i}") for i in range(len(members))],
            )
        )
        writes = [
            (
                [
                    F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"),
                    "rows",
                    F.col(f"__total{i}").alias("total"),
                ],
                write,
            )
            for i, (_, _, _, write) in enumerate(made)
        ]
        return counted, writes


def view_queries(views: list[StreamingView], share: bool = True) -> list[ViewQuery]:
    """The streaming views in their queries: with `share`, those of equal `shares()` in
    one, in the order of their first view; else each alone. A shared query's checkpoint
    is named by its views (`views-<name>+<name>...`, or a digest of them when that is
    too long), and each view's `checkpoint_label` is that name."""
    groups: dict[Any, list[StreamingView]] = {}
    for view in views:
        groups.setdefault(view.shares() if share else view.name, []).append(view)
    out = []
    for members in groups.values():
        if len(members) > 1:
            names = "+".join(m.name for m in members)
            if len(names) > 120:
                names = hashlib.sha256(names.encode()).hexdigest()[:16]
            for member in members:
                member.shared_label = f"views-{names}"
        out.append(ViewQuery(members))
    return out


def stateful_steps(frame: Any) -> int:
    """How many stateful steps a streaming frame's plan has (aggregations,
    deduplications, joins of two streams): the operators its query reports state of."""
    plan = frame._jdf.queryExecution().analyzed().treeString()
    steps = 0
    for line in plan.splitlines():
        node = line.lstrip(" :+-|~").split(" ", 1)[0]
        steps += node in _STATEFUL
    return steps
