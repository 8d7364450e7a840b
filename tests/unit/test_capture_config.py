from __future__ import annotations

from cdc.capture import connector_config
from cdc.connect import summarize_trace
from cdc.settings import Settings


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
