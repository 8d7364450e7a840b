"""The Debezium PostgreSQL connector of a pipeline: its configuration, registration, health."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from cdc.capture.connect_client import ConnectClient, connect_client
from cdc.capture.masks import MASK_TRANSFORM, read_salt, transform_masks
from cdc.capture.role import replication_password, write_secret
from cdc.capture.source_setup import SIGNAL_TABLE
from cdc.core.catalog import (
    DEBEZIUM_PLACEHOLDER,
    HEARTBEAT_TABLE,
    TRUNCATIONS_TABLE,
    WATERMARK_SCHEMA,
    Table,
    pipeline_placeholder,
)
from cdc.core.clients import kafka_jaas_config, kafka_java_config
from cdc.core.errors import ConnectorError
from cdc.core.postgres_client import admin_connection
from cdc.core.settings import Settings
from cdc.core.topics import (
    CUT_MESSAGE_PREFIX,
    change_topic,
    dead_letter_topic,
    notification_topic,
    signal_topic,
)

__all__ = [
    "DEBEZIUM_POSTGRES",
    "connector_config",
    "offset_reaches",
    "pipeline_connector_config",
    "register_connector",
    "start_offset",
    "wait_slot_active",
]

DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"
# kafka.oversized = "dead_letter" (jvm/transforms)
HOLD_TRANSFORM = "cdc.connect.HoldOversized"
log = logging.getLogger(__name__)


def connector_config(
    settings: Settings,
    *,
    topic_prefix: str,
    tables: Sequence[str],
    slot: str,
    publication: str,
    snapshot_mode: str = "no_data",
    user: str | None = None,
    password: str | None = None,
) -> dict[str, str]:
    """Configuration of a Debezium connector capturing `tables` ("schema.table")."""
    pg = settings.postgres
    return {
        "connector.class": DEBEZIUM_POSTGRES,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": pg.connector_host or pg.host,
        "database.port": str(pg.connector_port or pg.port),
        "database.user": user or pg.user,
        "database.password": password or pg.password.get_secret_value(),
        "database.dbname": pg.database,
        # TLS as cdc's own connections (Connect's JVM reads the CA file, on its machine)
        **{f"database.{key}": value for key, value in pg.jdbc_ssl_params().items()},
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(_regex_literal(t) for t in tables),
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": snapshot_mode,
        # a delete is followed by a tombstone so that compaction can drop the key
        "tombstones.on.delete": "true",
        # exact values: decimals as strings, times to the microsecond, intervals as ISO 8601
        "decimal.handling.mode": "string",
        "time.precision.mode": "adaptive_time_microseconds",
        "interval.handling.mode": "string",
        "hstore.handling.mode": "json",
        "binary.handling.mode": "bytes",
        "heartbeat.interval.ms": "10000",
        # hand changes to Kafka every 100 ms (not 500) and in batches of up to 8,192
        # events (not 2,048): lower capture latency, fewer round trips in a catch-up
        "poll.interval.ms": "100",
        "max.batch.size": "8192",
        "max.queue.size": "32768",
        # a topic Debezium makes itself (the pipeline makes its own first) has the
        # replicas of every topic of the pipeline
        "topic.creation.default.replication.factor": str(settings.kafka.replication_factor),
        "topic.creation.default.min.insync.replicas": str(settings.kafka.min_insync_replicas),
        "topic.creation.default.partitions": "1",
        "topic.creation.default.cleanup.policy": "compact",
        # a change event as large as kafka.max_message_bytes goes through (the topics and
        # the local broker take it too); the producer's buffer holds two of them
        **_sized(settings.kafka.max_message_bytes),
        # a change is acknowledged once every in-sync replica has it, and a retried send
        # is not written twice (Connect makes its producers without idempotence)
        **PRODUCER_DURABILITY,
        # retry retriable errors (PostgreSQL restarting, Kafka unavailable) for ever
        "errors.max.retries": "-1",
    }


# what every producer of the pipeline sets, here as the connector's overrides
PRODUCER_DURABILITY = {
    "producer.override.acks": "all",
    "producer.override.enable.idempotence": "true",
}


def _sized(limit: int) -> dict[str, str]:
    return {
        "producer.override.max.request.size": str(limit),
        "producer.override.buffer.memory": str(max(32 * 1024 * 1024, 2 * limit)),
        "topic.creation.default.max.message.bytes": str(limit),
    }


def _placeholder(settings: Settings, client: ConnectClient, name: str) -> str:
    """The pipeline's placeholder for an unchanged TOASTed value. A connector that runs
    already keeps its own (its events in the topics hold it): the record follows it."""
    pipeline = settings.pipeline.name
    with admin_connection(settings) as conn:
        recorded = pipeline_placeholder(conn, pipeline)
        if name not in client.connectors():
            return recorded
        running = client.config(name).get("unavailable.value.placeholder", DEBEZIUM_PLACEHOLDER)
        if running != recorded:
            conn.execute(
                "INSERT INTO cdc.placeholders (pipeline, placeholder) VALUES (%s, %s) "
                "ON CONFLICT (pipeline) DO UPDATE SET placeholder = excluded.placeholder",
                (pipeline, running),
            )
            conn.commit()
            log.warning("%s: kept the connector's TOAST placeholder", pipeline)
        return str(running)


def pipeline_connector_config(
    settings: Settings, tables: Sequence[Table], placeholder: str, salt: str | None = None
) -> dict[str, str]:
    """The pipeline's connector: it streams from the slot the snapshot made (no_data).
    `placeholder`: the pipeline's own for an unchanged TOASTed value (cdc.placeholders);
    `salt`: its masks' (cdc.mask_salts), needed when a table masks a column."""
    pipe = settings.pipeline
    config = connector_config(
        settings,
        topic_prefix=pipe.topic_prefix,
        # cdc.truncations: a TRUNCATE of a captured table, as a keyed row
        tables=[*(t.qualified for t in tables), TRUNCATIONS_TABLE],
        slot=pipe.slot,
        publication=pipe.publication,
        user=pipe.replication_user,
        password=replication_password(settings).get_secret_value(),
    )
    # The publication is the filter: it holds each captured table by its OID, and
    # follows it through a rename (cdc/core/identity.py). A name filter here would drop every
    # change of a renamed table without a word while the slot moves on; without one, the
    # changes go to the new name's topic. Only the signal table there is not wanted in
    # the log: the TRUNCATE records are data, and the heartbeat table's rows (written
    # every heartbeat interval, to a topic of their own) tell how far the capture has
    # come in PostgreSQL's time (cdc/capture/lag.py).
    del config["table.include.list"]
    config.update(
        {
            "table.exclude.list": _regex_literal(SIGNAL_TABLE),
            # the setup keeps the publication exact: Debezium must not create or alter it
            "publication.autocreate.mode": "disabled",
            # a secret of the pipeline's: no value a user stores is taken for it
            "unavailable.value.placeholder": placeholder,
            "slot.drop.on.stop": "false",
            # a slot Debezium makes is a failover slot on PostgreSQL 17+ (ignored before),
            # as the snapshot's is (cdc/capture/slot.py)
            "slot.failover": "true",
            "heartbeat.interval.ms": str(pipe.heartbeat_interval_ms),
            "heartbeat.action.query": (
                f"INSERT INTO {HEARTBEAT_TABLE} (pipeline, ts) VALUES ('{pipe.name}', now()) "
                "ON CONFLICT (pipeline) DO UPDATE SET ts = excluded.ts"
            ),
            "provide.transaction.metadata": "true",
            # a cut's marker only (cdc/check/verify.py): another program's logical
            # decoding messages do not leave the database
            "message.prefix.include.list": _regex_literal(CUT_MESSAGE_PREFIX),
            **_signals(settings),
            "incremental.snapshot.chunk.size": "2048",
            # a column filter makes a backfill select the columns of Debezium's schema by
            # name: its `SELECT *` also returns generated columns, which the schema (from
            # pgoutput) lacks, and fails the backfill ("Column not found", DBZ-4350). The
            # columns pipeline.table leaves out are left out here too: a backfill reads
            # the schema Debezium read at its start, before any change names the
            # publication's columns
            **_column_filter(tables),
            # backfill progress comes back as notifications on a topic
            "notification.enabled.channels": "sink",
            "notification.sink.topic.name": notification_topic(pipe),
            "topic.creation.default.partitions": str(pipe.partitions),
            # Connect makes only the topics of names the setup did not: a table renamed
            # since (`cdc setup` compacts its topic when it captures it under that name),
            # or renamed and back in one transaction, whose change in between Debezium
            # sends without a key (the name is gone when it looks the key up). Kept 30
            # days, uncompacted: a compacted topic refuses a record without a key, and
            # the task would fail on it for ever.
            "topic.creation.default.cleanup.policy": "delete",
            "topic.creation.default.retention.ms": "2592000000",
        }
    )
    masks = transform_masks(
        [*tables],
        lambda name: change_topic(pipe, name),
        also=[TRUNCATIONS_TABLE, SIGNAL_TABLE, HEARTBEAT_TABLE],
    )
    if masks is not None:
        if salt is None:
            raise ValueError("a table masks a column: the pipeline's salt is needed")
        # masked before anything reaches Kafka (jvm/transforms); the salt is a secret,
        # named by a reference to the worker's secrets file (register_connector)
        config.update(
            {
                "transforms": "mask",
                "transforms.mask.type": MASK_TRANSFORM,
                "transforms.mask.masks": masks,
                "transforms.mask.salt": salt,
                "transforms.mask.placeholder": placeholder,
            }
        )
    if settings.kafka.oversized == "dead_letter":
        # an event over the limit goes to the dead-letter topic as a letter (its size,
        # key and position), after the masks: capture of every other row goes on
        chain = [*filter(None, config.get("transforms", "").split(",")), "hold"]
        config.update(
            {
                "transforms": ",".join(chain),
                "transforms.hold.type": HOLD_TRANSFORM,
                "transforms.hold.max.bytes": str(settings.kafka.max_message_bytes),
                "transforms.hold.topic": dead_letter_topic(pipe),
            }
        )
    # every table's key named, not only a configured one's: Debezium reads a table's
    # primary key from the catalog by the name its change was made under, and a change
    # it decodes after the table was renamed finds none there: keyless, the record is
    # refused by the compacted topic and the task dies (a rename while capture is behind)
    keyed = [
        f"{_java_regex_literal(t.qualified)}:{','.join(t.key)}"
        for t in tables
        if not _SPLITS.search(t.qualified) and not any(_UNSAFE_COLUMN.search(c) for c in t.key)
    ]
    if keyed:
        config["message.key.columns"] = ";".join(keyed)
    return config


