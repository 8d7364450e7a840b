"""The warehouse's history (SCD type 2): every change of a batch becomes one version of
its key, once, in `<warehouse>/<prefix>/<schema>/<table>/history`.

The table is partitioned by `_cdc_newest`: each key's newest version (open, or ended by
a TRUNCATE) sits in the `true` partition, every older version in the `false` one. A batch
of changes newer than their keys' newest versions (the steady case) reads and rewrites
only the newest partition, whose size is the number of keys, never the history's; the
older versions are only ever appended to.
"""

from __future__ import annotations

from typing import Any

from cdc.catalog import Table
from materializers.log.typed import quoted as q
from materializers.stores.warehouse.tables import append_rows

__all__ = ["NEWEST", "partition_history", "write_history"]

NEWEST = "_cdc_newest"  # the partition column: the key's newest version


def write_history(
    table: Table, decoded: Any, placeholders: set[str], stored: Any, history: Any, empty: bool
) -> None:
    """Every change of the batch becomes a version (SCD type 2), once.

    A version is identified by its key and its position in the source (commit LSN,
    change LSN), never by its Kafka offset: a change Debezium delivered twice (at
    another offset) is one version, in the batch and against the table. valid_from
    is the commit time, no later than the next version's (a backfill's read, see
    _merge); valid_to is the next version's valid_from in position order (NULL for
    the newest), capped by the TRUNCATE that ended the version. A delete is a version
    with _cdc_op 'd' and no values (a tombstone is not a version). An unchanged
    TOASTed value is taken from the key's previous version in the batch, else from
    `stored`: the current state as it was before the batch's MERGEs began (read once,
    so the history does not depend on which MERGE commits first; None when the current
    state holds no row).

    valid_to is derived again for the stored versions of the keys the batch touches
    and its new ones together, so a batch that holds changes already stored
    (Debezium's redelivery after a crash), new ones, or one older than a stored version
    still leaves each key one chain: one open version, each version ending where the
    next begins. A stored valid_to only ever shortens (a TRUNCATE's cut stays). One
    MERGE writes the new versions and the changed ends; a replayed batch finds nothing
    to change.

    When every change of the batch sits at or after its key's newest stored version,
    and none committed before that version's time, only those newest versions can
    change: they are all the stored versions read, and
    the MERGE is confined to the newest partition. Otherwise (a change older than a
    stored one: a redelivery, a backfill row) every stored version of the touched keys
    takes part. Into an `empty` history (a first load, or after a reset) the versions
    are appended, with nothing stored to read or match.
    """
    from pyspark.sql import functions as F

    # tombstones carry no envelope; a change delivered twice is one version
    versions = decoded.where("_cdc_commit_lsn IS NOT NULL").dropDuplicates(
        ["_cdc_key", "_cdc_commit_lsn", "_cdc_lsn"]
    )
    if placeholders and stored is not None:
        on = [F.col(q(f"_cdc_k_{k}")).eqNullSafe(F.col(q(f"_cdc_cur_{k}"))) for k in table.key]
        versions = versions.join(stored, on, "left")
    columns = []
    for column in table.columns:
        c = column.name
        if c in table.key:
            columns.append(F.col(q(f"_cdc_k_{c}")).alias(c))
            continue
        value = F.col(q(c))
        if f"__ph_{c}" in placeholders:
            known = F.coalesce(F.col(q(f"__carried_{c}") + ".known"), F.lit(False))
            # the stored row's value: its own, unless a delete removed it (an event from
            # before a TRUNCATE, cut_ms set, still had the value the TRUNCATE removed)
            held = F.when(
                ~F.col("_cdc_cur_deleted") | F.col("_cdc_cut_ms").isNotNull(),
                F.col(q(f"_cdc_cur_{c}")),
            )
            value = (
                F.when(~F.col(q(f"__ph_{c}")), value)
                .when(known, F.col(q(f"__carried_{c}") + ".v"))
                .otherwise(held if stored is not None else F.lit(None))
            )
        columns.append(F.when(F.col("_cdc_op") == "d", None).otherwise(value).alias(c))
    rows = versions.select(
        *columns,
        "_cdc_op",
        "_cdc_offset",
        "_cdc_partition",
        "_cdc_commit_lsn",
        "_cdc_lsn",
        F.timestamp_millis("_cdc_commit_ms").alias("valid_from"),
        # a version from before its table's TRUNCATE ends there at the latest
        F.timestamp_millis("_cdc_cut_ms").alias("_cdc_cap"),
        F.lit(True).alias("_cdc_new"),
    )
    keys = [q(k) for k in table.key]
    chain = ["_cdc_commit_lsn", "_cdc_lsn", "valid_from", "valid_to", NEWEST]
    if empty:
        _merge(table, rows, None, history, confined=False)
        return
    # each touched key's first position and earliest time in the batch
    first = rows.groupBy(*keys).agg(
        F.min(F.struct("_cdc_commit_lsn", "_cdc_lsn")).alias("_cdc_first"),
        F.min("valid_from").alias("_cdc_earliest"),
    )
    newest = (
        history.toDF()
        .where(NEWEST)
        .select(*keys, *chain)
        .join(first, list(table.key))
        # the batch holds a change from before the key's newest stored version, or one
        # committed before that version's time (a backfill's read stamped late): the
        # versions before it may end elsewhere
        .withColumn(
            "_cdc_late",
            (F.col("_cdc_first") < F.struct("_cdc_commit_lsn", "_cdc_lsn"))
            | (F.col("_cdc_earliest") < F.col("valid_from")),
        )
        .localCheckpoint()  # read once: for the check below and for the chain
    )
    late = newest.where("_cdc_late").limit(1).count()
    known = newest.drop("_cdc_first", "_cdc_earliest", "_cdc_late")
    if late:  # every stored version of the touched keys
        touched = first.select(*keys)
        known = history.toDF().select(*keys, *chain).join(touched, list(table.key), "left_semi")
    _merge(table, rows, known, history, confined=not late)


