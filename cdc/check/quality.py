"""Great Expectations suites over the warehouse's current tables, run by `cdc verify`.

Per table: the primary key is unique and never NULL, no text column holds Debezium's
unchanged-TOAST placeholder, and the live row count equals the source's. The same
aggregates (row count, the sum of every integer and numeric column) computed by one
suite on PostgreSQL (GE's SQL datasource, through SQLAlchemy) and on the warehouse agree
at a consistent cut. And the table's history: each key has at most one open version,
every live row's version is open (its position's), no version ends before it begins.
(The derived views' checks: view_checks.py.)
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from cdc.core.catalog import Table
from cdc.core.errors import StoreError
from cdc.core.settings import Settings
from cdc.stores.base import FrameReader
from cdc.stores.registry import reader_with
from cdc.types.spark_types import quoted as q
from cdc.types.spark_types import spark_type
from cdc.types.store_forms import SUMMED_TYPES

__all__ = ["Check", "expectations", "history_checks"]


@dataclass
class Check:
    table: str
    expectation: str  # e.g. expect_column_values_to_not_be_null
    column: str | None
    ok: bool
    observed: str  # what was found, for people


# the suite's sums are taken over these columns of the live rows (a name no table's
# column has: the pipeline's own columns start with `_cdc_`)
_SUM_ALIAS = "_cdc_verify_sum_{}"


# the suite names each column of the table by this and its place: GE names a column in
# Spark SQL without escaping it (a backquote in a name broke its expectation), and a
# name of the pipeline's own meets no column (cdc.core.catalog.reserved_problem)
_COLUMN_ALIAS = "_cdc_verify_c{}"


def _suite(table: Table, frame: Any, source_count: int, sums: int, alias: dict[str, str]) -> Any:
    """The table's expectations over its live rows (`frame`: each column under its
    `alias`), and the observed aggregates (row count, `sums` column sums) that the
    aggregate check compares with PostgreSQL's."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from pyspark.sql import types as T

    suite = gx.ExpectationSuite(name=table.qualified)
    if len(table.key) == 1:
        suite.add_expectation(gxe.ExpectColumnValuesToBeUnique(column=alias[table.key[0]]))
    else:
        suite.add_expectation(
            gxe.ExpectCompoundColumnsToBeUnique(column_list=[alias[k] for k in table.key])
        )
    for key in table.key:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=alias[key]))
    strings = {f.name for f in frame.schema.fields if isinstance(f.dataType, T.StringType)}
    for column in table.columns:
        if alias.get(column.name) in strings:
            suite.add_expectation(
                gxe.ExpectColumnValuesToNotBeInSet(
                    column=alias[column.name], value_set=[table.placeholder]
                )
            )
    suite.add_expectation(gxe.ExpectTableRowCountToEqual(value=source_count))
    for i in range(sums):
        suite.add_expectation(gxe.ExpectColumnSumToBeBetween(column=_SUM_ALIAS.format(i)))
    return suite


def _context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


@dataclass
class _Live:
    """One pass of the table's suite over its live rows in the warehouse."""

    checks: list[Check]  # its expectations, for people
    aggregates: list[Any] | str  # the row count then each sum; or why they were not taken