# what message.key.columns cannot hold in a name (it splits on these); a key column's
# name is read as a regular expression too: one holding its syntax keeps the lookup
_SPLITS = re.compile(r"[\s:;,]")
_UNSAFE_COLUMN = re.compile(r"[\s:;,()\[\]{}\\.*+?^$|]")


def _column_filter(tables: Sequence[Table]) -> dict[str, str]:
    excluded = [_java_regex_literal(f"{t.qualified}.{name}") for t in tables for name in t.excluded]
    if not excluded:
        return {"column.include.list": ".*"}
    return {"column.exclude.list": ",".join(excluded)}


def _java_regex_literal(text: str) -> str:
    """`text` as a Java regular expression that matches it alone: ASCII punctuation
    escaped (a backslash before a letter or digit would mean something else)."""
    return "".join(
        "\\" + ch if ch.isascii() and not ch.isalnum() and ch != "_" else ch for ch in text
    )


def _regex_literal(table: str) -> str:
    """table.include.list takes regular expressions: match this name exactly."""
    return table.replace(".", r"\.")


def secret_reference(
    settings: Settings, key: str, value: str, *, connector: str | None = None
) -> str:
    """The value to put in a connector config for a secret.

    The secret goes to a file (0600, its folder 0700) that the worker reads with its
    FileConfigProvider, and the config names it (`${file:path:key}`), so neither the REST
    API nor Connect's config topic ever holds it (one file per connector, the pipeline's
    unless `connector` is named). The local worker's folder is
    data_dir/connect/secrets; your own worker's is connect.secrets_dir (as the worker sees
    it: connect.worker_secrets_dir). Only with connect.inline_secrets is the value itself
    put in the config.
    """
    connect = settings.connect
    if connect.managed:
        folder, seen_as = settings.data_dir / "connect" / "secrets", None
    elif connect.secrets_dir is not None:
        folder, seen_as = connect.secrets_dir, connect.worker_secrets_dir
    elif connect.inline_secrets:
        return value
    else:
        raise ConnectorError(
            "Connect is not run by cdc (connect.managed = false) and connect.secrets_dir is "
            "not set: the connector's password would be kept in Connect's config topic and "
            "shown by its REST API; set connect.secrets_dir to a folder the worker reads "
            "(see docs/security.md), or connect.inline_secrets = true to accept that"
        )
    path = folder / f"{connector or settings.pipeline.connector}.properties"
    entries = {}
    if path.exists():
        entries = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    # as java.util.Properties reads it back
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    entries[key] = "\\" + escaped if escaped[:1].isspace() else escaped
    write_secret(path, "".join(f"{k}={v}\n" for k, v in entries.items()))
    shown = f"{seen_as.rstrip('/')}/{path.name}" if seen_as else str(path)
    return f"${{file:{shown}:{key}}}"


