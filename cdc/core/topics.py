"""The pipeline's log: every topic's name and spec, and the topics created on purpose
(fixed partitions, compaction), read back and truncated.

Every topic name comes from here: a table's change topic (as Debezium names it), the
TRUNCATE topic, the heartbeat table's and Debezium's heartbeat topics, the transaction,
notification and dead-letter topics, and the pattern the apply job subscribes to."""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaError

from cdc.core.catalog import HEARTBEAT_TABLE, TRUNCATIONS_TABLE
from cdc.core.clients import kafka_admin, kafka_client_kwargs
from cdc.core.errors import SourceError, TopicError
from cdc.core.settings.connections import KafkaSettings
from cdc.core.settings.pipeline import PipelineSettings

__all__ = [
    "CUT_MESSAGE_PREFIX",
    "ChangeRecord",
    "HeartbeatMark",
    "TopicSpec",
    "change_times",
    "change_topic",
    "change_topic_ends",
    "change_topic_pattern",
    "change_topic_spec",
    "check_names_apart",
    "connect_topics",
    "dead_letter_topic",
    "end_offsets",
    "ensure_topics",
    "ever_written",
    "folder_problem",
    "heartbeat_rows_topic",
    "heartbeat_topic",
    "key_partition",
    "last_heartbeat",
    "live_brokers",
    "notification_topic",
    "pipeline_topic_specs",
    "read_topic",
    "reassignment_plan",
    "replication_factors",
    "replication_problem",
    "set_topic_configs",
    "thinned",
    "too_few_brokers",
    "topic_kafka_configs",
    "topic_name",
    "transaction_topic",
    "truncate_topics",
    "under_replicated",
    "wait_for_records",
    "written_since",
]

log = logging.getLogger(__name__)

# the prefix of the logical decoding messages `cdc verify` writes at a cut (the only
# prefix the connector passes on, to `<prefix>.message`: cdc/check/verify.py)
CUT_MESSAGE_PREFIX = "cdc.cut"


def topic_name(prefix: str, table: str) -> str:
    """`<prefix>.<schema.table>` as Debezium names the topic: each character Kafka does
    not take in a topic name (other than letters, digits, `.`, `_`, `-`) as `_`, at most
    249 characters (TopicNamingStrategy.sanitizedTopicName)."""
    name = "".join(
        c if c in "._-" or (c.isascii() and c.isalnum()) else "_" for c in f"{prefix}.{table}"
    )
    return name[:249]


def change_topic(pipeline: PipelineSettings, table: str) -> str:
    """The change topic of "schema.table" (the TRUNCATE table's too)."""
    return topic_name(pipeline.topic_prefix, table)


def folder_problem(table: str) -> str | None:
    """Why the table's schema or name cannot be a warehouse folder (`<schema>/<name>`):
    a `/` or `\\` would reach another folder, `.` and `..` are folders already, and the
    schema `_views` holds the derived views. None when it can."""
    schema, name = table.split(".", 1)
    for part, what in ((schema, "schema"), (name, "name")):
        if "/" in part or "\\" in part:
            return f"its {what} holds a path separator (/ or \\)"
        if part in (".", ".."):
            return f"its {what} is {part!r}"
    if schema == "_views":
        return "the warehouse keeps its derived views under the folder _views"
    return None


def check_names_apart(tables: list[str], pipeline: PipelineSettings) -> None:
    """Refuse a table whose name cannot be a warehouse folder (folder_problem), and two
    tables that would share a change topic (Debezium replaces the characters a topic
    name cannot hold) or a search index (index names are lower case)."""

    def topic(table: str) -> str:
        return change_topic(pipeline, table)

    def index(table: str) -> str:
        return change_topic(pipeline, table).lower()

    for table in tables:
        if problem := folder_problem(table):
            raise SourceError(
                f"table {table} cannot be captured: {problem}; rename it, or leave it out "
                "(pipeline.tables, pipeline.exclude_tables)"
            )
    for what, name_of in (("change topic", topic), ("search index", index)):
        seen: dict[str, str] = {}
        for table in tables:
            other = seen.setdefault(name_of(table), table)
            if other != table:
                raise SourceError(
                    f"tables {other} and {table} would share the {what} {name_of(table)}: "
                    "capture one of them (pipeline.tables, pipeline.exclude_tables) or rename it"
                )