def _live_suite(
    context: Any, frame: Any, table: Table, source_count: int, summed: list[Any]
) -> _Live:
    """Run the table's suite over `frame` (its live rows, the sums' columns added), each
    column under a name of the suite's own (_COLUMN_ALIAS), reported under its own."""
    from pyspark.sql import functions as F

    held = set(frame.columns)
    alias = {c.name: _COLUMN_ALIAS.format(i) for i, c in enumerate(table.columns) if c.name in held}
    named = {a: c for c, a in alias.items()}
    sum_names = [_SUM_ALIAS.format(i) for i in range(len(summed))]
    frame = frame.select(*[F.col(q(c)).alias(a) for c, a in alias.items()], *sum_names)
    asset = context.data_sources.add_or_update_spark(name="live_rows").add_dataframe_asset(
        name=table.qualified
    )
    batch = asset.add_batch_definition_whole_dataframe("live rows").get_batch(
        batch_parameters={"dataframe": frame}
    )
    result = batch.validate(_suite(table, frame, source_count, len(summed), alias))
    aliases = {name: i for i, name in enumerate(sum_names)}
    checks, rows, sums = [], None, {}
    failed = ""
    for r in result.results:
        kwargs = r.expectation_config.kwargs
        listed = [named.get(c, c) for c in kwargs.get("column_list") or []]
        column = named.get(kwargs.get("column"), kwargs.get("column")) or ", ".join(listed) or None
        found = r.result or {}
        info = r.exception_info or {}
        if column in aliases:
            if info.get("raised_exception"):
                message = str(info.get("exception_message") or "").strip().splitlines()
                failed = f"an aggregate could not be computed: {(message or ['?'])[0][:200]}"
            sums[aliases[column]] = found.get("observed_value")
            continue
        if r.expectation_config.type == "expect_table_row_count_to_equal":
            rows = found.get("observed_value")
        if "observed_value" in found:
            observed = f"observed {found['observed_value']}"
        else:
            observed = f"{found.get('unexpected_count', 0)} unexpected"
        checks.append(
            Check(table.qualified, r.expectation_config.type, column, bool(r.success), observed)
        )
    if rows is None:
        failed = failed or "an aggregate could not be computed: no row count"
    return _Live(checks, failed or [rows, *(sums.get(i) for i in range(len(summed)))])


AGGREGATE_ROUNDS = 3


def _summed(table: Table) -> list[Any]:
    from pyspark.sql import types as T

    return [
        c
        for c in table.columns
        if c.base in SUMMED_TYPES
        and not c.is_array
        and table.mask(c.name) is None  # redacted to NULL in the stores
        and isinstance(spark_type(c), T.IntegralType | T.DecimalType)
    ]


def _aggregate_suite(columns: int) -> Any:
    """Row count and a sum per column (`c0`, `c1`...): observed, with no bounds."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    suite = gx.ExpectationSuite(name="aggregates")
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween())
    for i in range(columns):
        suite.add_expectation(gxe.ExpectColumnSumToBeBetween(column=f"c{i}"))
    return suite


# what GE's SQL datasource takes for a parameter: `%`, and `:x` as SQLAlchemy's text()
# finds it (not a `::` cast, not after a letter or digit)
_UNRUNNABLE = re.compile(r"%|(?<![:\w\\]):\w")


def _identifier(*names: str) -> Any:
    """A (qualified) name in SQL whose text holds no `%` and no `:`: GE hands its query
    to SQLAlchemy's text(), which takes `:x` for a parameter, and to a driver that takes
    `%` for one (either made GE answer nothing). Such a name is written with those, and
    a backslash, as Unicode escapes (U&"…"), which PostgreSQL reads as the name."""
    from psycopg import sql

    parts: list[sql.Composable] = []
    for name in names:
        if "%" not in name and ":" not in name:
            parts.append(sql.Identifier(name))
            continue
        quoted = name.replace('"', '""')
        parts.append(
            sql.SQL('U&"{}"').format(
                sql.SQL("".join(f"\\{ord(ch):04X}" if ch in "%:\\" else ch for ch in quoted))
            )
        )
    return sql.SQL(".").join(parts)


def _source_aggregates(
    settings: Settings, context: Any, table: Table, summed: list[Any]
) -> list[Any]:
    """The aggregates of `table` in PostgreSQL, by the suite on GE's SQL datasource."""
    from psycopg import sql

    source: Any = _identifier(table.schema, table.name)
    if table.row_filter is not None:  # table.source(), its names as _identifier writes them
        source = sql.SQL("(SELECT * FROM {} WHERE ({})) AS {}").format(
            source, sql.SQL(table.row_filter), _identifier(table.name)
        )
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(
            [sql.SQL("1 AS one")]
            + [
                sql.SQL("{}::numeric AS {}").format(_identifier(c.name), sql.Identifier(f"c{i}"))
                for i, c in enumerate(summed)
            ]
        ),
        source,
    )
    try:
        datasource = context.data_sources.get("source")
    except KeyError:
        # SQLAlchemy percent-encodes every reserved character of the password but a
        # space, which GE's URL check refuses: encoded here too
        url = settings.postgres.sqlalchemy_url().render_as_string(hide_password=False)
        url = url.replace(" ", "%20")
        datasource = context.data_sources.add_postgres(name="source", connection_string=url)
    asset = datasource.add_query_asset(name=table.qualified, query=query.as_string(None))
    try:
        result = (
            asset.add_batch_definition_whole_table("now")
            .get_batch()
            .validate(_aggregate_suite(len(summed)))
        )
    finally:
        datasource.delete_asset(table.qualified)
    observed = []
    for r in result.results:
        info = r.exception_info or {}
        if info.get("raised_exception"):
            message = str(info.get("exception_message") or "").strip().splitlines()
            raise StoreError(  # the message names no connection string
                f"PostgreSQL, {table.qualified}: an aggregate could not be computed: "
                f"{(message or ['?'])[0][:200]}"
            )
        observed.append((r.result or {}).get("observed_value"))
    if not observed or observed[0] is None:
        raise StoreError(f"PostgreSQL, {table.qualified}: no row count")
    return observed


