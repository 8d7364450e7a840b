"""The initial snapshot, taken at the slot's consistent point (contract point 2).

1. prepare the source (role, publication, tables) and the change topics;
2. create the slot with an exported snapshot;
3. read every captured table under that snapshot, in parallel CTID ranges, with
   Spark; PostgreSQL formats each row as a Debezium `op: "r"` event and Spark
   writes it to the table's change topic with the key Debezium would write;
4. mark the snapshot done, then start the connector on that slot with
   snapshot.mode=no_data, its offset set to the slot's consistent point (created
   stopped, offset set, resumed): it streams exactly what committed after the point,
   whatever offset an earlier generation left under the connector's name.

A run that stops before 4 leaves state `running`; the next run drops the
unused slot, removes what the interrupted run wrote and starts again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from functools import reduce
from itertools import pairwise
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cdc.capture.connect import connect_client
from cdc.capture.connector import register_connector
from cdc.capture.generation import record_generation
from cdc.capture.rewrites import record_schemas
from cdc.capture.role import replication_password
from cdc.capture.slot import (
    RESNAPSHOT,
    InFlight,
    SnapshotPoint,
    drop_slot,
    exported_snapshot,
    int_to_lsn,
    lsn_to_int,
    slot_lost,
    slot_state,
)
from cdc.capture.snapshots import mark_done, mark_running, read_state
from cdc.capture.source import (
    admin_connection,
    prepare_source,
    replication_dsn,
    sync_truncate_triggers,
)
from cdc.catalog import Table
from cdc.errors import ConnectorError, SnapshotError
from cdc.say import Say, quiet
from cdc.settings import Settings
from cdc.spark import kafka_options, spark_session
from cdc.topics import (
    change_topic,
    change_topic_spec,
    dead_letter_topic,
    end_offsets,
    ensure_topics,
    pipeline_topic_specs,
    truncate_topics,
)
from snapshot.encoding import envelope, event_query

__all__ = ["SnapshotResult", "ctid_ranges", "run_snapshot"]

log = logging.getLogger(__name__)


@dataclass
class SnapshotResult:
    lsn: str
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    resumed: bool = False  # only the connector had to be started

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def ctid_ranges(pages: int, pages_per_reader: int) -> list[str]:
    """WHERE clauses splitting a table into CTID ranges of whole pages.

    The last range is open-ended: relpages is an estimate and the table may have grown.
    """
    count = max(1, math.ceil(pages / pages_per_reader))
    if count == 1:
        return ["true"]
    bounds = [i * pages_per_reader for i in range(1, count)]
    clauses = [f"ctid < '({bounds[0]},0)'::tid"]
    clauses += [f"ctid >= '({a},0)'::tid AND ctid < '({b},0)'::tid" for a, b in pairwise(bounds)]
    clauses.append(f"ctid >= '({bounds[-1]},0)'::tid")
    return clauses


def run_snapshot(
    settings: Settings,
    console: Console,
    say: Say = quiet,
) -> SnapshotResult:
    """Take the pipeline's initial snapshot and start streaming after it (idempotent)."""
    pipe = settings.pipeline
    started = time.monotonic()
    say(f"preparing the source for pipeline {pipe.name}")
    tables = prepare_source(settings)
    ensure_topics(
        settings.kafka,
        pipeline_topic_specs(settings.pipeline, [t.qualified for t in tables]),
    )
    connector = connect_client(settings).connectors().get(pipe.connector)
    # a connector stays STOPPED if its start was interrupted: a rerun starts it
    stopped = (connector or {}).get("status", {}).get("connector", {}).get("state") == "STOPPED"

    with admin_connection(settings) as conn:
        conn.autocommit = True
        state = read_state(conn, pipe.name)
        slot = slot_state(conn, pipe.slot)
        if state is not None and state.status == "done" and slot is not None:
            if slot_lost(conn, pipe.slot):
                raise SnapshotError(
                    f"slot {pipe.slot} of pipeline {pipe.name} is lost (PostgreSQL removed "
                    "the WAL it kept): the changes since the last confirmed position are gone; "
                    f"{RESNAPSHOT}"
                )
            if connector is not None and not stopped:
                raise SnapshotError(
                    f"pipeline {pipe.name} already took its snapshot and streams; to load rows "
                    "again use `cdc backfill TABLE`, or `cdc drop` then `cdc snapshot`"
                )
            say(f"snapshot at {state.lsn} is complete; starting the connector on slot {pipe.slot}")
            # at the snapshot's point, unless Connect holds this generation's offset already
            start_lsn = lsn_to_int(state.lsn) if state.lsn else None
            register_connector(settings, tables, start_lsn=start_lsn)
            return SnapshotResult(lsn=state.lsn or "", resumed=True)
        if connector is not None:
            raise SnapshotError(
                f"connector {pipe.connector} exists but pipeline {pipe.name} has no complete "
                "snapshot; remove it first with `cdc drop`"
            )
        if slot is not None:
            active, pid = slot
            if active:
                raise SnapshotError(
                    f"replication slot {pipe.slot} is in use by pid {pid}; stop whatever reads "
                    "it, or give this pipeline another name (pipeline.name)"
                )
            say(f"dropping slot {pipe.slot} of an interrupted snapshot; starting again")
            drop_slot(conn, pipe.slot)
        mark_running(conn, pipe.name, pipe.slot)

    # what an interrupted run wrote goes; offsets keep growing, so no position is reused
    truncate_topics(settings.kafka, [change_topic_spec(pipe, t.qualified) for t in tables])

    def waiting(blockers: list[InFlight]) -> None:
        say(
            f"creating slot {pipe.slot} waits for {len(blockers)} transaction(s) in flight "
            "to end: " + "; ".join(str(b) for b in blockers[:3])
        )

    say(f"creating slot {pipe.slot} with an exported snapshot")
    spark = spark_session(settings, f"cdc-snapshot-{pipe.name}")
    with exported_snapshot(
        replication_dsn(settings, replication=True), settings.postgres.dsn(), pipe.slot, waiting
    ) as point:
        lsn = int_to_lsn(point.lsn)
        say(f"snapshot {point.snapshot_name} at LSN {lsn}: reading {len(tables)} table(s)")
        rows = _copy_tables(settings, spark, tables, point, console)
    # a generation: stores that hold it whole drop what they hold from before it
    record_generation(
        settings, point.lsn, point.ts_ms, [change_topic(pipe, t.qualified) for t in tables]
    )
    # the columns the snapshot's rows hold: DDL after it that changes values unseen is
    # found by the apply job (cdc/capture/rewrites.py)
    record_schemas(settings, tables)

    with admin_connection(settings) as conn:
        conn.autocommit = True
        mark_done(conn, pipe.name, lsn, point.ts_ms, sum(rows.values()))
    say(f"snapshot done: {sum(rows.values())} rows; starting the connector on slot {pipe.slot}")
    try:
        # a new generation: the connector starts at the slot's consistent point, whatever
        # offset an earlier connector of this name left in Connect (contract point 11)
        register_connector(settings, tables, start_lsn=point.lsn, start_ts_ms=point.ts_ms)
    except ConnectorError as exc:
        raise ConnectorError(
            f"{exc} (the snapshot is complete and kept: rerun `cdc snapshot` to start streaming)"
        ) from None
    with admin_connection(settings) as conn:
        sync_truncate_triggers(conn)  # those a busy table kept setup from installing
    return SnapshotResult(lsn=lsn, rows=rows, seconds=time.monotonic() - started)