def heartbeat_topic(pipeline: PipelineSettings) -> str:
    """Debezium's own heartbeat records (its clock, not PostgreSQL's)."""
    return f"__debezium-heartbeat.{pipeline.topic_prefix}"


def heartbeat_rows_topic(pipeline: PipelineSettings) -> str:
    """The heartbeat table's changes: a row Debezium's heartbeat writes in PostgreSQL
    every heartbeat interval, captured as any change is (its commit time in
    `source.ts_ms`); not a table of the stores."""
    return change_topic(pipeline, HEARTBEAT_TABLE)


def transaction_topic(pipeline: PipelineSettings) -> str:
    return f"{pipeline.topic_prefix}.transaction"


def notification_topic(pipeline: PipelineSettings) -> str:
    """Where Debezium reports a backfill's progress."""
    return f"{pipeline.topic_prefix}.notifications"


def signal_topic(pipeline: PipelineSettings) -> str:
    """Debezium's signals when backfills are read-only (pipeline.read_only_backfills):
    one partition, each record keyed by the topic prefix (Debezium's logical name)."""
    return f"{pipeline.topic_prefix}.signals"


def dead_letter_topic(pipeline: PipelineSettings) -> str:
    """Poison events, with the error and where they came from."""
    return f"{pipeline.topic_prefix}.dlq"


def connect_topics(group: str) -> dict[str, str]:
    """The topics of the local Connect worker's group (connect.group_id): its connectors'
    configs, offsets and status."""
    return {
        "config": f"_{group}-configs",
        "offset": f"_{group}-offsets",
        "status": f"_{group}-status",
    }


def change_topic_pattern(pipeline: PipelineSettings) -> str:
    """`<prefix>.<schema>.<table>` (a name may hold more dots): not the transaction,
    notification, signal, dead-letter or logical decoding message topics, nor the
    heartbeat table's."""
    prefix = re.escape(pipeline.topic_prefix)
    heartbeat = re.escape(HEARTBEAT_TABLE)
    return rf"^{prefix}\.(?!(?:transaction|notifications|signals|dlq|message|{heartbeat})$).+$"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def change_topic_spec(pipeline: PipelineSettings, table: str) -> TopicSpec:
    """A table's change topic: keyed, compacted, the tombstone kept for delete_retention_ms."""
    return TopicSpec(
        change_topic(pipeline, table),
        pipeline.partitions,
        {
            "cleanup.policy": "compact",
            "delete.retention.ms": str(pipeline.delete_retention_ms),
            "segment.ms": str(pipeline.segment_ms),
            "min.cleanable.dirty.ratio": "0.1",
            # a change is readable by every store before compaction may drop it
            "min.compaction.lag.ms": "60000",
            "message.timestamp.type": "CreateTime",
        },
    )


def pipeline_topic_specs(pipeline: PipelineSettings, tables: list[str]) -> list[TopicSpec]:
    """Every topic of the pipeline capturing `tables` ("schema.table"), created before
    the connector starts."""
    specs = [change_topic_spec(pipeline, t) for t in [*tables, TRUNCATIONS_TABLE]]
    specs.append(TopicSpec(heartbeat_topic(pipeline), 1, {"retention.ms": "86400000"}))
    # a row per pipeline of the database, kept compacted
    specs.append(
        TopicSpec(
            heartbeat_rows_topic(pipeline),
            1,
            {"cleanup.policy": "compact", "segment.ms": "3600000", "min.compaction.lag.ms": "0"},
        )
    )
    specs.append(TopicSpec(transaction_topic(pipeline), 1, {"retention.ms": "604800000"}))
    specs.append(TopicSpec(notification_topic(pipeline), 1, {"retention.ms": "604800000"}))
    if pipeline.read_only_backfills:
        specs.append(TopicSpec(signal_topic(pipeline), 1, {"retention.ms": "604800000"}))
    # kept a month
    specs.append(TopicSpec(dead_letter_topic(pipeline), 1, {"retention.ms": "2592000000"}))
    return specs


