from __future__ import annotations

import re

from cdc.capture.connect_client import refusal, summarize_trace
from cdc.capture.connector_config import (
    connector_config,
    offset_reaches,
    pipeline_connector_config,
    start_offset,
)
from cdc.check.status import backfill_channel
from cdc.core.catalog import Column, Table
from cdc.core.settings import Settings


def test_connector_config_captures_exactly_the_named_tables() -> None:
    config = connector_config(
        Settings(),
        topic_prefix="shop",
        tables=["public.orders", "sales.order_items"],
        slot="s",
        publication="p",
    )
    # table.include.list holds regular expressions: dots are escaped so `public.orders`
    # cannot match `publicXorders`
    assert config["table.include.list"] == r"public\.orders,sales\.order_items"
    assert config["snapshot.mode"] == "no_data"
    assert config["tombstones.on.delete"] == "true"
    assert config["decimal.handling.mode"] == "string"
    assert config["plugin.name"] == "pgoutput"


def test_connect_reaches_postgres_where_it_is_told() -> None:
    settings = Settings(postgres={"connector_host": "postgres", "connector_port": 5432})
    config = connector_config(settings, topic_prefix="x", tables=["a.b"], slot="s", publication="p")
    assert (config["database.hostname"], config["database.port"]) == ("postgres", "5432")
    local = connector_config(
        Settings(), topic_prefix="x", tables=["a.b"], slot="s", publication="p"
    )
    assert local["database.hostname"] == "127.0.0.1"


def test_a_task_trace_is_summarized_by_its_deepest_cause() -> None:
    trace = (
        "org.apache.kafka.connect.errors.ConnectException: An exception occurred\n"
        "\tat io.debezium.Foo.bar(Foo.java:1)\n"
        "Caused by: org.postgresql.util.PSQLException: FATAL: password authentication failed\n"
        "\tat org.postgresql.Baz(Baz.java:2)\n"
    )
    assert summarize_trace(trace) == (
        "org.postgresql.util.PSQLException: FATAL: password authentication failed"
    )
    assert summarize_trace("") == "no trace given"


def test_a_generation_starts_at_its_consistent_point_like_after_a_commit_there() -> None:
    offset = start_offset(26_487_640, ts_ms=1_795_437_462_960)
    # the last commit is the point, so the first streamed transaction has a non-null
    # source.sequence[0]; no lsn_proc, so Debezium streams from the point without a WAL search
    assert offset == {
        "lsn": 26_487_640,
        "lsn_commit": 26_487_640,
        "messageType": "COMMIT",
        "ts_usec": 1_795_437_462_960_000,
    }
    assert "ts_usec" not in start_offset(26_487_640)


def test_a_stored_offset_before_the_consistent_point_is_an_older_generation() -> None:
    point = 26_487_640
    older = {"lsn": 26_400_000, "lsn_proc": 26_400_000, "lsn_commit": 26_400_000, "txId": 733}
    assert not offset_reaches(older, point)
    assert offset_reaches(start_offset(point), point)
    # a change of a transaction begun before the point: its own LSN is older, its last
    # commit is not
    assert offset_reaches({"lsn": point - 800, "lsn_proc": point - 800, "lsn_commit": point}, point)
    # a connector started with no offset stores the WAL position it found, past the point
    assert offset_reaches({"lsn": point + 56, "txId": 740}, point)
    assert not offset_reaches({}, point)


def test_a_refused_connector_config_names_its_errors_on_one_line() -> None:
    message = (
        "Connector configuration is invalid and contains the following 1 error(s):\n"
        "Error while validating connector config: password authentication failed\n"
        "You can also find the above list of errors at the endpoint "
        "`/connector-plugins/{connectorType}/config/validate`"
    )
    assert refusal(message) == (
        "Connector configuration is invalid and contains the following 1 error(s): "
        "Error while validating connector config: password authentication failed"
    )
    assert refusal("not found") == "not found"


def test_the_connector_passes_on_only_verify_s_cut_markers() -> None:
    """A logical decoding message of another program never leaves the database; the
    markers `cdc verify` writes at a cut do (they make the connector confirm the cut's
    position at once, cdc/check/verify.py)."""
    column = Column("id", "integer", "int4", "N", False, None, True)
    table = Table("public", "orders", (column,), ("id",), "d", 0, 0)
    config = pipeline_connector_config(Settings(), [table], "__p")
    included = re.compile(config["message.prefix.include.list"])
    assert included.fullmatch("cdc.cut")
    assert not included.fullmatch("cdcXcut") and not included.fullmatch("app.audit")


def test_the_pipeline_connector_filters_by_publication_not_by_name() -> None:
    """A name filter would drop a renamed table's changes while the slot moves on: the
    publication, which holds tables by OID, is the filter; only the pipeline's signal
    table is left out (the heartbeat table's rows are the capture's clock)."""
    column = Column("id", "integer", "int4", "N", False, None, True)
    table = Table("public", "orders", (column,), ("id",), "d", 0, 0)
    config = pipeline_connector_config(Settings(), [table], "__p")
    assert "table.include.list" not in config
    excluded = [re.compile(p) for p in config["table.exclude.list"].split(",")]
    assert any(p.fullmatch("cdc.debezium_signal") for p in excluded)
    for kept in ("public.orders", "public.carriers", "cdc.truncations", "cdc.heartbeat"):
        assert not any(p.fullmatch(kept) for p in excluded)
    assert not any(p.fullmatch("cdcXdebezium_signal") for p in excluded)


