"""Change events in a micro-batch, parsed from the Kafka records by Spark (the warehouse and
the window aggregates; the Python stores parse theirs in cdc/apply/writer.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ENVELOPE_DDL", "parse_events"]

# The envelope fields the stores need; `after` stays JSON text, decoded per table.
ENVELOPE_DDL = (
    "op STRING, after STRING, ts_ms BIGINT, "
    "source STRUCT<ts_ms: BIGINT, lsn: BIGINT, sequence: STRING, snapshot: STRING, "
    "`schema`: STRING, `table`: STRING>"
)


def parse_events(records: DataFrame, topic_tables: dict[str, str]) -> DataFrame:
    """Kafka records -> one row per change event.

    Columns: table, topic, partition, offset, key (the key's JSON text), op (c, u, d, r,
    t; "d" for a tombstone), after (JSON text, null for deletes), commit_ms, the position
    (commit_lsn, lsn) as cdc/log/position.py defines it (null for a tombstone), and
    `error` for a value that is not a Debezium envelope.
    """
    from pyspark.sql import functions as F

    mapping = F.create_map(
        *[x for t, name in topic_tables.items() for x in (F.lit(t), F.lit(name))]
    )
    value = F.col("value").cast("string")
    envelope = F.from_json(value, ENVELOPE_DDL, {"mode": "PERMISSIVE"})
    return (
        records.select(
            mapping[F.col("topic")].alias("table"),
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            value.alias("value"),
            envelope.alias("e"),
        )
        .withColumn("seq", F.from_json(F.col("e.source.sequence"), "array<string>"))
        .withColumn("seq0", F.col("seq")[0].cast("long"))
        # a backfill (incremental snapshot) row has no source.lsn, only its sequence
        .withColumn("lsn", F.coalesce(F.col("e.source.lsn"), F.col("seq")[1].cast("long")))
        .select(
            "table",
            "topic",
            "partition",
            "offset",
            "key",
            F.when(F.col("value").isNull(), F.lit("d")).otherwise(F.col("e.op")).alias("op"),
            F.col("e.after").alias("after"),
            F.col("e.source.ts_ms").alias("commit_ms"),
            F.when(F.col("seq0").isNotNull(), F.col("seq0"))
            .otherwise(F.col("lsn"))
            .alias("commit_lsn"),
            # an initial snapshot row, and a backfill row: before their commit's stream
            F.when(F.col("seq0").isNull() & (F.col("e.op") == "r") & F.col("lsn").isNotNull(), 0)
            .when((F.col("e.op") == "r") & (F.col("e.source.snapshot") == "incremental"), 0)
            .otherwise(F.col("lsn"))
            .alias("lsn"),
            F.when(
                F.col("value").isNotNull() & (F.col("e.op").isNull() | F.col("lsn").isNull()),
                F.lit("not a change event"),
            ).alias("error"),
            "value",
        )
    )