def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec]) -> list[str]:
    """Create the topics that are missing; refuse ones that exist with other partitions.

    Returns the names of the topics it created.
    """
    admin = kafka_admin(kafka, 15000)
    try:
        described = [
            t for t in admin.describe_topics([s.name for s in specs]) if not t["error_code"]
        ]
        existing = {t["name"]: len(t["partitions"]) for t in described}
        copies = replication_factors(described)
        for spec in specs:
            have = existing.get(spec.name)
            if have is not None and have != spec.partitions:
                raise TopicError(
                    f"topic {spec.name} has {have} partitions but pipeline.partitions is "
                    f"{spec.partitions}: a change topic's partition count never changes (it would "
                    "reorder keys); set pipeline.partitions back, or use a new topic_prefix and "
                    "rebuild every store"
                )
        missing = [s for s in specs if s.name not in existing]
        if missing:
            brokers = len(live_brokers(admin.describe_cluster()))
            if brokers < kafka.replication_factor:
                raise TopicError(too_few_brokers(kafka, brokers))
            admin.create_topics(
                [
                    NewTopic(
                        s.name,
                        s.partitions,
                        kafka.replication_factor,
                        topic_configs={**s.config, **topic_kafka_configs(kafka)},
                    )
                    for s in missing
                ],
                timeout_ms=30000,
            )
        present = [s.name for s in specs if s.name in existing]
        if present:  # made before, or with another limit: set it (incrementally)
            admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        name,
                        topic_kafka_configs(kafka, copies.get(name, kafka.replication_factor)),
                    )
                    for name in present
                ]
            )
        return [s.name for s in missing]
    finally:
        admin.close()


def topic_kafka_configs(kafka: KafkaSettings, copies: int | None = None) -> dict[str, str]:
    """The configuration every topic of the pipeline gets from `kafka`: the largest event
    its producers send, and the copies a write must reach (kafka.min_insync_replicas; on
    a topic of `copies` replicas, fewer than that, at most `copies`: more would refuse
    every write until its replicas are raised)."""
    copies = kafka.replication_factor if copies is None else copies
    return {
        "max.message.bytes": str(kafka.max_message_bytes),
        "min.insync.replicas": str(max(1, min(kafka.min_insync_replicas, copies))),
    }


def too_few_brokers(kafka: KafkaSettings, brokers: int) -> str:
    return (
        f"kafka.replication_factor is {kafka.replication_factor} but the Kafka cluster at "
        f"{kafka.bootstrap} has {brokers} broker(s): add brokers, or lower it"
    )


def live_brokers(cluster: dict[str, Any]) -> list[int]:
    """The ids of the brokers of an admin client's describe_cluster that are not fenced."""
    return sorted(
        b.get("broker_id", b.get("node_id"))
        for b in cluster.get("brokers") or ()
        if not b.get("is_fenced")
    )


def replication_factors(described: list[dict[str, Any]]) -> dict[str, int]:
    """Per topic of an admin client's describe_topics, its replication factor: the fewest
    replicas of any of its partitions."""
    return {
        t["name"]: min(len(p["replica_nodes"]) for p in t["partitions"])
        for t in described
        if not t.get("error_code") and t["partitions"]
    }


