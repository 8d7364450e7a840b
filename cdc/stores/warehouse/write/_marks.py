"""Which of a batch's changes are new to a table of the warehouse, mostly without reading
the table back.

The history takes each change once. It knows, per Kafka partition, the newest position
and the last offset it took (`Marks`, read from the history once a process): a change
after both is new, and a batch all of whose changes are (the steady case) is written
without a read of either Delta table. A change at or before them (a batch run again
after a crash, Debezium's redelivery after a restart) is judged against its key's
newest version in the history (`newest_held`, `held_since`): the history takes it only
if newer, the current state also at the same position (a crash between the two writes
leaves the history ahead). The history keeps a deleted key's delete, so a change from
before it brings no row back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc.core.catalog import Table
from cdc.stores.warehouse.history import TRUNCATE_OP
from cdc.types.spark_types import flagged
from cdc.types.spark_types import quoted as q

__all__ = [
    "Marks",
    "held_since",
    "holds_any",
    "lowest_commit",
    "newest_held",
    "stored_values",
    "summarize",
]


@dataclass
class Marks:
    """What a table's history holds of each Kafka partition: the newest position and the
    last offset of a change it took from it. A change from after both is new to the table
    (the Kafka offset tells a batch replayed after a crash; the position tells Debezium's
    redelivery, at a new offset, of a change it sent before). Snapshot and backfill rows
    share positions: one at the newest position but a newer offset is new too."""

    partitions: dict[int, tuple[tuple[int, int], int]] = field(default_factory=dict)

    @classmethod
    def read(cls, history: Any) -> Marks:
        """What the history (a DeltaTable) holds of each partition: one aggregation."""
        from pyspark.sql import functions as F

        marks = cls()
        for row in (
            history.toDF()
            .where(F.col("_cdc_op") != TRUNCATE_OP)
            .groupBy("_cdc_partition")
            .agg(
                F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("newest"),
                F.max("_cdc_offset").alias("offset"),
            )
            .collect()
        ):
            newest = (int(row["newest"][0]), int(row["newest"][1]))
            marks.partitions[int(row["_cdc_partition"])] = (newest, int(row["offset"]))
        return marks

    @classmethod
    def read_arrow(cls, batches: Any) -> Marks:
        """`read`, over the history's record batches (Arrow: its `_cdc_partition`,
        `_cdc_commit_lsn`, `_cdc_lsn`, `_cdc_offset` and `_cdc_op`), a batch at a time."""
        import pyarrow as pa
        import pyarrow.compute as pc

        marks = cls()
        for batch in batches:
            rows = pa.Table.from_batches([batch]).filter(
                pc.not_equal(batch.column("_cdc_op"), TRUNCATE_OP)
            )
            found = rows.group_by("_cdc_partition").aggregate(
                [("_cdc_offset", "max"), ("_cdc_commit_lsn", "max")]
            )
            for row in found.to_pylist():
                partition, commit = int(row["_cdc_partition"]), int(row["_cdc_commit_lsn_max"])
                at_commit = rows.filter(
                    pc.and_(
                        pc.equal(rows.column("_cdc_partition"), partition),
                        pc.equal(rows.column("_cdc_commit_lsn"), commit),
                    )
                )
                lsn = pc.max(pc.fill_null(at_commit.column("_cdc_lsn"), 0)).as_py() or 0
                newest, offset = (commit, int(lsn)), int(row["_cdc_offset_max"])
                if partition in marks.partitions:
                    held, held_offset = marks.partitions[partition]
                    newest, offset = max(newest, held), max(offset, held_offset)
                marks.partitions[partition] = (newest, offset)
        return marks

    def new(self, summary: list[Any]) -> bool:
        """Whether every change of a batch summarised per partition (`summarize`) is new."""
        for part in summary:
            held = self.partitions.get(part["partition"])
            if held is None or part["first_offset"] is None:
                continue
            (position, offset) = held
            if part["first_offset"] <= offset:
                return False
            changed, read = part["first_changed"], part["first_read"]
            if changed is not None and tuple(changed) <= position:
                return False
            if read is not None and tuple(read) < position:
                return False
        return True

    def add(self, summary: list[Any]) -> None:
        """Take in the batch's changes (once its versions are in the history)."""
        for part in summary:
            if part["last_offset"] is None:
                continue
            newest: tuple[tuple[int, int], int] = (
                (int(part["newest"][0]), int(part["newest"][1])),
                int(part["last_offset"]),
            )
            held = self.partitions.get(part["partition"])
            if held is not None:
                newest = (max(held[0], newest[0]), max(held[1], newest[1]))
            self.partitions[part["partition"]] = newest


def summarize(decoded: Any) -> list[Any]:
    """Per Kafka partition of a table's batch, in one small job: the first and last
    offset of its changes, the lowest position of a change other than a read and of a
    read, the newest position, how many events are neither inserts nor reads (other
    ops, and tombstones), and how many came before a TRUNCATE (`cut`)."""
    from pyspark.sql import functions as F

    change = F.col("_cdc_commit_lsn").isNotNull()
    position = F.struct("_cdc_commit_lsn", "_cdc_lsn")
    return (
        decoded.groupBy(F.col("_cdc_partition").alias("partition"))
        .agg(
            F.min(F.when(change, F.col("_cdc_offset"))).alias("first_offset"),
            F.max(F.when(change, F.col("_cdc_offset"))).alias("last_offset"),
            F.min(F.when(change & (F.col("_cdc_op") != "r"), position)).alias("first_changed"),
            F.min(F.when(change & (F.col("_cdc_op") == "r"), position)).alias("first_read"),
            F.max(F.when(change, position)).alias("newest"),
            F.count(F.when(~change | ~F.col("_cdc_op").isin("c", "r"), 1)).alias("others"),
            F.count("_cdc_cut_ms").alias("cut"),
        )
        .collect()
    )