def start_offset(lsn: int, ts_ms: int | None = None) -> dict[str, int | str]:
    """The source offset that starts Debezium at a slot's consistent point `lsn`.

    It is the offset Debezium keeps after a COMMIT at `lsn` (PostgresOffsetContext.getOffset:
    lsn, lsn_commit, messageType, ts_usec) less lsn_proc, on purpose. Without lsn_proc
    Debezium skips its WAL position search and streams from `lsn` as it is: PostgreSQL sends
    every transaction that commits at or after `lsn`, whole, even one that began before it,
    exactly as to a connector with no offset. With lsn_proc = `lsn`, the search
    (WalPositionLocator, Debezium 3.6) would take a change at exactly `lsn` (the record right
    after the point, written by a transaction open across it) for the last one processed and
    resume after it, dropping that transaction's BEGIN and earlier changes. And the last
    commit loaded is `lsn` (with no offset it is null until the first COMMIT), so the first
    transaction's events carry source.sequence [lsn, <own LSN>] like every later one.
    """
    offset: dict[str, int | str] = {"lsn": lsn, "lsn_commit": lsn, "messageType": "COMMIT"}
    if ts_ms is not None:
        offset["ts_usec"] = ts_ms * 1000
    return offset


def offset_reaches(offset: dict[str, Any], lsn: int) -> bool:
    """Whether a stored Debezium offset is at or past `lsn`, a slot's consistent point.

    The connector of a generation starts at its point and only moves forward, so one that
    is not holds an older generation's position, from before the slot existed.
    """
    positions = [offset.get(k) for k in ("lsn_commit", "lsn", "lsn_proc")]
    return any(isinstance(p, int) and p >= lsn for p in positions)