def reassignment_plan(
    described: list[dict[str, Any]], brokers: list[int], copies: int
) -> dict[str, Any]:
    """The `kafka-reassign-partitions.sh --reassignment-json-file` plan that gives every
    partition of the described topics with fewer than `copies` replicas that many: its
    replicas kept first (its leader stays), then the brokers holding the fewest replicas
    of the plan and of the topics' other partitions (ties: the lowest id)."""
    load = dict.fromkeys(brokers, 0)
    for topic in described:
        for partition in topic["partitions"]:
            for broker in partition["replica_nodes"]:
                if broker in load:
                    load[broker] += 1
    moves = []
    for topic in sorted(described, key=lambda t: t["name"]):
        for partition in sorted(topic["partitions"], key=lambda p: p["partition_index"]):
            replicas = list(partition["replica_nodes"])
            if len(replicas) >= copies:
                continue
            for broker in sorted(load, key=lambda b: (load[b], b)):
                if len(replicas) >= copies:
                    break
                if broker not in replicas:
                    replicas.append(broker)
                    load[broker] += 1
            moves.append(
                {
                    "topic": topic["name"],
                    "partition": partition["partition_index"],
                    "replicas": replicas,
                }
            )
    return {"version": 1, "partitions": moves}


def replication_problem(
    kafka: KafkaSettings, topics: list[str], plan_file: Path | None, brokers: int
) -> str:
    """One line: `topics` (pipeline topics) have fewer replicas than kafka.replication_factor,
    and the command that raises them in place (their records kept: a topic made again
    would lose them, and a new topic id means rebuilding every store)."""
    named = ", ".join(topics[:3]) + (f" and {len(topics) - 3} more" if len(topics) > 3 else "")
    head = (
        f"{len(topics)} pipeline topic(s) ({named}) have fewer replicas than "
        f"kafka.replication_factor {kafka.replication_factor} (a broker lost loses their records)"
    )
    if brokers < kafka.replication_factor or plan_file is None:
        return f"{head}: {too_few_brokers(kafka, brokers)}, then run `cdc status` again"
    login = " --command-config <your client properties>" if kafka.sasl or kafka.tls else ""
    return (
        f"{head}: add replicas in place (never recreate a topic: its records would be lost) "
        f"with `kafka-reassign-partitions.sh --bootstrap-server {kafka.bootstrap}{login} "
        f"--reassignment-json-file {plan_file} --execute`, then `cdc setup`"
    )


def under_replicated(kafka: KafkaSettings, topics: list[str], plan_file: Path) -> str | None:
    """`topics` that exist with fewer replicas than kafka.replication_factor, as one line
    (replication_problem), the plan that raises them written to `plan_file`; None when
    every one has enough (or Kafka does not answer: other lines of `cdc status` say so)."""
    try:
        admin = kafka_admin(kafka, 5000)
    except Exception as exc:
        log.info("topic replicas: Kafka does not answer (%s)", type(exc).__name__)
        return None
    try:
        described = [t for t in admin.describe_topics(topics) if not t["error_code"]]
        low = {
            name
            for name, copies in replication_factors(described).items()
            if copies < kafka.replication_factor
        }
        if not low:
            return None
        brokers = live_brokers(admin.describe_cluster())
    except Exception as exc:
        log.info("topic replicas: Kafka does not answer (%s)", type(exc).__name__)
        return None
    finally:
        admin.close()
    short = [t for t in described if t["name"] in low]
    written = None
    if len(brokers) >= kafka.replication_factor:
        text = json.dumps(reassignment_plan(short, brokers, kafka.replication_factor), indent=1)
        try:
            plan_file.parent.mkdir(parents=True, exist_ok=True)
            plan_file.write_text(text + "\n")
        except OSError:  # data_dir not writable here (`cdc status` as another user)
            import tempfile

            handle, name = tempfile.mkstemp(prefix="cdc-kafka-replicas-", suffix=".json")
            with open(handle, "w") as out:
                out.write(text + "\n")
            plan_file = Path(name)
        written = plan_file
    return replication_problem(kafka, sorted(low), written, len(brokers))


