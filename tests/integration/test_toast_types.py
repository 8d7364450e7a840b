"""Unchanged TOASTed values of every type: an update of another column arrives with
Debezium's placeholder in the form it takes for each type (text, bytea, jsonb, text[],
int4[], uuid[]); no store overwrites the stored value with it. A key change (rows
swapping keys) arrives as a create carrying placeholders: no store gives the new key the
value another row left there. Stores read with redis-py, OpenSearch over HTTP and a
Delta reader of this test's own."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.core.topics import change_topic
from cdc.types.decode import DEBEZIUM, DEBEZIUM_PLACEHOLDER, placeholder_forms
from tests.conftest import Capture, RunningStack
from tests.contents import topic_records
from tests.helpers import recorded_placeholder
from tests.stores import stores

pytestmark = pytest.mark.integration

TOASTED = ("b", "doc", "tags", "nums", "uids", "big")
COLUMNS = (
    "id int PRIMARY KEY, body text, b bytea, doc jsonb, tags text[], nums int4[], "
    "uids uuid[], big text"
)
# each value well past the 2 kB TOAST threshold, stored out of line (STORAGE EXTERNAL)
VALUES = (
    "SELECT g, 'v0', decode(repeat(md5(g::text), 150), 'hex'), "
    "jsonb_build_object('k', repeat(md5(g::text), 150)), "
    "ARRAY(SELECT md5((g * 1000 + i)::text) FROM generate_series(1, 150) i), "
    "ARRAY(SELECT g * 10000 + i FROM generate_series(1, 1000) i), "
    "ARRAY(SELECT md5((g * 1000 + i)::text)::uuid FROM generate_series(1, 150) i), "
    "repeat(md5(g::text), 150) FROM generate_series(1, 4) g"
)


def updates(settings: Any, table: str, count: int) -> list[dict[str, Any]]:
    kafka, topic = settings.kafka, change_topic(settings.pipeline, table)
    deadline = time.monotonic() + 90
    while True:
        found = [
            json.loads(r.value)["after"]
            for r in topic_records(kafka, topic)
            if r.value and json.loads(r.value)["op"] in ("u", "c")
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(1)


def test_no_store_writes_a_placeholder_of_any_type(captured: Capture) -> None:
    t = captured(
        f"CREATE TABLE {{name}} ({COLUMNS})",
        *(f"ALTER TABLE {{name}} ALTER COLUMN {column} SET STORAGE EXTERNAL" for column in TOASTED),
        f"INSERT INTO {{name}} {VALUES}",
        prefix="toasty",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    before = stores(settings, table)
    for store, rows in before.items():
        assert sorted(rows) == [1, 2, 3, 4], store
        for column in TOASTED:
            assert all(rows[i][column] not in (None, "", []) for i in rows), (store, column)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET body = 'v1'")
    seen = updates(settings, table, 4)
    assert len(seen) == 4
    # the pipeline's own placeholder (not Debezium's default), in each type's own form
    own = placeholder_forms(recorded_placeholder(dsn, settings.pipeline.name))
    assert own.text != DEBEZIUM_PLACEHOLDER
    forms = {own.text, own.b64, *map(json.dumps, own.arrays)}
    for after in seen:
        for column in TOASTED:
            value = after[column]
            assert (json.dumps(value) if isinstance(value, list) else value) in forms, (
                column,
                str(value)[:80],
            )
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    after_update = stores(settings, table)
    for store, rows in after_update.items():
        for i in rows:
            assert rows[i]["body"] == "v1", store
            for column in TOASTED:
                assert rows[i][column] == before[store][i][column], (store, i, column)

    # rows 1 and 2 swap keys: each new key gets a create carrying placeholders
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(f"UPDATE {name} SET id = 100, body = 'was 1' WHERE id = 1")
        conn.execute(f"UPDATE {name} SET id = 1, body = 'was 2' WHERE id = 2")
        conn.execute(f"UPDATE {name} SET id = 2, body = 'was 1' WHERE id = 100")
    updates(settings, table, 4 + 3)
    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    swapped = stores(settings, table)
    for store, rows in swapped.items():
        assert sorted(rows) == [1, 2, 3, 4], store
        assert (rows[1]["body"], rows[2]["body"]) == ("was 2", "was 1"), store
        for key, other in ((1, 2), (2, 1)):
            for column in TOASTED:
                held = rows[key].get(column)
                # the source's value (row `other`'s), or not known; never the value
                # the key's previous row left
                assert held in (None, before[store][other][column]), (store, key, column)
                assert held != before[store][key][column], (store, key, column)


def test_every_placeholder_form_marks_its_row_image(stack: RunningStack) -> None:
    """The apply job decodes placeholders only for the tables whose events of a batch may
    hold one (cdc/types/spark_types.py: may_hold_placeholder): every form Debezium writes,
    read from an envelope as parse_events reads it, is seen; a plain image is not."""
    from pyspark.sql import functions as F

    from cdc.core.spark import spark_session
    from cdc.log.envelope import ENVELOPE_DDL
    from cdc.types.spark_types import may_hold_placeholder

    spark = spark_session(stack.settings, "test-placeholder-forms")
    forms = [DEBEZIUM.text, DEBEZIUM.b64, DEBEZIUM.hstore, *DEBEZIUM.arrays]
    images = [{"id": 1, "c": form, "d": "x"} for form in forms]
    images.append({"id": 2, "c": "__debezium", "d": [95, 95, 100], "e": {"k": "v"}})
    envelopes = [(json.dumps({"op": "u", "after": image}, indent=1),) for image in images]
    seen = (
        spark.createDataFrame(envelopes, "value string")
        .select(
            may_hold_placeholder(
                F.from_json("value", ENVELOPE_DDL)["after"], {DEBEZIUM.text}
            ).alias("seen")
        )
        .collect()
    )
    assert [row.seen for row in seen] == [True] * len(forms) + [False]


def test_a_real_value_equal_to_a_placeholder_is_a_value(captured: Capture) -> None:
    """Any user can store Debezium's default placeholder texts (the review's probe): the
    pipeline's connector has a secret placeholder of its own, so the snapshot's rows and
    an update's values are what the row holds, in every store, and verify finds none
    different."""
    from cdc.check.verify import verify
    from tests.logcheck import table_info

    literal = f"'{DEBEZIUM_PLACEHOLDER}'"
    t = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, body text, b bytea, tags text[])",
        f"INSERT INTO {{name}} VALUES (1, {literal}, convert_to({literal}, 'UTF8'), "
        f"ARRAY[{literal}]), (2, 'plain', '\\x01', ARRAY['x'])",
        prefix="lookalike",
    )
    name, table, settings, dsn = t.name, t.table, t.settings, t.dsn
    every = ["cache", "search", "warehouse"]
    run_apply(settings, every, once=True)
    for store, rows in stores(settings, table).items():
        assert sorted(rows) == [1, 2], store
        assert rows[1]["body"] == DEBEZIUM_PLACEHOLDER, store
        assert rows[1]["b"] not in (None, ""), store
        assert rows[1]["tags"] not in (None, "", []), store

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {name} SET body = {literal}, b = convert_to({literal}, 'UTF8'), "
            f"tags = ARRAY[{literal}] WHERE id = 2"
        )
    assert len(updates(settings, table, 1)) == 1
    run_apply(settings, every, once=True)
    held = stores(settings, table)
    for store, rows in held.items():
        assert rows[2]["body"] == DEBEZIUM_PLACEHOLDER, store
        assert (rows[2]["b"], rows[2]["tags"]) == (rows[1]["b"], rows[1]["tags"]), store
    assert all(d.ok for d in verify(settings, [table_info(settings, table)], every, timeout=60))


def test_a_pipeline_set_up_before_keeps_the_placeholder_its_topics_hold(
    captured: Capture,
) -> None:
    """A pipeline whose relations were recorded before it had a placeholder of its own
    gets Debezium's default from `cdc setup` (its connector wrote that); and a running
    connector's placeholder is the one the record follows, as its events hold it."""
    from cdc.capture.connector_config import register_connector
    from cdc.capture.source_setup import prepare_source

    t = captured("CREATE TABLE {name} (id int PRIMARY KEY, body text)", prefix="older")
    settings, dsn, pipeline = t.settings, t.dsn, t.settings.pipeline.name
    own = recorded_placeholder(dsn, pipeline)
    assert own.startswith("__cdc_unchanged_") and len(own) == len("__cdc_unchanged_") + 32
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM cdc.placeholders WHERE pipeline = %s", (pipeline,))
    tables = prepare_source(settings)
    assert recorded_placeholder(dsn, pipeline) == DEBEZIUM_PLACEHOLDER
    assert {table.placeholder for table in tables} == {DEBEZIUM_PLACEHOLDER}
    register_connector(settings, tables)  # the connector runs with its own
    assert recorded_placeholder(dsn, pipeline) == own
