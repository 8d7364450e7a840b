"""Great Expectations suites over the warehouse's current tables, run by `cdc verify`.

Per table: the primary key is unique and never NULL, no text column holds Debezium's
unchanged-TOAST placeholder, and the live row count equals the source's. The same
aggregates (row count, the sum of every integer and numeric column) computed by one
suite on PostgreSQL (GE's SQL datasource, through SQLAlchemy) and on the warehouse agree
at a consistent cut. And the table's history: each key has at most one open version,
every live row's version is open (its position's), no version ends before it begins. And
the derived data: each join view equals PostgreSQL's join, each window aggregate its
windows recomputed from the log.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from cdc.catalog import Table
from cdc.decode import UNAVAILABLE
from cdc.errors import StoreError
from cdc.settings import JoinView, Settings, WindowAggregate, duration_ms
from cdc.topics import change_topic
from materializers.progress import checkpoint_dir, last_committed_batch, late_events
from materializers.typed import quoted as q
from materializers.typed import spark_type

__all__ = [
    "Check",
    "aggregate_check",
    "history_checks",
    "view_checks",
    "warehouse_checks",
    "window_check",
    "window_starts",
]


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
    for key in table.key:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=key))
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
    from materializers.stores.warehouse.tables import current_path, warehouse_root

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


# summed by the aggregate check: exact on both sides (a float's sum depends on the order
# of its additions, so reals and doubles are left out)
_SUMMED = ("int2", "int4", "int8", "numeric")
AGGREGATE_ROUNDS = 3


def _summed(table: Table) -> list[Any]:
    from pyspark.sql import types as T

    return [
        c
        for c in table.columns
        if c.base in _SUMMED
        and not c.is_array
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


def _observed(batch: Any, columns: int) -> list[Any]:
    """The suite's observed values over `batch`: the row count, then each sum."""
    result = batch.validate(_aggregate_suite(columns))
    observed = []
    for r in result.results:
        info = r.exception_info or {}
        if info.get("raised_exception"):
            message = str(info.get("exception_message") or "").strip().splitlines()
            raise StoreError(f"an aggregate could not be computed: {(message or ['?'])[0][:200]}")
        observed.append((r.result or {}).get("observed_value"))
    if not observed or observed[0] is None:
        raise StoreError("an aggregate could not be computed: no row count")
    return observed


def _context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def _source_aggregates(settings: Settings, table: Table, summed: list[Any]) -> list[Any]:
    """The aggregates of `table` in PostgreSQL, by the suite on GE's SQL datasource."""
    from psycopg import sql

    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(
            [sql.SQL("1 AS one")]
            + [
                sql.SQL("{}::numeric AS {}").format(sql.Identifier(c.name), sql.Identifier(f"c{i}"))
                for i, c in enumerate(summed)
            ]
        ),
        sql.Identifier(table.schema, table.name),
    )
    # SQLAlchemy percent-encodes every reserved character of the password but a space,
    # which GE's URL check refuses: encoded here too
    url = settings.postgres.sqlalchemy_url().render_as_string(hide_password=False)
    url = url.replace(" ", "%20")
    source = _context().data_sources.add_postgres(name="source", connection_string=url)
    asset = source.add_query_asset(name="aggregates", query=query.as_string(None))
    try:
        return _observed(asset.add_batch_definition_whole_table("now").get_batch(), len(summed))
    except StoreError as exc:  # the message names no connection string
        raise StoreError(f"PostgreSQL, {table.qualified}: {exc}") from None


def _warehouse_aggregates(settings: Settings, table: Table, summed: list[Any]) -> list[Any]:
    """The same aggregates over the table's live rows in the warehouse (integers and
    decimals summed as decimal(38, scale), as PostgreSQL sums them as numeric)."""
    from pyspark.sql import functions as F

    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import current_path, warehouse_root

    spark = spark_session(settings, "cdc-verify")
    path = current_path(warehouse_root(settings), table.qualified)
    frame = spark.read.format("delta").load(path).where("NOT _cdc_deleted")
    types = {f.name: f.dataType for f in frame.schema.fields}
    frame = frame.select(
        F.lit(1).alias("one"),
        *[
            F.col(q(c.name))
            .cast(f"decimal(38, {getattr(types[c.name], 'scale', 0)})")
            .alias(f"c{i}")
            for i, c in enumerate(summed)
        ],
    )
    asset = (
        _context().data_sources.add_spark(name="warehouse").add_dataframe_asset(name="aggregates")
    )
    batch = asset.add_batch_definition_whole_dataframe("live rows").get_batch(
        batch_parameters={"dataframe": frame}
    )
    return _observed(batch, len(summed))