def set_topic_configs(kafka: KafkaSettings, specs: list[TopicSpec]) -> None:
    """Give existing topics their specs' configuration (a renamed table's topic, which
    Kafka Connect made uncompacted, once the pipeline captures the table under that
    name)."""
    if not specs:
        return
    admin = kafka_admin(kafka, 30000)
    try:
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, s.name, dict(s.config)) for s in specs]
        )
    finally:
        admin.close()


def ever_written(kafka: KafkaSettings, pipeline: PipelineSettings) -> set[str]:
    """The pipeline's change topics ever written to (an end offset above 0, even if their
    records were deleted since)."""
    ends = change_topic_ends(kafka, pipeline)
    return {t for t, parts in ends.items() if any(parts.values())}


def change_topic_ends(
    kafka: KafkaSettings, pipeline: PipelineSettings
) -> dict[str, dict[int, int]]:
    """The end offset of each partition of every change topic of the pipeline now (those
    the apply job's pattern matches)."""
    pattern = re.compile(change_topic_pattern(pipeline))
    admin = kafka_admin(kafka, 15000)
    try:
        topics = [t for t in admin.list_topics() if pattern.fullmatch(t)]
    finally:
        admin.close()
    return end_offsets(kafka, topics) if topics else {}


def end_offsets(kafka: KafkaSettings, topics: list[str]) -> dict[str, dict[int, int]]:
    """The next offset to be written, per topic and partition."""
    consumer = KafkaConsumer(**kafka_client_kwargs(kafka), enable_auto_commit=False)
    try:
        tps = [
            TopicPartition(t, p)
            for t in topics
            for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        result: dict[str, dict[int, int]] = {t: {} for t in topics}
        for tp, offset in consumer.end_offsets(tps).items():
            result[tp.topic][tp.partition] = offset
        return result
    finally:
        consumer.close()


def key_partition(key: Any, partitions: int) -> Any:
    """A Spark column: the Kafka partition of the record whose key is `key` (a string
    column) in a topic of `partitions` partitions, as Kafka's producers pick it for a
    keyed record (murmur2 of the key's UTF-8 bytes: jvm/functions KafkaPartitions)."""
    from pyspark.sql import functions as F

    return F.reflect(
        F.lit("cdc.spark.KafkaPartitions"), F.lit("of"), key, F.lit(int(partitions))
    ).cast("int")


def written_since(
    kafka: KafkaSettings,
    pipeline: PipelineSettings,
    since_ms: int,
    captured: set[str],
    acknowledged: dict[str, int] | None = None,
) -> list[str]:
    """The pipeline's change topics of no table in `captured` ("schema.table") whose last
    change committed at or after `since_ms`: the changes of a captured table made under
    another name (renamed, and perhaps back), which no store applies. (A table removed
    from the pipeline then has none: its last change committed before.) `acknowledged`:
    per name ('*': any), the time (ms) through which its changes are accounted for."""
    pattern = re.compile(change_topic_pattern(pipeline))
    own = {change_topic(pipeline, t) for t in captured}
    # the pipeline's own tables' (Debezium writes its signal table's rows too)
    ours = change_topic(pipeline, TRUNCATIONS_TABLE).rsplit(".", 1)[0] + "."
    consumer = KafkaConsumer(**kafka_client_kwargs(kafka), enable_auto_commit=False)
    try:
        others = sorted(
            t
            for t in consumer.topics()
            if pattern.match(t) and t not in own and not t.startswith(ours)
        )
        tps = [TopicPartition(t, p) for t in others for p in consumer.partitions_for_topic(t) or ()]
        # written to since (Kafka's own time): only those are read
        found = consumer.offsets_for_times({tp: since_ms for tp in tps}) if tps else {}
        recent = [tp for tp, at in found.items() if at is not None]
        ends = consumer.end_offsets(recent) if recent else {}
    finally:
        consumer.close()
    last = change_times(kafka, {(tp.topic, tp.partition, ends[tp] - 1) for tp in recent})
    acks = acknowledged or {}
    prefix = len(pipeline.topic_prefix) + 1

    def since(topic: str) -> int:  # changes up to an acknowledgement are accounted for
        return max(since_ms, acks.get("*", 0) + 1, acks.get(topic[prefix:], 0) + 1)

    return sorted({topic for (topic, _, _), ms in last.items() if ms >= since(topic)})


def change_times(
    kafka: KafkaSettings, wanted: set[tuple[str, int, int]], timeout_s: float = 2.0
) -> dict[tuple[str, int, int], int]:
    """For each (topic, partition, offset), the commit time (ms) of the change at that
    offset, or at the first one after it that compaction or retention kept: its
    `source.ts_ms`, else the record's timestamp. A position with no record after it
    within `timeout_s` has none; so has every position when Kafka does not answer (a
    figure for `cdc status`, not a check)."""
    found: dict[tuple[str, int, int], int] = {}
    if not wanted:
        return found
    # a round per offset wanted of a partition (stores stand at different offsets of it)
    per_partition: dict[TopicPartition, list[int]] = {}
    for topic, partition, offset in sorted(wanted):
        per_partition.setdefault(TopicPartition(topic, partition), []).append(offset)
    rounds = [
        {tp: offsets[i] for tp, offsets in per_partition.items() if i < len(offsets)}
        for i in range(max(map(len, per_partition.values())))
    ]
    consumer = None
    deadline = time.monotonic() + timeout_s
    try:
        consumer = KafkaConsumer(
            **kafka_client_kwargs(kafka), enable_auto_commit=False, auto_offset_reset="earliest"
        )
        for starts in rounds:
            consumer.assign(list(starts))
            for tp, offset in starts.items():
                consumer.seek(tp, offset)
            seen: set[TopicPartition] = set()
            while len(seen) < len(starts) and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=200, max_records=500).items():
                    if records and tp not in seen:
                        seen.add(tp)
                        found[(tp.topic, tp.partition, starts[tp])] = _commit_ms(records[0])
                        consumer.pause(tp)
            consumer.resume(*consumer.paused())
    except Exception as exc:  # Kafka went away: what was found so far
        log.info("the log's change times: Kafka does not answer (%s)", type(exc).__name__)
    finally:
        if consumer is not None:
            consumer.close()
    return found