def _merge(table: Table, rows: Any, known: Any, history: Any, confined: bool) -> None:
    """Derive the chains of the touched keys from their `known` stored versions and the
    batch's `rows`; write the new versions and the stored ones whose end or newest flag
    changed (`confined`: all of them in the newest partition). `known` None: nothing is
    stored, and the new versions are appended."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = [q(k) for k in table.key]
    rows = rows.withColumn("_cdc_was", F.lit(None).cast("boolean"))
    rows = rows.withColumn("_cdc_from", F.lit(None).cast("timestamp"))
    if known is not None:
        # new attributes: the target's own, kept by the checkpoint, would confuse the MERGE
        renamed = {"valid_to": "_cdc_cap", NEWEST: "_cdc_was"}
        known = known.select(
            *[F.col(q(c)).alias(renamed.get(c, c)) for c in known.columns],
            F.col("valid_from").alias("_cdc_from"),
        )
        known = known.withColumn("_cdc_new", F.lit(False))
        for c in rows.columns:
            if c not in known.columns:
                known = known.withColumn(c, F.lit(None).cast(rows.schema[c].dataType))
        rows = known.unionByName(rows)
    # a position both stored and in the batch is the stored version
    position = Window.partitionBy(*keys, "_cdc_commit_lsn", "_cdc_lsn").orderBy("_cdc_new")
    following = Window.partitionBy(*keys).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    onwards = following.rowsBetween(0, Window.unboundedFollowing)
    derived = (
        rows.withColumn("_cdc_n", F.row_number().over(position))
        .where("_cdc_n = 1")
        # A version's time follows its position: it begins no later than any version
        # after it (nor than the TRUNCATE that ends it). A read (a backfill's row) is
        # stamped when Debezium read it, yet placed at the commit it had last seen: a
        # change placed after it may have committed before that stamp.
        .withColumn("valid_from", F.least(F.min("valid_from").over(onwards), F.col("_cdc_cap")))
        .withColumn("valid_to", F.least(F.lead("valid_from").over(following), F.col("_cdc_cap")))
        .withColumn(NEWEST, F.lead(F.lit(True)).over(following).isNull())
        # inserted, or beginning or ending sooner, or no longer the newest
        .where(
            f"_cdc_new OR NOT (_cdc_cap <=> valid_to) OR NOT (_cdc_was <=> {NEWEST}) "
            "OR NOT (_cdc_from <=> valid_from)"
        )
        .drop("_cdc_n", "_cdc_cap", "_cdc_was", "_cdc_from")
    )
    if known is None:
        append_rows(history, derived.drop("_cdc_new"))
        return
    same = " AND ".join(
        [f"h.{k} <=> s.{k}" for k in keys]
        + [f"h.{c} <=> s.{c}" for c in ("_cdc_commit_lsn", "_cdc_lsn")]
    )
    if confined:  # Delta reads and rewrites the newest partition's files only
        same = f"h.{NEWEST} = true AND {same}"
    (
        history.alias("h")
        .merge(derived.alias("s"), same)
        .whenMatchedUpdate(
            condition="NOT s._cdc_new",
            set={"valid_from": "s.valid_from", "valid_to": "s.valid_to", NEWEST: f"s.{NEWEST}"},
        )
        .whenNotMatchedInsert(
            condition="s._cdc_new",
            values={q(c): f"s.{q(c)}" for c in derived.columns if c != "_cdc_new"},
        )
        .execute()
    )


def partition_history(spark: Any, table: Table, path: str, history: Any) -> Any:
    """The history at `path`, partitioned by NEWEST: a history written before the
    partition existed is rewritten once (a Delta version of its own), each key's newest
    version marked."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if NEWEST in history.detail().first()["partitionColumns"]:
        return history
    keys = [q(k) for k in table.key]
    following = Window.partitionBy(*keys).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    (
        history.toDF()
        .withColumn(NEWEST, F.lead(F.lit(True)).over(following).isNull())
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(NEWEST)
        .save(path)
    )
    return DeltaTable.forPath(spark, path)