def aggregate_check(
    settings: Settings, table: Table, rounds: int = AGGREGATE_ROUNDS, timeout: float = 120.0
) -> Check:
    """The table's aggregates in PostgreSQL and in the warehouse, at a consistent cut.

    PostgreSQL is read before the cut and again after the warehouse: only when both reads
    agree (the source held still meanwhile) are they compared with the warehouse; else
    the round is taken again, and a source that moved in every round is reported as not
    compared."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import current_path, warehouse_root
    from materializers.verify import consistent_cut

    what = "row count and sums equal PostgreSQL's"
    path = current_path(warehouse_root(settings), table.qualified)
    if not DeltaTable.isDeltaTable(spark_session(settings, "cdc-verify"), path):
        return Check(table.qualified, what, None, False, "no Delta table")
    summed = _summed(table)
    if any("%" in name for name in (table.schema, table.name, *(c.name for c in summed))):
        # GE's SQL datasource answers nothing for a query naming one (found by a test)
        return Check(table.qualified, what, None, True, "not compared: a name holds %")
    names = ["rows", *(f"sum({c.name})" for c in summed)]
    for _ in range(rounds):
        try:
            before = _source_aggregates(settings, table, summed)
            consistent_cut(settings, [table], ["warehouse"], timeout)
            held = _warehouse_aggregates(settings, table, summed)
            again = _source_aggregates(settings, table, summed)
        except StoreError as exc:
            return Check(table.qualified, what, None, False, str(exc))
        if again != before:
            time.sleep(1)
            continue  # the source changed during the round
        differ = [
            f"{name} {mine} in PostgreSQL, {theirs} in the warehouse"
            for name, mine, theirs in zip(names, before, held, strict=True)
            if mine != theirs
        ]
        shown = ", ".join(f"{name} {value}" for name, value in zip(names, before, strict=True))
        return Check(
            table.qualified, what, None, not differ, "; ".join(differ) if differ else shown
        )
    return Check(
        table.qualified,
        what,
        None,
        True,
        f"not compared: the source changed in each of {rounds} rounds",
    )


def history_checks(settings: Settings, table: Table) -> list[Check]:
    """The invariants of the table's history (SCD type 2) against its current state."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.warehouse.history import NEWEST
    from materializers.stores.warehouse.tables import current_path, history_path, warehouse_root

    spark = spark_session(settings, "cdc-verify")
    root = warehouse_root(settings)
    path = history_path(root, table.qualified)
    if not DeltaTable.isDeltaTable(spark, path):
        return [Check(table.qualified, "history exists", None, False, "no Delta table")]
    history = spark.read.format("delta").load(path)
    current = spark.read.format("delta").load(current_path(root, table.qualified))
    keys = [q(k) for k in table.key]
    on = " AND ".join(f"h.{k} <=> c.{k}" for k in keys)
    history.createOrReplaceTempView("cdc_verify_history")
    current.createOrReplaceTempView("cdc_verify_current")
    several = spark.sql(
        f"SELECT count(*) FROM (SELECT {', '.join(keys)} FROM cdc_verify_history "
        f"WHERE valid_to IS NULL GROUP BY {', '.join(keys)} HAVING count(*) > 1)"
    ).collect()[0][0]
    not_open = spark.sql(
        "SELECT count(*) FROM cdc_verify_current c WHERE NOT c._cdc_deleted AND NOT EXISTS "
        f"(SELECT 1 FROM cdc_verify_history h WHERE {on} AND h.valid_to IS NULL AND "
        "h._cdc_commit_lsn <=> c._cdc_commit_lsn AND h._cdc_lsn <=> c._cdc_lsn)"
    ).collect()[0][0]
    backwards = history.where("valid_to < valid_from").count()
    marked = 0
    if NEWEST in history.columns:  # (a history not yet rewritten by `cdc apply` has none)
        marked = spark.sql(
            f"SELECT count(*) FROM (SELECT count_if({NEWEST}) AS n, "
            f"max_by({NEWEST}, struct(_cdc_commit_lsn, _cdc_lsn)) AS last "
            f"FROM cdc_verify_history GROUP BY {', '.join(keys)}) WHERE n <> 1 OR NOT last"
        ).collect()[0][0]
    name = table.qualified
    return [
        Check(
            name,
            "history: each key's newest version, and only it, is marked newest",
            None,
            not marked,
            f"{marked} keys otherwise",
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


def view_checks(settings: Settings, tables: dict[str, Table]) -> list[Check]:
    """The derived data of the verified tables: each join view equals the same join
    computed by PostgreSQL; each window aggregate equals its windows recomputed from the
    change log."""
    from materializers.verify import verify_join

    checks = []
    for join in settings.apply.joins:
        if join.table not in tables or join.references not in tables:
            continue
        if join.kind == "stream_table":
            checks.append(enrichment_check(settings, join, tables))
            continue
        if join.kind == "stream_stream":
            checks.append(stream_check(settings, join, tables))
            continue
        drift = verify_join(settings, join, tables)
        found = drift.missing + drift.extra + drift.different
        checks.append(
            Check(
                drift.table,
                "join view equals PostgreSQL's join",
                None,
                drift.ok,
                f"{len(drift.missing)} missing, {len(drift.extra)} extra, "
                f"{len(drift.different)} different" + (f" (e.g. {found[0]})" if found else ""),
            )
        )
    for window in settings.apply.windows:
        if window.table not in tables:
            continue
        if window.kind in ("sliding", "session"):
            checks.append(stream_check(settings, window, tables))
        else:
            checks.append(window_check(settings, window, tables[window.table]))
    return checks


def stream_check(
    settings: Settings,
    view: JoinView | WindowAggregate,
    tables: dict[str, Table],
    timeout: float = 120.0,
) -> Check:
    """A sliding or session window, or a stream-stream join, against its rows computed
    again from the change log (materializers/stream_check.py), once its query has
    committed the whole log as it is now. Events it found too late were not applied:
    then it is not recomputed (`cdc status` shows how many)."""
    from cdc.topics import read_topic, thinned
    from materializers.stores.warehouse.store import warehouse_value
    from materializers.stream_check import compare_due, expected_rows

    name = f"view {view.name}"
    what = (
        "stream-stream join equals its starts and ends joined again from the log"
        if isinstance(view, JoinView)
        else f"{view.kind} window aggregate equals its windows recomputed from the log"
    )
    read = {view.table} | ({view.references} if isinstance(view, JoinView) else set())
    logs = {t: read_topic(settings.kafka, change_topic(settings.pipeline, t)) for t in read}
    if any(thinned(records) for records in logs.values()):
        return Check(name, what, None, True, "not recomputed: compaction removed records")
    ends = {
        change_topic(settings.pipeline, t): {r.partition: r.offset + 1 for r in records}
        for t, records in logs.items()
    }
    watermark = _caught_up(settings, view.name, ends, timeout)
    if watermark is None:
        return Check(name, what, None, False, f"its query did not read the log within {timeout}s")
    late = _late(settings, view)
    if late:
        return Check(
            name, what, None, True, f"not recomputed: {late} events came after the watermark"
        )
    expected = expected_rows(view, tables, logs, warehouse_value)
    ok, detail = compare_due(expected, _held_rows(settings, view, tables), watermark)
    return Check(name, what, None, ok, detail)


def _held_rows(
    settings: Settings, view: JoinView | WindowAggregate, tables: dict[str, Table]
) -> dict[Any, Any]:
    """The view's rows, keyed and valued as stream_check.expected_rows makes them."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.warehouse.store import warehouse_value
    from materializers.stores.warehouse.tables import warehouse_root
    from materializers.stores.warehouse.views import view_path
    from materializers.typed import quoted as q

    spark = spark_session(settings, "cdc-verify")
    path = view_path(warehouse_root(settings), view.name)
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    frame = spark.read.format("delta").load(path)

    def ms(column: str) -> str:
        return f"unix_millis({column}) AS {column}_ms"

    if isinstance(view, JoinView):
        start, end = tables[view.table], tables[view.references]
        (key,) = start.key
        carried = [view.column_prefix + c for c in view.columns]
        rows = frame.selectExpr(
            f"{q(key)} AS k", "_cdc_commit_lsn", "_cdc_lsn", ms("end_ts"), *map(q, carried)
        ).collect()
        return {
            (warehouse_value(start.column(key), r["k"]), r["_cdc_commit_lsn"], r["_cdc_lsn"]): (
                r["end_ts_ms"],
                *[
                    warehouse_value(end.column(c), r[p])
                    for c, p in zip(view.columns, carried, strict=True)
                ],
            )
            for r in rows
        }
    total = lambda r: None if r["total"] is None else float(r["total"])  # noqa: E731
    if view.kind == "sliding":
        rows = frame.selectExpr(ms("window_end"), "rows", "total").collect()
        return {r["window_end_ms"]: (r["rows"], total(r)) for r in rows}
    group = tables[view.table].column(view.group_by) if view.group_by else None
    rows = frame.selectExpr(
        f"{q(view.group_by)} AS g" if view.group_by else "NULL AS g",
        ms("window_start"),
        ms("window_end"),
        "rows",
        "total",
    ).collect()
    return {
        (warehouse_value(group, r["g"]) if group else None, r["window_start_ms"]): (
            r["window_end_ms"],
            r["rows"],
            total(r),
        )
        for r in rows
    }


def enrichment_check(settings: Settings, join: JoinView, tables: dict[str, Table]) -> Check:
    """A stream-table join against its events enriched again from the change log, once
    the warehouse has applied every change committed before now."""
    from cdc.spark import spark_session
    from materializers.enrichment_check import enrichment_drift
    from materializers.stores.warehouse.store import warehouse_value
    from materializers.stores.warehouse.tables import warehouse_root
    from materializers.stores.warehouse.views import view_path
    from materializers.verify import consistent_cut

    stream, referenced = tables[join.table], tables[join.references]
    consistent_cut(settings, [stream, referenced], ["warehouse"], 120.0)
    spark = spark_session(settings, "cdc-verify")
    carried = [referenced.column(c) for c in join.columns]
    held = {
        (
            *[warehouse_value(stream.column(k), row[k]) for k in stream.key],
            row["_cdc_commit_lsn"],
            row["_cdc_lsn"],
        ): tuple(warehouse_value(c, row[join.column_prefix + c.name]) for c in carried)
        for row in spark.read.format("delta")
        .load(view_path(warehouse_root(settings), join.name))
        .toLocalIterator()
    }
    ok, detail = enrichment_drift(settings, join, tables, held, warehouse_value)
    what = "stream-table join equals its events enriched again from the log"
    return Check(f"view {join.name}", what, None, ok is not False, detail)


def window_starts(window: WindowAggregate, ms: int) -> list[int]:
    """The starts (ms since the epoch) of the windows that hold an event committed at
    `ms`: one tumbling window; every hopping window (starts every `slide`, from the
    epoch) that began at or before it and ends after it."""
    width = duration_ms(window.window)
    step = duration_ms(window.slide) if window.slide else width
    starts = []
    start = ms - ms % step
    while start > ms - width:
        starts.append(start)
        start -= step
    return sorted(starts)


def window_check(
    settings: Settings, window: WindowAggregate, table: Table, timeout: float = 120.0
) -> Check:
    """The window aggregate against its windows recomputed from the change topic: the
    creations (op c, each (key, LSN) once) per window of commit time (window_starts),
    counted and summed. Waits until the window's query has committed the whole topic as
    it is now. Events it found too late were not counted: then only the total is
    compared (counted + late = the (event, window) pairs; one per creation in tumbling
    windows). A compacted topic no longer holds every creation: then it is not compared."""
    from cdc.decode import decode_value
    from cdc.topics import read_topic, thinned

    name = f"view {window.name}"
    records = read_topic(settings.kafka, change_topic(settings.pipeline, table.qualified))
    ends = {r.partition: r.offset + 1 for r in records}  # in offset order: the last wins
    what = "window aggregate equals its windows recomputed from the log"
    if thinned(records):
        return Check(name, what, None, True, "not recomputed: compaction removed records")
    if not _window_caught_up(settings, window, ends, timeout):
        return Check(name, what, None, False, f"its query did not read the log within {timeout}s")
    column = table.column(window.sum) if window.sum else None
    seen: set[tuple[bytes | None, Any]] = set()
    expected_windows: dict[int, list[Any]] = {}
    if column is not None and column.generated is not None:  # not in the log: computed
        import psycopg

        from materializers.generated import compute

        afters = [
            r.value["after"]
            for r in records
            if r.value and r.value.get("op") == "c" and column.name not in r.value["after"]
        ]
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            compute(conn, table, afters)
    for record in records:
        value = record.value
        if not value or value.get("op") != "c":
            continue
        source = value["source"]
        if (record.key_bytes, source.get("lsn")) in seen:
            continue
        seen.add((record.key_bytes, source.get("lsn")))
        amount = decode_value(column, value["after"].get(column.name)) if column else None
        for start in window_starts(window, source["ts_ms"]):
            counted = expected_windows.setdefault(start, [0, None])
            counted[0] += 1
            if amount is not None:
                counted[1] = amount if counted[1] is None else counted[1] + amount
    held = _window_rows(settings, window)
    late = _late(settings, window)
    if late:  # Spark counts a late event once per window it is too late for
        total = sum(rows for rows, _ in held.values())
        places = sum(rows for rows, _ in expected_windows.values())
        ok = total + late == places
        return Check(
            name,
            what,
            None,
            ok,
            f"{total} counted + {late} late of {places} (event, window) pairs "
            f"({len(seen)} created)",
        )
    differ = sorted(
        start
        for start in set(held) | set(expected_windows)
        if _window_form(held.get(start)) != _window_form(expected_windows.get(start))
    )
    return Check(
        name,
        what,
        None,
        not differ,
        f"{len(differ)} of {len(set(held) | set(expected_windows))} windows differ"
        + (f" (e.g. the one from {differ[0]} ms)" if differ else ""),
    )


def _window_form(counted: Any) -> Any:
    if counted is None:
        return None
    rows, total = counted
    return rows, None if total is None else float(total)


def _window_rows(settings: Settings, window: WindowAggregate) -> dict[int, tuple[int, Any]]:
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.warehouse.tables import warehouse_root
    from materializers.stores.warehouse.views import view_path

    spark = spark_session(settings, "cdc-verify")
    path = view_path(warehouse_root(settings), window.name)
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    frame = spark.read.format("delta").load(path)
    return {
        int(r["start_ms"]): (r["rows"], r["total"])
        for r in frame.selectExpr(
            "unix_millis(window_start) AS start_ms", "rows", "total"
        ).collect()
    }


def _late(settings: Settings, view: WindowAggregate | JoinView) -> int:
    return late_events(settings, view.name) or 0


def _window_caught_up(
    settings: Settings, window: WindowAggregate, ends: dict[int, int], timeout: float
) -> bool:
    topic = change_topic(settings.pipeline, window.table)
    return _caught_up(settings, window.name, {topic: ends}, timeout) is not None


def _caught_up(
    settings: Settings, name: str, ends: dict[str, dict[int, int]], timeout: float
) -> int | None:
    """The watermark (ms) of the last batch the query of view `name` committed, once
    that batch read every topic of `ends` up to its end offsets; None after `timeout`
    (its Structured Streaming checkpoint: commits/<id>, offsets/<id>: a version line, the
    batch's metadata, then each source's offsets)."""

    checkpoint = checkpoint_dir(settings, f"window-{name}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            batch = last_committed_batch(checkpoint)
            if batch is None:
                raise ValueError("no batch committed yet")
            lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
            sources = [json.loads(line) for line in lines[2:]]
            reading = {t: [s[t] for s in sources if t in s] for t in ends}  # per reader
            if all(
                reading[topic]
                and all(
                    int(read.get(str(p), 0)) >= end
                    for read in reading[topic]
                    for p, end in offsets.items()
                )
                for topic, offsets in ends.items()
            ):
                return int(json.loads(lines[1]).get("batchWatermarkMs", 0))
        except (OSError, ValueError, IndexError):
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(1)