def _copy_tables(
    settings: Settings,
    spark: Any,
    tables: list[Table],
    point: SnapshotPoint,
    console: Console,
) -> dict[str, int]:
    """Write every table's snapshot events to its change topic; returns rows per table."""
    from pyspark.sql import functions as F

    pipe, pg = settings.pipeline, settings.postgres
    url = f"jdbc:postgresql://{pg.host}:{pg.port}/{pg.database}"
    init = (
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
        f"SET TRANSACTION SNAPSHOT '{point.snapshot_name}'; SET intervalstyle = 'iso_8601'"
    )
    props = {
        "user": pipe.replication_user,
        "password": replication_password(settings).get_secret_value(),
        "driver": "org.postgresql.Driver",
        "sessionInitStatement": init,
        "fetchsize": "10000",
        **pg.jdbc_ssl_params(),
    }
    now_ms = int(time.time() * 1000)
    frames = []
    with admin_connection(settings) as conn:
        for table in tables:
            query = event_query(table).as_string(conn)
            head, tail = envelope(table, point, pipe.topic_prefix, pg.database, now_ms)
            topic = change_topic(pipe, table.qualified)
            rows = f" AND ({table.row_filter})" if table.row_filter else ""
            for where in ctid_ranges(table.pages, pipe.snapshot_pages_per_reader):
                subquery = f"({query} WHERE {where}{rows}) AS snapshot_rows"
                frames.append(
                    spark.read.jdbc(url, subquery, properties=props).select(
                        "key",
                        F.concat(F.lit(head), F.col("after"), F.lit(tail)).alias("value"),
                        F.lit(topic).alias("topic"),
                    )
                )
    events = reduce(lambda a, b: a.unionAll(b), frames)
    if settings.kafka.oversized == "dead_letter":
        events = _hold_oversized(events, settings)
    topics = {change_topic(pipe, t.qualified): t for t in tables}
    start = {t: sum(p.values()) for t, p in end_offsets(settings.kafka, list(topics)).items()}

    done = threading.Event()
    with Progress(
        TextColumn("{task.description}", markup=False),  # names, not markup
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} rows/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks = {
            topic: progress.add_task(table.qualified, total=table.estimated_rows or None, rate="–")
            for topic, table in topics.items()
        }
        began = time.monotonic()

        def poll() -> None:
            while not done.wait(1.0):
                _update(progress, tasks, start, settings, began)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        (
            events.write.format("kafka")
            .options(**kafka_options(settings))
            .option("kafka.acks", "all")
            .option("kafka.enable.idempotence", "true")
            .option("kafka.linger.ms", "20")
            .option("kafka.batch.size", "524288")
            .option("kafka.compression.type", "lz4")
            # a row as large as kafka.max_message_bytes (the topics take it too)
            .option("kafka.max.request.size", str(settings.kafka.max_message_bytes))
            .option(
                "kafka.buffer.memory",
                str(max(32 * 1024 * 1024, 2 * settings.kafka.max_message_bytes)),
            )
            .save()
        )
        done.set()
        poller.join()
        written = _update(progress, tasks, start, settings, began, final=True)
    return {topics[t].qualified: n for t, n in written.items()}