def register_connector(
    settings: Settings,
    tables: Sequence[Table],
    timeout: float = 90.0,
    *,
    start_lsn: int | None = None,
    start_ts_ms: int | None = None,
) -> None:
    """Create or update the pipeline's connector and wait until it streams from the slot.

    start_lsn, the consistent point of the slot the pipeline's snapshot made, says where a
    connector this call creates starts: it is created stopped, its offset is set to
    start_offset(start_lsn) unless the one Connect holds under its name is of this
    generation already (an earlier generation's, which outlives `cdc drop`, would resume
    from before the slot and fail), and it is resumed. A connector found stopped (its start
    was interrupted) is started the same way. A running connector keeps its offsets.
    """
    client = connect_client(settings)
    name = settings.pipeline.connector
    salt = None
    if any(t.masks for t in tables):
        with admin_connection(settings) as conn:
            salt = read_salt(conn, settings.pipeline)
    config = pipeline_connector_config(settings, tables, _placeholder(settings, client, name), salt)
    config["database.password"] = secret_reference(
        settings, "database.password", config["database.password"]
    )
    if SIGNAL_LOGIN in config:
        config[SIGNAL_LOGIN] = secret_reference(settings, "kafka.jaas", config[SIGNAL_LOGIN])
    if "transforms.mask.salt" in config:
        config["transforms.mask.salt"] = secret_reference(
            settings, "mask.salt", config["transforms.mask.salt"]
        )
    connectors = client.connectors()
    existing = name in connectors
    state = connectors.get(name, {}).get("status", {}).get("connector", {}).get("state")
    old_reader = None
    if start_lsn is not None and (not existing or state == "STOPPED"):
        _start_at(client, settings, config, start_lsn, start_ts_ms, existing)
    elif existing and _same_config(client.config(name), config):
        client.wait_running(name, timeout=timeout)
        wait_slot_active(settings, settings.pipeline.slot, timeout=timeout)
        return
    else:
        if existing and _moved(client.config(name), config):
            check_log_within_fork(settings, client)
        old_reader = _slot_reader(settings) if existing else None
        client.put_config(name, config)
    # a reconfigured connector restarts its task: wait for the task that runs the new
    # configuration, and for its own replication connection, before anyone relies on it
    deadline = time.monotonic() + timeout
    # a task that failed with the old configuration (e.g. stopped at an event larger
    # than the old kafka.max_message_bytes) is started again at that event with the new
    # one; Connect may show its old failure a while: one still there after that is real
    tasks = connectors.get(name, {}).get("status", {}).get("tasks", [])
    was_failed = any(t.get("state") == "FAILED" for t in tasks)
    grace = time.monotonic() + (30 if was_failed else 0)
    while True:
        try:
            client.wait_running(name, timeout=max(deadline - time.monotonic(), 1))
        except ConnectorError:
            if time.monotonic() > grace:
                raise
            client.restart_failed(name)
            time.sleep(2)
            continue
        if _took(client, name, config):
            break
        if time.monotonic() > deadline:
            raise ConnectorError(f"connector {name} did not take its new configuration")
        time.sleep(0.5)
    wait_slot_active(
        settings,
        settings.pipeline.slot,
        timeout=max(deadline - time.monotonic(), 5),
        not_pid=old_reader,
    )