def stored_values(
    table: Table, target: Any, history: Any, decoded: Any, placeholders: set[str], cut: bool
) -> Any:
    """What the batch's keys hold of the columns a TOAST placeholder leaves out (as
    `_cdc_cur_<column>`), read before anything of the batch is written: the current
    state's row; with `cut` (changes from before a TRUNCATE, which took the row out of
    the current state), for a key without one, its newest version in the history."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = decoded.select(*[F.col(q(f"_cdc_k_{k}")) for k in table.key]).distinct()
    columns = [flagged(f) for f in placeholders]

    def held(frame: Any) -> Any:
        return frame.select(
            *[F.col(q(k)).alias(f"_cdc_cur_{k}") for k in table.key],
            *[F.col(q(c)).alias(f"_cdc_cur_{c}") for c in columns],
        ).join(
            keys,
            [F.col(q(f"_cdc_cur_{k}")).eqNullSafe(F.col(q(f"_cdc_k_{k}"))) for k in table.key],
            "left_semi",
        )

    stored = held(target.toDF())
    if cut:
        newest = Window.partitionBy(*[q(k) for k in table.key]).orderBy(
            F.col("_cdc_commit_lsn").desc(), F.col("_cdc_lsn").desc()
        )
        versions = held(
            history.toDF()
            .where(F.col("_cdc_op") != TRUNCATE_OP)
            .withColumn("_cdc_n", F.row_number().over(newest))
            .where("_cdc_n = 1 AND _cdc_op <> 'd'")
        )
        on = [F.col(q(f"_cdc_cur_{k}")).eqNullSafe(F.col(q(f"_cdc_h_{k}"))) for k in table.key]
        live = stored.select(*[F.col(q(f"_cdc_cur_{k}")).alias(f"_cdc_h_{k}") for k in table.key])
        stored = stored.unionByName(versions.join(live, on, "left_anti"))
    return stored.localCheckpoint()


def lowest_commit(summary: list[Any]) -> int:
    """The lowest commit LSN of the batch's changes."""
    found = [
        part[which][0]
        for part in summary
        for which in ("first_changed", "first_read")
        if part[which] is not None
    ]
    return int(min(found, default=0))


def newest_held(table: Table, history: Any, changes: Any, lowest: int) -> Any:
    """The batch's changes, each with its key's newest position in the history
    (`_cdc_held_commit`, `_cdc_held_lsn`; NULL when it holds none at or after the
    batch's `lowest` commit LSN, which tells nothing here). The history is appended in
    position order, so Delta skips its files from before: the read costs the gap the
    batch goes back over, not the history."""
    from pyspark.sql import functions as F

    keys = changes.select(*[F.col(q(f"_cdc_k_{k}")).alias(f"_cdc_w_{k}") for k in table.key])
    held = (
        history.toDF()
        .where((F.col("_cdc_op") != TRUNCATE_OP) & (F.col("_cdc_commit_lsn") >= lowest))
        .join(keys.distinct(), same_key(table, "_cdc_w_"), "left_semi")
        .groupBy(*[F.col(q(k)).alias(f"_cdc_h_{k}") for k in table.key])
        .agg(F.max(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("_cdc_held"))
        .select(
            *[f"_cdc_h_{k}" for k in table.key],
            F.col("_cdc_held._cdc_commit_lsn").alias("_cdc_held_commit"),
            F.col("_cdc_held._cdc_lsn").alias("_cdc_held_lsn"),
        )
    )
    on = [F.col(q(f"_cdc_k_{k}")).eqNullSafe(F.col(q(f"_cdc_h_{k}"))) for k in table.key]
    return (
        changes.join(held, on, "left").drop(*[f"_cdc_h_{k}" for k in table.key]).localCheckpoint()
    )


def held_since(inclusive: bool) -> Any:
    """The change sits before its key's newest position in the history (`inclusive`: or
    at it). Before it: older than what the store took, refused; at it: the same change,
    which the history holds, and which the current state takes again (a crash may have
    stopped its write there)."""
    from pyspark.sql import functions as F

    commit, lsn = F.col("_cdc_commit_lsn"), F.col("_cdc_lsn")
    held_commit, held_lsn = F.col("_cdc_held_commit"), F.col("_cdc_held_lsn")
    same = (lsn <= held_lsn) if inclusive else (lsn < held_lsn)
    return F.coalesce((commit < held_commit) | ((commit == held_commit) & same), F.lit(False))


def holds_any(table: Table, target: Any, changes: Any) -> bool:
    """Whether the current state holds a key of the batch's changes (one small job)."""
    from pyspark.sql import functions as F

    keys = changes.select(*[F.col(q(f"_cdc_k_{k}")).alias(f"_cdc_w_{k}") for k in table.key])
    held = target.toDF().select(*[q(k) for k in table.key])
    return bool(held.join(keys, same_key(table, "_cdc_w_"), "left_semi").limit(1).count())


def same_key(table: Table, prefix: str) -> Any:
    """A join's condition: the row's key equals the other side's (its columns named
    `<prefix><column>`), NULL equal to NULL (a key column may hold NULL:
    pipeline.key_columns; a USING join on the names would never match it)."""
    from pyspark.sql import functions as F

    condition = F.lit(True)
    for k in table.key:
        condition = condition & F.col(q(k)).eqNullSafe(F.col(q(prefix + k)))
    return condition