def _hold_oversized(events: Any, settings: Settings) -> Any:
    """kafka.oversized = "dead_letter": a snapshot row larger than Kafka takes goes to the
    dead-letter topic as a letter (its table's topic, key and size), as the connector's
    transform sends a change (jvm/transforms HoldOversized); the others are as they were."""
    from pyspark.sql import functions as F

    limit = settings.kafka.max_message_bytes
    size = F.octet_length("key") + F.octet_length("value") + F.lit(1024)  # with framing
    over = size > F.lit(limit)
    error = F.concat(
        F.lit("a change event of "),
        size.cast("string"),
        F.lit(
            f" bytes is larger than kafka.max_message_bytes ({limit} bytes): held back "
            "(kafka.oversized = dead_letter)"
        ),
    )
    letter = F.to_json(
        F.struct(
            F.lit("capture").alias("store"),
            error.alias("error"),
            F.col("topic"),
            F.lit(-1).alias("partition"),
            F.lit(-1).alias("offset"),
            F.col("key"),
            F.lit(None).cast("string").alias("value"),
            size.alias("size"),
            F.struct(F.lit("r").alias("op")).alias("position"),
        )
    )
    return events.select(
        "key",
        F.when(over, letter).otherwise(F.col("value")).alias("value"),
        F.when(over, F.lit(dead_letter_topic(settings.pipeline)))
        .otherwise(F.col("topic"))
        .alias("topic"),
    )


def _update(
    progress: Progress,
    tasks: Any,
    start: Any,
    settings: Settings,
    began: float,
    final: bool = False,
) -> dict[str, int]:
    ends = end_offsets(settings.kafka, list(tasks))
    written = {t: sum(p.values()) - start[t] for t, p in ends.items()}
    elapsed = max(time.monotonic() - began, 1e-3)
    for topic, task in tasks.items():
        n = written[topic]
        total = n if final else max(progress.tasks[task].total or 0, n) or None
        progress.update(task, completed=n, total=total, rate=f"{n / elapsed:,.0f}")
    return written