@dataclass(frozen=True)
class HeartbeatMark:
    """The newest heartbeat row in the log: committed in PostgreSQL at `commit_ms`,
    taken by Debezium at `captured_ms` (the envelope's `ts_ms`)."""

    commit_ms: int
    captured_ms: int


def last_heartbeat(
    kafka: KafkaSettings, pipeline: PipelineSettings, timeout_s: float = 2.0
) -> HeartbeatMark | None:
    """The newest record of the heartbeat table's topic (heartbeat_rows_topic), or None
    when it has none (a pipeline set up before it was captured, or just set up), or
    Kafka does not answer in `timeout_s`."""
    topic = heartbeat_rows_topic(pipeline)
    consumer = None
    try:
        consumer = KafkaConsumer(**kafka_client_kwargs(kafka), enable_auto_commit=False)
        tp = TopicPartition(topic, 0)
        if not consumer.partitions_for_topic(topic):
            return None
        end = consumer.end_offsets([tp])[tp]
        if end <= 0:
            return None
        consumer.assign([tp])
        consumer.seek(tp, end - 1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=200, max_records=10).get(tp)
            if records:
                return _heartbeat_mark(records[-1])
    except Exception as exc:  # Kafka went away: no figure (a figure for `cdc status`)
        log.info("the last heartbeat: Kafka does not answer (%s)", type(exc).__name__)
    finally:
        if consumer is not None:
            consumer.close()
    return None


