"""The copy of the captured tables under the snapshot (initial.py, module doc): each
table's CTID ranges read by Spark a few at a time, formatted by PostgreSQL as
Debezium's events (events.py), written to its change topic, and each group, once in
Kafka, recorded and handed to the stores that take it (`IntoStores`); its progress
shown, and the rows over Kafka's message size held in the dead-letter topic."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import reduce
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

from cdc.capture.role import replication_password
from cdc.capture.slot import (
    SnapshotPoint,
)
from cdc.capture.snapshot.events import envelope, event_query
from cdc.capture.snapshot.ranges import ctid_clause, page_ranges, relation_identity
from cdc.capture.snapshot.record import (
    ReadRange,
    record_ranges,
)
from cdc.core.catalog import Table
from cdc.core.errors import SnapshotError
from cdc.core.postgres_client import admin_connection
from cdc.core.say import Say
from cdc.core.settings import Settings
from cdc.core.spark import jdbc_ssl_options, kafka_options
from cdc.core.topics import (
    change_topic,
    dead_letter_topic,
    end_offsets,
    key_partition,
)

__all__ = ["IntoStores", "StoresThread", "copy_tables"]


# a group of snapshot events into the stores that take them: the group's Kafka records
# (key, value, topic, partition, offset), the end offset of each "topic:partition" once
# the group is in Kafka, and how many records the group wrote
IntoStores = Callable[[Any, dict[str, int], int], None]


def copy_tables(
    settings: Settings,
    spark: Any,
    tables: list[Table],
    point: SnapshotPoint,
    console: Console,
    identities: dict[str, tuple[int, str]],
    stores: StoresThread | None = None,
    rest: dict[str, str] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """Write every table's snapshot events to its change topic; returns rows per table,
    and the tables whose files (`identities`: as they were before the snapshot) changed
    before the last of their ranges was read: their copy stopped there, and what was read
    of them may miss rows (a rewrite moved them into pages read before, or out of the
    snapshot's sight), so they are to be backfilled whole. A table dropped (and created
    again) meanwhile stops the run: the one after it resumes with the relation as the
    publication and the capture set hold it then. `stores`: each group, once in Kafka,
    also into the stores that take it (module doc), in their thread (the caller waits
    for it). `rest` (a resumed snapshot's, _read_rest): only the rows of each table that
    match its filter, in no recorded range (a run after this one reads them again)."""
    from pyspark import StorageLevel
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
        **jdbc_ssl_options(settings),
    }
    now_ms = int(time.time() * 1000)
    pieces: list[tuple[Table, ReadRange, Any, int]] = []  # each CTID range: its events, pages
    wraps: dict[str, tuple[str, str]] = {}  # topic -> the envelope's text around `after`
    with admin_connection(settings) as conn:
        for table in tables:
            query = event_query(table).as_string(conn)
            topic = change_topic(pipe, table.qualified)
            wraps[topic] = envelope(table, point, pipe.topic_prefix, pg.database, now_ms)
            rows = f" AND ({table.row_filter})" if table.row_filter else ""
            if rest is not None:
                rows += f" AND {rest[table.qualified]}"
            relid, files = identities[table.qualified]
            for first, end in page_ranges(table.pages, pipe.snapshot_pages_per_reader):
                subquery = f"({query} WHERE {ctid_clause(first, end)}{rows}) AS snapshot_rows"
                frame = spark.read.jdbc(url, subquery, properties=props).select(
                    "key", "after", F.lit(topic).alias("topic")
                )
                pages = (end if end is not None else max(table.pages, first + 1)) - first
                pieces.append((table, ReadRange(relid, files, first, end), frame, pages))
    # a few ranges per Spark job (one range per task slot: one wave of tasks; small
    # tables share one), each group recorded once in Kafka: a run after a crash reads
    # only the rest
    slots = max(1, int(spark.sparkContext.defaultParallelism))
    group_pages = slots * pipe.snapshot_pages_per_reader
    groups: list[list[tuple[Table, ReadRange, Any]]] = [[]]
    held = 0
    for table, read, frame, pages in pieces:
        if held >= group_pages:
            groups.append([])
            held = 0
        groups[-1].append((table, read, frame))
        held += max(1, pages)
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
        changed: list[str] = []
        stores = stores or StoresThread(None)
        for chunk in groups:
            chunk = [(t, r, f) for t, r, f in chunk if t.qualified not in changed]
            if not chunk:
                continue
            rows = reduce(lambda a, b: a.unionAll(b), [f for _, _, f in chunk])
            if stores.into is None:
                _write(settings, _events(rows, wraps))
            else:  # read once (kept on disk): the same rows go to Kafka, then into the stores
                rows = rows.persist(StorageLevel.DISK_ONLY)  # the heap is for the collect
                try:
                    before = _ends(settings, list(topics))
                    _write(settings, _events(rows, wraps))
                    after = _ends(settings, list(topics))
                except BaseException:
                    rows.unpersist()
                    raise
                records = _as_records(settings, rows, wraps, point, after)
                stores.put(rows, records, after, before)
            with admin_connection(settings) as conn:
                conn.autocommit = True
                if rest is None:
                    record_ranges(conn, pipe.name, [r for _, r, _ in chunk])
                # no lock is held between two groups: a rewrite there (VACUUM FULL,
                # CLUSTER, pg_repack) moves unread rows into pages read, or out of the
                # snapshot's sight. A table whose identity, read after the group, is still
                # the one from before the snapshot was not rewritten before the group's
                # reads ended (a rewrite waits for the readers' locks): every row of the
                # ranges read so far was read.
                for table in {t.qualified: t for t, _, _ in chunk}.values():
                    relid, files = relation_identity(conn, table)
                    if relid != identities[table.qualified][0]:
                        raise SnapshotError(
                            f"table {table.qualified} was dropped and created again while "
                            "the snapshot read it: run `cdc snapshot` again (it resumes, "
                            "and cuts the table in every store before it backfills it)"
                        )
                    if files != identities[table.qualified][1]:
                        changed.append(table.qualified)
        done.set()
        poller.join()
        written = _update(progress, tasks, start, settings, began, final=True)
    return {topics[t].qualified: n for t, n in written.items()}, changed


class StoresThread:
    """The groups into the stores (`into`), one at a time in a thread of their own, each
    once it is in Kafka: the next group's read and write to Kafka go on meanwhile, and
    the connector starts while the last ones are written. A group whose write failed
    stops every later one (what a store holds is recorded as offsets below which it
    holds every record) and the copy at its next group. `close` waits for the thread,
    however the snapshot ends."""

    def __init__(self, into: IntoStores | None) -> None:
        self.into = into
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="into-stores") if into else None
        self.failed: BaseException | None = None

    def put(self, rows: Any, records: Any, after: dict[str, int], before: dict[str, int]) -> None:
        """Write a group (its cached `rows`, as `records`) into the stores, after the one
        before it; `before`/`after`: each partition's end offset around its Kafka write."""
        assert self.into is not None and self.pool is not None
        self.check()
        into, count = self.into, sum(after.values()) - sum(before.values())

        def write() -> None:
            try:
                if self.failed is None:
                    into(records, after, count)
            except BaseException as exc:
                self.failed = exc
            finally:
                rows.unpersist()

        self.pool.submit(write)

    def check(self) -> None:
        """Raise the failure of a group written so far, if one failed."""
        if self.failed is not None:
            raise self.failed

    def done(self, say: Say) -> None:
        """Wait for the last group. A group that failed is said, not raised: the snapshot
        is whole in Kafka, and the store's apply reads the groups it lacks from there."""
        if self.pool is None:
            return
        say("the snapshot's last groups go into the stores that take them")
        self.close()
        if self.failed is not None:
            why = (str(self.failed).strip().splitlines() or [type(self.failed).__name__])[0]
            say(
                f"a group of the snapshot did not go into the stores itself ({why[:200]}): "
                "their apply reads the rest of it from Kafka"
            )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _ends(settings: Settings, topics: list[str]) -> dict[str, int]:
    """The end offset of each "topic:partition" of `topics`."""
    ends = end_offsets(settings.kafka, topics)
    return {f"{t}:{p}": end for t, parts in ends.items() for p, end in parts.items()}


def _events(rows: Any, wraps: dict[str, tuple[str, str]]) -> Any:
    """A group's rows (key, after, topic) as their snapshot events (key, value, topic):
    `after` in its table's envelope (`wraps`: per topic, the text before and after it)."""

    return rows.select("key", _event_value(wraps).alias("value"), "topic")


def _event_value(wraps: dict[str, tuple[str, str]]) -> Any:
    """A row's snapshot event, from its `after` and `topic` (`_events`)."""
    from pyspark.sql import functions as F

    def text(at: int) -> Any:
        pairs = [x for t, w in sorted(wraps.items()) for x in (F.lit(t), F.lit(w[at]))]
        return F.create_map(*pairs)[F.col("topic")]

    return F.concat(text(0), F.col("after"), text(1))


def _as_records(
    settings: Settings,
    rows: Any,
    wraps: dict[str, tuple[str, str]],
    point: SnapshotPoint,
    ends: dict[str, int],
) -> Any:
    """A group's rows (key, after, topic) as the Kafka records their events are now
    (`ends`: each "topic:partition"'s end offset once the group is in), for a store:
    key and value as bytes, the partition Kafka's producers picked for the key, and as
    offset the last one of that partition, no lower than the record's own (a store takes
    a record of that partition at or below it as one it holds). The value is the event
    with only what a store reads of it (op, after, and the source's time, position and
    snapshot flag): a third of the bytes to move. A record held back as oversized
    (kafka.oversized = dead_letter) is not among them."""
    from pyspark.sql import functions as F

    counts: dict[str, int] = {}
    for where in ends:
        topic = where.rpartition(":")[0]
        counts[topic] = counts.get(topic, 0) + 1
    partition = None
    for topic, n in sorted(counts.items()):
        mine = F.col("topic") == topic
        p = key_partition(F.col("key"), n)
        partition = F.when(mine, p) if partition is None else partition.when(mine, p)
    last = F.create_map(*[x for w, end in sorted(ends.items()) for x in (F.lit(w), F.lit(end - 1))])
    if (over := _oversized(settings, _event_value(wraps))) is not None:  # as Kafka was sent it
        rows = rows.where(~over)
    source = json.dumps(
        {"ts_ms": point.ts_ms, **point.source_position(), "snapshot": "true"},
        separators=(",", ":"),
    )
    value = F.concat(F.lit('{"op":"r","after":'), F.col("after"), F.lit(f',"source":{source}}}'))
    records = rows.withColumn("partition", partition).where(F.col("partition").isNotNull())
    return records.select(
        F.col("key").cast("binary").alias("key"),
        value.cast("binary").alias("value"),
        "topic",
        "partition",
        F.element_at(
            last, F.concat(F.col("topic"), F.lit(":"), F.col("partition").cast("string"))
        ).alias("offset"),
    )


def _write(settings: Settings, events: Any) -> None:
    """Write snapshot events to their topics, and return once Kafka has them all."""
    if settings.kafka.oversized == "dead_letter":
        events = _hold_oversized(events, settings)
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


def _hold_oversized(events: Any, settings: Settings) -> Any:
    """kafka.oversized = "dead_letter": a snapshot row larger than Kafka takes goes to the
    dead-letter topic as a letter (its table's topic, key and size), as the connector's
    transform sends a change (jvm/transforms HoldOversized); the others are as they were."""
    from pyspark.sql import functions as F

    limit = settings.kafka.max_message_bytes
    size = _size()
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


def _size(value: Any = "value") -> Any:
    """A snapshot event's size as Kafka counts it against max.message.bytes, with framing
    (`value`: the event's column or expression)."""
    from pyspark.sql import functions as F

    return F.octet_length("key") + F.octet_length(value) + F.lit(1024)


def _oversized(settings: Settings, value: Any) -> Any | None:
    """Whether _hold_oversized sends a row's event (`value`) to the dead-letter topic
    (None: it sends none there)."""
    from pyspark.sql import functions as F

    if settings.kafka.oversized != "dead_letter":
        return None
    return _size(value) > F.lit(settings.kafka.max_message_bytes)


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