def test_debezium_s_producer_and_the_topics_it_makes_take_kafka_max_message_bytes() -> None:
    settings = Settings.model_validate({"kafka": {"max_message_bytes": 64 * 1024 * 1024}})
    config = connector_config(settings, topic_prefix="x", tables=["a.b"], slot="s", publication="p")
    assert config["producer.override.max.request.size"] == str(64 * 1024 * 1024)
    assert config["producer.override.buffer.memory"] == str(128 * 1024 * 1024)
    assert config["topic.creation.default.max.message.bytes"] == str(64 * 1024 * 1024)
    default = connector_config(
        Settings(), topic_prefix="x", tables=["a.b"], slot="s", publication="p"
    )
    assert default["producer.override.max.request.size"] == str(16 * 1024 * 1024)


def test_a_task_stopped_by_an_event_too_large_says_what_to_raise() -> None:
    from cdc.capture.connect_client import too_large

    trace = (
        "org.apache.kafka.connect.errors.ConnectException: Unrecoverable exception from "
        "producer send callback\\n\\tat ...\\nCaused by: org.apache.kafka.common.errors."
        "RecordTooLargeException: The message is 1280131 bytes when serialized which is "
        "larger than 1048576, which is the value of the max.request.size configuration."
    )
    said = too_large(trace, 1048576)
    assert said is not None and "kafka.max_message_bytes (1048576 bytes)" in said
    assert "`cdc setup`" in said and "nothing after it is lost" in said
    assert too_large("java.lang.IllegalStateException: other", 1048576) is None


def test_the_dead_letter_producer_takes_only_what_kafka_python_knows() -> None:
    from kafka import KafkaProducer

    from cdc.apply.dead_letters import producer_config

    settings = Settings.model_validate({"kafka": {"max_message_bytes": 32 * 1024 * 1024}})
    config = producer_config(settings.kafka)
    assert set(config) <= set(KafkaProducer.DEFAULT_CONFIG), set(config) - set(
        KafkaProducer.DEFAULT_CONFIG
    )
    assert config["max_request_size"] == 32 * 1024 * 1024


def test_a_database_pg_hba_does_not_admit_is_said_with_what_admits_it() -> None:
    from cdc.core.errors import SourceError
    from cdc.core.postgres_client import connect_error

    settings = Settings.model_validate({"postgres": {"database": "h9"}})
    refused = Exception(
        'connection failed: FATAL:  pg_hba.conf rejects connection for host "127.0.0.1", '
        'user "cdc_replication", database "h9", no encryption'
    )
    error = connect_error(settings, "cdc_replication", refused)
    assert isinstance(error, SourceError)
    assert "database h9 (pg_hba.conf)" in str(error) and "`cdc up`" in str(error)


def test_read_only_backfills_take_signals_from_kafka_and_watermarks_that_wait() -> None:
    """With pipeline.read_only_backfills Debezium writes nothing to the source: signals
    come from the pipeline's signal topic, with the Kafka login the settings give, and
    its watermark (pg_current_snapshot) resolves to cdc_watermarks' first."""
    column = Column("id", "integer", "int4", "N", False, None, True)
    table = Table("public", "orders", (column,), ("id",), "d", 0, 0)
    plain = pipeline_connector_config(Settings(), [table], "__p")
    assert plain["signal.enabled.channels"] == "source" and "read.only" not in plain
    settings = Settings.model_validate(
        {
            "pipeline": {"read_only_backfills": True, "topic_prefix": "shop"},
            "kafka": {
                "managed": False,
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-512",
                "username": "cdc",
                "password": "s3cret",
            },
        }
    )
    config = pipeline_connector_config(settings, [table], "__p")
    assert config["read.only"] == "true"
    assert config["signal.enabled.channels"] == "kafka"
    assert config["signal.kafka.topic"] == "shop.signals"
    assert "signal.data.collection" not in config
    assert config["signal.consumer.security.protocol"] == "SASL_PLAINTEXT"
    assert "s3cret" in config["signal.consumer.sasl.jaas.config"]  # made a reference later
    path = config["database.initial.statements"]
    assert path.index("cdc_watermarks") < path.index("pg_catalog")


def test_status_names_where_a_backfill_takes_its_signals_from_the_running_config() -> None:
    column = Column("id", "integer", "int4", "N", False, None, True)
    table = Table("public", "orders", (column,), ("id",), "d", 0, 0)
    plain = pipeline_connector_config(Settings(), [table], "__p")
    assert backfill_channel(plain) == "signals and watermarks in table cdc.debezium_signal"
    settings = Settings.model_validate({"pipeline": {"read_only_backfills": True}})
    read_only = pipeline_connector_config(settings, [table], "__p")
    assert backfill_channel(read_only) == "read-only: signals on topic cdc.signals"