def _live_frame(warehouse: FrameReader, table: Table, summed: list[Any]) -> Any:
    """The table's live rows in the warehouse, kept in memory for the checks' passes,
    with each summed column as decimal(38, scale) (PostgreSQL sums them as numeric)."""
    from pyspark.sql import functions as F

    frame = warehouse.live_frame(table)
    assert frame is not None  # (expectations looked at the tables there are)
    types = {f.name: f.dataType for f in frame.schema.fields}
    return frame.select(
        "*",
        *[
            F.col(q(c.name))
            .cast(f"decimal(38, {getattr(types[c.name], 'scale', 0)})")
            .alias(_SUM_ALIAS.format(i))
            for i, c in enumerate(summed)
        ],
    ).cache()


def expectations(
    settings: Settings,
    tables: list[Table],
    counts: dict[str, int],
    rounds: int = AGGREGATE_ROUNDS,
    timeout: float = 120.0,
) -> list[Check]:
    """The expectations over each table in the warehouse, in one pass over its live rows
    (kept in memory meanwhile) and one over its history (history_checks):

    - its suite: the primary key unique and never NULL, no text column holding
      Debezium's unchanged-TOAST placeholder, the live row count equal to the source's
      (`counts`, taken at verify's cut);
    - its aggregates (row count, the sum of every integer and numeric column) equal to
      PostgreSQL's at a consistent cut. PostgreSQL is read before the cut and again
      after the warehouse: only when both reads agree (the source held still meanwhile)
      are they compared; else the round is taken again for the tables that moved, and a
      source that moved in every round is reported as not compared."""
    from cdc.check.verify import consistent_cut

    what = "row count and sums equal PostgreSQL's"
    warehouse = reader_with(settings, "expectations")
    assert isinstance(warehouse, FrameReader)
    context = _context()
    found: dict[str, list[Check]] = {t.qualified: [] for t in tables}
    compared: dict[str, Check] = {}
    present = []
    for table in tables:
        if warehouse.holds(table):
            present.append(table)
            continue
        found[table.qualified].append(
            Check(table.qualified, f"{warehouse.name} table exists", None, False, "no Delta table")
        )
        compared[table.qualified] = Check(table.qualified, what, None, False, "no Delta table")
    for table in present:
        if _UNRUNNABLE.search(table.row_filter or ""):
            # GE's SQL datasource answers nothing for a query holding one (a name holding
            # one is written without it: _identifier)
            compared[table.qualified] = Check(
                table.qualified, what, None, True, "not compared: its row filter holds % or :x"
            )
    pending = list(present)  # each round: the tables still to look at
    for round_ in range(rounds):
        before: dict[str, list[Any]] = {}
        for table in pending:
            if table.qualified in compared:
                continue
            try:
                before[table.qualified] = _source_aggregates(
                    settings, context, table, _summed(table)
                )
            except StoreError as exc:
                compared[table.qualified] = Check(table.qualified, what, None, False, str(exc))
        if before:
            consistent_cut(
                settings, [t for t in pending if t.qualified in before], [warehouse.name], timeout
            )
        moved = []
        for table in pending:
            name = table.qualified
            summed = _summed(table)
            frame = _live_frame(warehouse, table, summed)
            try:
                live = _live_suite(context, frame, table, counts[name], summed)
                if round_ == 0:
                    found[name] += live.checks + history_checks(warehouse, table, frame)
            finally:
                frame.unpersist()
            if name in compared:
                continue
            try:
                again = _source_aggregates(settings, context, table, summed)
            except StoreError as exc:
                compared[name] = Check(name, what, None, False, str(exc))
                continue
            if again != before[name]:
                moved.append(table)  # the source changed during the round
                continue
            compared[name] = _aggregates_compared(table, summed, before[name], live.aggregates)
        pending = moved
        if not pending:
            break
        time.sleep(1)
    for table in pending:
        compared[table.qualified] = Check(
            table.qualified,
            what,
            None,
            True,
            f"not compared: the source changed in each of {rounds} rounds",
        )
    return [c for t in tables for c in (*found[t.qualified], compared[t.qualified])]