SIGNAL_LOGIN = "signal.consumer.sasl.jaas.config"


def _signals(settings: Settings) -> dict[str, str]:
    """Where Debezium takes its signals. By default from the signal table (a row `cdc
    backfill` inserts, seen in the log), and a backfill's watermarks are rows written
    there too. With pipeline.read_only_backfills, from a Kafka topic instead, and the
    watermarks are pg_current_snapshot() (read.only): nothing written to the source."""
    pipe = settings.pipeline
    if not pipe.read_only_backfills:
        return {"signal.enabled.channels": "source", "signal.data.collection": SIGNAL_TABLE}
    kafka = settings.kafka
    # the login (register_connector puts it in the worker's secrets file)
    jaas = kafka_jaas_config(kafka)
    return {
        "read.only": "true",
        # its watermark, pg_current_snapshot(), is then cdc_watermarks' (it waits for the
        # commits in flight first: sql/pipeline_schema.sql)
        "database.initial.statements": (
            f'SET search_path TO {WATERMARK_SCHEMA}, pg_catalog, "$user", public'
        ),
        "signal.enabled.channels": "kafka",
        "signal.kafka.topic": signal_topic(pipe),
        "signal.kafka.bootstrap.servers": kafka.bootstrap,
        # the consumer commits what it has taken: a restarted task does not take a
        # signal again (one taken mid-backfill is in the connector's offsets)
        "signal.kafka.groupId": f"{pipe.connector}-signals",
        **{f"signal.consumer.{k}": v for k, v in kafka_java_config(kafka, jaas).items()},
    }


def _moved(stored: dict[str, str], config: dict[str, str]) -> bool:
    """Whether `config` points the connector at another server than it streamed from."""
    where = ("database.hostname", "database.port", "database.dbname")
    return any(stored.get(k) != config.get(k) for k in where)


