"""Great Expectations suites over the warehouse's current tables, run by `cdc verify`.

Per table: the primary key is unique and never NULL, no text column holds Debezium's
unchanged-TOAST placeholder, and the live row count equals the source's. And the
table's history: each key has at most one open version, every live row's version is
open (its position's), no version ends before it begins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cdc.catalog import Table
from cdc.decode import UNAVAILABLE
from cdc.settings import Settings

__all__ = ["Check", "history_checks", "warehouse_checks"]


@dataclass
class Check:
    table: str
    expectation: str  # e.g. expect_column_values_to_not_be_null
    column: str | None
    ok: bool
    observed: str  # what was found, for people


def _suite(table: Table, frame: Any, source_count: int) -> Any:
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from pyspark.sql import types as T

    suite = gx.ExpectationSuite(name=table.qualified)
    if len(table.key) == 1:
        suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column=table.key[0]))
    else:
        suite.add_expectation(gxe.ExpectCompoundColumnsToBeUnique(column_list=list(table.key)))
    for column in table.key:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=column))
    strings = {f.name for f in frame.schema.fields if isinstance(f.dataType, T.StringType)}
    for column in table.columns:
        if column.name in strings:
            suite.add_expectation(
                gxe.ExpectColumnValuesToNotBeInSet(column=column.name, value_set=[UNAVAILABLE])
            )
    suite.add_expectation(gxe.ExpectTableRowCountToEqual(value=source_count))
    return suite


def warehouse_checks(settings: Settings, table: Table, source_count: int) -> list[Check]:
    """Run the table's suite over its live rows in the warehouse."""
    import great_expectations as gx
    from delta.tables import DeltaTable
    from great_expectations.data_context.types.base import ProgressBarsConfig

    from cdc.spark import spark_session
    from materializers.apply import warehouse_root
    from materializers.stores.warehouse import current_path

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    spark = spark_session(settings, "cdc-verify")
    path = current_path(warehouse_root(settings), table.qualified)
    if not DeltaTable.isDeltaTable(spark, path):
        return [Check(table.qualified, "warehouse table exists", None, False, "no Delta table")]
    frame = spark.read.format("delta").load(path).where("NOT _cdc_deleted")
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_spark(name="warehouse").add_dataframe_asset(
        name=table.qualified
    )
    batch = asset.add_batch_definition_whole_dataframe("live rows").get_batch(
        batch_parameters={"dataframe": frame}
    )
    result = batch.validate(_suite(table, frame, source_count))
    checks = []
    for r in result.results:
        kwargs = r.expectation_config.kwargs
        column = kwargs.get("column") or ", ".join(kwargs.get("column_list") or []) or None
        found = r.result or {}
        if "observed_value" in found:
            observed = f"observed {found['observed_value']}"
        else:
            observed = f"{found.get('unexpected_count', 0)} unexpected"
        checks.append(
            Check(table.qualified, r.expectation_config.type, column, bool(r.success), observed)
        )
    return checks


def history_checks(settings: Settings, table: Table) -> list[Check]:
    """The invariants of the table's history (SCD type 2) against its current state."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.apply import warehouse_root
    from materializers.stores.warehouse import current_path, history_path

    spark = spark_session(settings, "cdc-verify")
    root = warehouse_root(settings)
    path = history_path(root, table.qualified)
    if not DeltaTable.isDeltaTable(spark, path):
        return [Check(table.qualified, "history exists", None, False, "no Delta table")]
    history = spark.read.format("delta").load(path)
    current = spark.read.format("delta").load(current_path(root, table.qualified))
    keys = [f"`{k}`" for k in table.key]
    on = " AND ".join(f"h.{k} <=> c.{k}" for k in keys)
    history.createOrReplaceTempView("cdc_verify_history")
    current.createOrReplaceTempView("cdc_verify_current")
    several = spark.sql(
        f"SELECT count(*) FROM (SELECT {', '.join(keys)} FROM cdc_verify_history "
        f"WHERE valid_to IS NULL GROUP BY {', '.join(keys)} HAVING count(*) > 1)"
    ).first()[0]
    not_open = spark.sql(
        "SELECT count(*) FROM cdc_verify_current c WHERE NOT c._cdc_deleted AND NOT EXISTS "
        f"(SELECT 1 FROM cdc_verify_history h WHERE {on} AND h.valid_to IS NULL AND "
        "h._cdc_commit_lsn <=> c._cdc_commit_lsn AND h._cdc_lsn <=> c._cdc_lsn)"
    ).first()[0]
    backwards = history.where("valid_to < valid_from").count()
    name = table.qualified
    return [
        Check(
            name,
            "history: at most one open version per key",
            None,
            not several,
            f"{several} keys with several",
        ),
        Check(
            name,
            "history: every live row's version is open",
            None,
            not not_open,
            f"{not_open} live rows without",
        ),
        Check(
            name,
            "history: no version ends before it begins",
            None,
            not backwards,
            f"{backwards} versions",
        ),
    ]