def _aggregates_compared(
    table: Table, summed: list[Any], source: list[Any], held: list[Any] | str
) -> Check:
    what = "row count and sums equal PostgreSQL's"
    if isinstance(held, str):
        return Check(table.qualified, what, None, False, held)
    names = ["rows", *(f"sum({c.name})" for c in summed)]
    differ = [
        f"{name} {mine} in PostgreSQL, {theirs} in the warehouse"
        for name, mine, theirs in zip(names, source, held, strict=True)
        if mine != theirs
    ]
    shown = ", ".join(f"{name} {value}" for name, value in zip(names, source, strict=True))
    return Check(table.qualified, what, None, not differ, "; ".join(differ) if differ else shown)


def history_checks(warehouse: FrameReader, table: Table, live: Any) -> list[Check]:
    """The invariants of the table's history (SCD type 2) against its `live` rows, in
    one pass: no two versions of a key at one position (a change taken twice); at most
    one version per key is open; every live row's version is open; no version ends
    before it begins (the ends as readers derive them: history.derived_history)."""
    spark = warehouse.spark
    history = warehouse.history_frame(table)
    if history is None:
        return [Check(table.qualified, "history exists", None, False, "no Delta table")]
    keys = [q(k) for k in table.key]
    position = "struct(coalesce(_cdc_commit_lsn, -1), coalesce(_cdc_lsn, -1))"
    # the query's own columns are named `_cdc_*`, which no column of a table can be
    # (cdc.core.catalog.reserved_problem): a table's key beside them never collides
    history.createOrReplaceTempView("cdc_verify_history")
    live.createOrReplaceTempView("cdc_verify_live")
    (several, not_open, backwards, doubled) = spark.sql(
        f"""
        WITH per_key AS (
            SELECT {", ".join(keys)},
                   count_if(valid_to IS NULL) AS _cdc_opened,
                   count_if(valid_to < valid_from) AS _cdc_backwards,
                   collect_list(CASE WHEN valid_to IS NULL THEN {position} END) AS _cdc_opens,
                   count(*) - count(DISTINCT {position}) AS _cdc_doubled
            FROM cdc_verify_history GROUP BY {", ".join(keys)}
        ),
        live AS (SELECT {", ".join(keys)}, {position} AS _cdc_at FROM cdc_verify_live)
        SELECT count_if(h._cdc_opened > 1),
               count_if(l._cdc_at IS NOT NULL
                        AND (h._cdc_opens IS NULL OR NOT array_contains(h._cdc_opens, l._cdc_at))),
               coalesce(sum(h._cdc_backwards), 0),
               coalesce(sum(h._cdc_doubled), 0)
        FROM per_key h FULL OUTER JOIN live l ON {" AND ".join(f"h.{k} <=> l.{k}" for k in keys)}
        """
    ).collect()[0]
    name = table.qualified
    return [
        Check(
            name,
            "history: no two versions of a key at one position",
            None,
            not doubled,
            f"{doubled} versions taken twice",
        ),
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