def check_log_within_fork(settings: Settings, client: ConnectClient) -> None:
    """Before the connector streams from a server it did not stream from (a promoted
    standby): if that server writes on a timeline that left its parent before a
    position the connector already delivered to the log, the log holds changes the
    server never had, and the connector would skip the server's own changes up to its
    stored position. Refuse (SourceRewoundError) instead of streaming on."""
    from cdc.capture.slot import int_to_lsn
    from cdc.capture.source_reader import source_lineage
    from cdc.capture.timeline import timeline_forks
    from cdc.core.errors import SourceRewoundError

    with admin_connection(settings) as conn:
        _, timeline = source_lineage(conn)
    if timeline is None or timeline <= 1:
        return
    forks = timeline_forks(settings, timeline)
    past = log_past_fork(forks, logged_position(client, settings.pipeline.connector))
    if past is None:
        return
    parent, held = past
    pg = settings.postgres
    raise SourceRewoundError(
        f"PostgreSQL at {pg.host}:{pg.port} writes on timeline {timeline}, which left "
        f"timeline {parent} at {int_to_lsn(forks[parent])}, but the connector already "
        f"delivered changes of timeline {parent} up to {int_to_lsn(held)}: the log holds "
        "changes this server never had (was synchronized_standby_slots set on the old "
        "primary?). Stop `cdc apply`, run `cdc drop`, set a new pipeline.topic_prefix, "
        "`cdc snapshot`, then `cdc rebuild --store S` for each store"
    )


def log_past_fork(forks: dict[int, int], held: int | None) -> tuple[int, int] | None:
    """(the parent timeline, the log's newest position) when the log holds positions of
    the parent timeline past where the server's timeline left it, else None. `forks`:
    per ancestor timeline, the first position not on it; the parent is the newest
    (the timeline the connector streamed on before the promotion). A change record
    ending exactly at the fork (a commit's end) is on both."""
    if not forks or held is None:
        return None
    parent = max(forks)
    return (parent, held) if held > forks[parent] else None


def logged_position(client: ConnectClient, connector: str) -> int | None:
    """The newest WAL position the connector has delivered to Kafka, as the offset Connect
    holds for it says (None when it holds none)."""
    positions = [
        p
        for entry in client.offsets(connector)
        for k in ("lsn_commit", "lsn", "lsn_proc")
        if isinstance(p := (entry.get("offset") or {}).get(k), int)
    ]
    return max(positions, default=None)


def _same_config(stored: dict[str, str], config: dict[str, str]) -> bool:
    """Whether Connect holds `config` (it adds the connector's name to what it shows)."""
    return {k: v for k, v in stored.items() if k != "name"} == config


def _took(client: ConnectClient, name: str, config: dict[str, str]) -> bool:
    """Whether every task of the connector runs with `config`."""
    try:
        tasks = client.task_configs(name)
    except ConnectorError:
        tasks = []
    return bool(tasks) and all(_runs(t, config) for t in tasks)


def _runs(task: dict[str, Any], config: dict[str, str]) -> bool:
    """Whether a task's configuration is `config` (its secrets aside: Connect may show
    them resolved)."""
    return all(task.get(k) == v for k, v in config.items() if "password" not in k)


def _start_at(
    client: ConnectClient,
    settings: Settings,
    config: dict[str, str],
    lsn: int,
    ts_ms: int | None,
    existing: bool,
) -> None:
    """Create the connector stopped (or reconfigure it, stopped), put its offset at `lsn`
    unless it is there already, and resume it."""
    name = settings.pipeline.connector
    if not existing:
        client.create_stopped(name, config)
    elif not _same_config(client.config(name), config):
        client.put_config(name, config)  # a stopped connector stays stopped
    partition = {"server": settings.pipeline.topic_prefix}
    stored = [o["offset"] for o in client.offsets(name) if o.get("partition") == partition]
    if not (stored and offset_reaches(stored[0], lsn)):
        offset = start_offset(lsn, ts_ms)
        log.info("connector %s starts at offset %s (was %s)", name, offset, stored or "none")
        client.set_offsets(name, [{"partition": partition, "offset": offset}])
    client.resume(name)


def _slot_reader(settings: Settings) -> int | None:
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
            (settings.pipeline.slot,),
        ).fetchone()
    return row[0] if row else None


def wait_slot_active(
    settings: Settings, slot: str, timeout: float = 60.0, not_pid: int | None = None
) -> None:
    """Wait until the connector streams from its replication slot (from a backend other
    than not_pid, the one a restarted task replaced).

    Changes committed before the slot exists are not captured, so callers wait
    for this before they write.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            ).fetchone()
            if row and row[0] and (not_pid is None or row[1] != not_pid):
                return
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"replication slot {slot} is not streaming after {timeout:.0f}s; "
                    "check `cdc status` and the Connect log"
                )
            time.sleep(0.2)