def _heartbeat_mark(record: Any) -> HeartbeatMark | None:
    try:
        envelope = json.loads(record.value)
        commit, taken = envelope["source"]["ts_ms"], envelope["ts_ms"]
    except (TypeError, ValueError, KeyError):
        return None
    if not isinstance(commit, int) or not isinstance(taken, int):
        return None
    return HeartbeatMark(commit, taken)


def _commit_ms(record: Any) -> int:
    try:
        ts = json.loads(record.value)["source"]["ts_ms"]
        if isinstance(ts, int):
            return ts
    except (TypeError, ValueError, KeyError):
        pass
    return int(record.timestamp)


def truncate_topics(kafka: KafkaSettings, specs: list[TopicSpec]) -> None:
    """Delete every record now in the topics. Offsets keep growing from where they were.

    Kafka deletes records only from topics whose cleanup policy includes delete, so
    the policy is widened (with unlimited retention) for the deletion and then restored.
    """
    ends = end_offsets(kafka, [s.name for s in specs])
    to_delete = {
        TopicPartition(t, p): offset
        for t, parts in ends.items()
        for p, offset in parts.items()
        if offset
    }
    if not to_delete:
        return
    admin = kafka_admin(kafka, 30000)
    deletable = {"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"}
    try:
        admin.alter_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, s.name, {**s.config, **deletable})
                for s in specs
            ]
        )
        _delete_records(admin, to_delete)
    finally:
        admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, s.name, dict(s.config)) for s in specs]
        )
        admin.close()


def _delete_records(admin: Any, to_delete: dict[TopicPartition, int], wait_s: float = 30.0) -> None:
    """Delete the records before the offsets, once each partition's leader has the
    widened cleanup policy: a broker takes a topic's new configuration in a moment of
    its own after answering, and refuses the deletion until then (PolicyViolation)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            admin.delete_records(to_delete)
            return
        except KafkaError as exc:
            if "PolicyViolation" not in f"{type(exc).__name__} {exc}":
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@dataclass(frozen=True)
class ChangeRecord:
    """One record of a change topic: its position, key and Debezium envelope (None: tombstone)."""

    partition: int
    offset: int
    key_bytes: bytes | None
    value_bytes: bytes | None

    @property
    def key(self) -> Any:
        return json.loads(self.key_bytes) if self.key_bytes is not None else None

    @property
    def value(self) -> dict[str, Any] | None:
        return json.loads(self.value_bytes) if self.value_bytes is not None else None

    @property
    def op(self) -> str | None:
        """c, u, d, r, t — or None for a tombstone."""
        value = self.value
        return None if value is None else value.get("op")


def read_topic(kafka: KafkaSettings, topic: str, timeout: float = 300.0) -> list[ChangeRecord]:
    """Every record of topic, partition by partition in offset order, up to its end now.

    Raises TimeoutError rather than return part of the topic.
    """
    consumer = KafkaConsumer(
        **kafka_client_kwargs(kafka),
        enable_auto_commit=False,
        request_timeout_ms=30000,
        max_poll_records=20000,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        records: list[ChangeRecord] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read topic {topic} to its end within {timeout:.0f}s")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records += [ChangeRecord(tp.partition, r.offset, r.key, r.value) for r in batch]
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def thinned(records: list[ChangeRecord]) -> bool:
    """Whether a partition of records read with read_topic skips offsets, at its head or
    between two records: compaction (or retention) removed records, so the topic no
    longer holds every change. Every partition's log starts at offset 0."""
    ends: dict[int, int] = {}
    for record in records:
        if record.offset != ends.get(record.partition, 0):
            return True
        ends[record.partition] = record.offset + 1
    return False


def wait_for_records(
    kafka: KafkaSettings, topic: str, count: int, timeout: float = 60.0
) -> list[ChangeRecord]:
    """Read topic until it holds at least count records (or timeout: returns what it has)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_topic(kafka, topic)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.5)
