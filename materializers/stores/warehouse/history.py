"""The warehouse's history (SCD type 2): every change of a batch becomes one version of
its key, once, in `<warehouse>/<prefix>/<schema>/<table>/history`."""

from __future__ import annotations

from typing import Any

from cdc.catalog import Table
from materializers.typed import quoted as q

__all__ = ["write_history"]


def write_history(
    table: Table, decoded: Any, placeholders: set[str], stored: Any, history: Any
) -> None:
    """Every change of the batch becomes a version (SCD type 2), once.

    A version is identified by its key and its position in the source (commit LSN,
    change LSN), never by its Kafka offset: a change Debezium delivered twice (at
    another offset) is one version, in the batch and against the table. valid_from
    is the commit time; valid_to is the next version's valid_from in position order
    (NULL for the newest), capped by the TRUNCATE that ended the version. A delete is
    a version with _cdc_op 'd' and no values (a tombstone is not a version). An
    unchanged TOASTed value is taken from the key's previous version in the batch,
    else from `stored`: the current state as it was before the batch's MERGEs began
    (read once, so the history does not depend on which MERGE commits first).

    valid_to is derived again for every version of the keys the batch touches, its
    stored versions and its new ones together, so a batch that holds changes already
    stored (Debezium's redelivery after a crash), new ones, or one older than a
    stored version still leaves each key one chain: one open version, each version
    ending where the next begins. A stored valid_to only ever shortens (a TRUNCATE's
    cut stays). One MERGE writes the new versions and the changed ends; a replayed
    batch finds nothing to change.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # tombstones carry no envelope; a change delivered twice is one version
    versions = decoded.where("commit_lsn IS NOT NULL").dropDuplicates(["key", "commit_lsn", "lsn"])
    if placeholders:
        on = [F.col(q(f"k_{k}")).eqNullSafe(F.col(q(f"cur_{k}"))) for k in table.key]
        versions = versions.join(stored, on, "left")
    columns = []
    for column in table.columns:
        c = column.name
        if c in table.key:
            columns.append(F.col(q(f"k_{c}")).alias(c))
            continue
        value = F.col(q(c))
        if f"__ph_{c}" in placeholders:
            known = F.coalesce(F.col(q(f"__carried_{c}") + ".known"), F.lit(False))
            value = (
                F.when(~F.col(q(f"__ph_{c}")), value)
                .when(known, F.col(q(f"__carried_{c}") + ".v"))
                .otherwise(F.col(q(f"cur_{c}")))
            )
        columns.append(F.when(F.col("op") == "d", None).otherwise(value).alias(c))
    rows = versions.select(
        *columns,
        F.col("op").alias("_cdc_op"),
        F.col("offset").alias("_cdc_offset"),
        F.col("partition").alias("_cdc_partition"),
        F.col("commit_lsn").alias("_cdc_commit_lsn"),
        F.col("lsn").alias("_cdc_lsn"),
        F.timestamp_millis("commit_ms").alias("valid_from"),
        # a version from before its table's TRUNCATE ends there at the latest
        F.timestamp_millis("cut_ms").alias("_cap"),
        F.lit(True).alias("_new"),
    )
    keys = [q(k) for k in table.key]
    chain = ["_cdc_commit_lsn", "_cdc_lsn", "valid_from", "valid_to"]
    # the stored versions of the touched keys, their valid_to the most they may end
    known = (
        history.toDF()
        .select(*keys, *chain)
        .join(rows.select(*keys).distinct(), list(table.key), "left_semi")
        .withColumnRenamed("valid_to", "_cap")
        .withColumn("_new", F.lit(False))
    )
    values = [c for c in rows.columns if c not in (*table.key, *chain, "_cap", "_new")]
    for c in values:
        known = known.withColumn(c, F.lit(None).cast(rows.schema[c].dataType))
    # a position both stored and in the batch is the stored version
    position = Window.partitionBy(*keys, "_cdc_commit_lsn", "_cdc_lsn").orderBy("_new")
    following = Window.partitionBy(*keys).orderBy("_cdc_commit_lsn", "_cdc_lsn")
    derived = (
        known.unionByName(rows)
        .withColumn("_n", F.row_number().over(position))
        .where("_n = 1")
        .withColumn("valid_to", F.least(F.lead("valid_from").over(following), F.col("_cap")))
        .where("_new OR NOT (_cap <=> valid_to)")  # inserted, or ending sooner
        .drop("_n", "_cap")
    )
    same = " AND ".join(
        [f"h.{k} <=> s.{k}" for k in keys]
        + [f"h.{c} <=> s.{c}" for c in ("_cdc_commit_lsn", "_cdc_lsn")]
    )
    (
        history.alias("h")
        .merge(derived.alias("s"), same)
        .whenMatchedUpdate(condition="NOT s._new", set={"valid_to": "s.valid_to"})
        .whenNotMatchedInsert(
            condition="s._new",
            values={q(c): f"s.{q(c)}" for c in derived.columns if c != "_new"},
        )
        .execute()
    )
