"""pipeline.table, without services: the settings it takes or refuses, the publication
member and Debezium column filter it gives, and how a changed choice is seen (the
integration tier runs it on the stack: tests/integration/test_capture_choice.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import tomlkit
from hypothesis import given
from hypothesis import strategies as st

from cdc.capture.connector_config import _java_regex_literal, pipeline_connector_config
from cdc.capture.masks import masked_value, transform_masks
from cdc.capture.rewrites import rewrites, schema_of
from cdc.capture.source_setup import _member
from cdc.core.catalog import Column, Table
from cdc.core.errors import ConfigError
from cdc.core.settings import Settings, load_settings
from cdc.types.debezium_sql import column_json
from tests.unit.fuzzing import bounded, check_read


def _column(name: str) -> Column:
    return Column(name, "text", "text", "S", False, None, False)


def _table(*names: str, excluded: tuple[str, ...] = (), **more: Any) -> Table:
    return Table(
        "public",
        "t",
        tuple(_column(n) for n in names),
        ("id",),
        "d",
        1,
        1,
        excluded=excluded,
        **more,
    )


@pytest.mark.parametrize(
    ("choice", "words"),
    [
        ({"columns": ["a"], "exclude_columns": ["b"]}, "not both"),
        ({"columns": []}, "names no column"),
        ({"exclude_columns": ["a", "a"]}, "named twice"),
        ({"where": "  "}, "where is empty"),
        ({"where": "id > 1; DROP TABLE t"}, "holds a `;`"),
        ({"where": "id > 1) OR (true"}, "closes a parenthesis"),
        ({"where": "id > 1 -- all"}, "comment"),
        ({"exclude_columns": ["a"], "mask": {"a": "hash"}}, "mask names 'a', which is not"),
        ({"columns": ["id"], "mask": {"a": "redact"}}, "mask names 'a', which is not"),
        ({"mask": {"a": "hash"}, "redact_with": "x"}, "redact_with is set"),
        ({"mask": {"a": "scramble"}}, "hash"),
    ],
)
def test_a_choice_that_is_not_one_is_refused_in_one_line(
    clean_env: None, choice: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(pipeline={"table": {"public.t": choice}})
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_choice_is_read_from_the_settings_file(clean_env: None) -> None:
    text = tomlkit.dumps(
        {
            "pipeline": {
                "table": {"public.customers": {"exclude_columns": ["phone"], "where": "id > 0"}}
            }
        }
    )
    settings = check_read(text)
    assert settings is not None
    read = settings.pipeline.table["public.customers"]
    assert (read.exclude_columns, read.where) == (["phone"], "id > 0")


_choices = st.fixed_dictionaries(
    {},
    optional={
        "columns": st.lists(st.text(max_size=6), max_size=3),
        "exclude_columns": st.lists(st.text(max_size=6), max_size=3),
        "where": st.text(max_size=30),
        "mask": st.dictionaries(st.text(max_size=4), st.text(max_size=6), max_size=2),
    },
)


@bounded(200)
@given(st.dictionaries(st.text(max_size=12), _choices, max_size=3))
def test_any_table_choice_is_settings_or_one_config_error(choices: dict[str, Any]) -> None:
    settings = check_read(tomlkit.dumps({"pipeline": {"table": choices}}))
    if settings is None:
        return
    for name, choice in settings.pipeline.table.items():
        schema, _, table = name.partition(".")
        member = _member(
            Table(schema, table, (_column("id"),), ("id",), "d", 1, 1, row_filter=choice.where)
        )
        rendered = member.as_string(None)
        if choice.where is not None:  # the filter stays inside its parentheses
            assert rendered.endswith(f"WHERE ({choice.where})")


@bounded(300)
@given(st.text(min_size=1, max_size=40))
def test_a_column_filter_entry_matches_its_column_alone(name: str) -> None:
    """Java and Python agree on a backslash before ASCII punctuation (a literal)."""
    pattern = _java_regex_literal(f"public.t.{name}")
    assert re.fullmatch(pattern, f"public.t.{name}")
    assert not re.fullmatch(pattern, f"public.t.{name}x")
    assert not re.fullmatch(pattern, f"publicxt.{name}")


def test_the_publication_names_the_chosen_columns_and_rows() -> None:
    generated = Column("g", "text", "text", "S", False, None, False, generated="upper(a)")
    table = Table(
        "public",
        "t",
        (_column("id"), _column("a"), generated),
        ("id",),
        "d",
        1,
        1,
        excluded=("secret",),
        row_filter="id <= 30",
        listed=True,
    )
    text = _member(table).as_string(None)
    # PostgreSQL 15 refuses a generated column in a column list: the apply job computes it
    assert text == '"public"."t" ("id", "a") WHERE (id <= 30)'
    assert _member(_table("id", "a")).as_string(None) == '"public"."t"'


def test_debezium_leaves_out_exactly_the_excluded_columns() -> None:
    plain = pipeline_connector_config(Settings(), [_table("id", "a")], "__p")
    assert plain["column.include.list"] == ".*" and "column.exclude.list" not in plain
    chosen = pipeline_connector_config(
        Settings(), [_table("id", "a", excluded=("secret", "my col"), listed=True)], "__p"
    )
    assert "column.include.list" not in chosen
    assert chosen["column.exclude.list"] == r"public\.t\.secret,public\.t\.my\ col"


def test_a_column_captured_again_or_left_out_is_backfilled() -> None:
    before = schema_of(_table("id", "a", excluded=("secret",), listed=True))
    again = _table("id", "a", "secret", listed=True)
    assert rewrites(before, again) == ["column secret is captured now"]
    out = _table("id", excluded=("a", "secret"), listed=True)
    assert rewrites(before, out) == ["column a is left out now"]
    # a column added to a table whose columns are chosen: its changes until `cdc setup`
    # named it left it out
    added = _table("id", "a", "b", excluded=("secret",), listed=True)
    assert rewrites(before, added) == ["column b was added"]
    assert rewrites(before, _table("id", "a", excluded=("secret",), listed=True)) == []


def test_a_changed_row_filter_is_backfilled() -> None:
    before = schema_of(_table("id", "a", row_filter="id > 1"))
    assert rewrites(before, _table("id", "a", row_filter="id > 1")) == []
    for now in (_table("id", "a", row_filter="id > 2"), _table("id", "a")):
        assert rewrites(before, now) == [
            "its row filter changed (rows it no longer holds stay in the stores until "
            "`cdc verify --repair`)"
        ]
    # a table recorded before there were row filters, still without one
    assert rewrites(schema_of(_table("id", "a")), _table("id", "a")) == []


def test_a_masked_column_leaves_as_the_transform_writes_it() -> None:
    """The snapshot's SELECT and verify call cdc.mask_hash with the column's text as the
    change event carries it (char(n) keeps its padding); a redacted one is a literal."""
    table = _table(
        "id",
        "email",
        "phone",
        masks=(("email", "hash", None), ("phone", "redact", "***")),
        pipeline="shop",
    )
    email, phone = masked_value(table, "email"), masked_value(table, "phone")
    assert email is not None and phone is not None
    assert email.as_string(None) == """cdc.mask_hash('shop', to_json("email") #>> '{}')"""
    assert phone.as_string(None) == """CASE WHEN "phone" IS NULL THEN NULL ELSE '***' END"""
    assert masked_value(table, "id") is None
    assert "cdc.mask_hash('shop'" in column_json(table.column("email"), email).as_string(None)


def test_the_transform_knows_every_topic_and_the_tables_whose_key_is_masked() -> None:
    plain = _table("id", "a")
    keyed = Table(
        "public", "k", (_column("email"),), ("email",), "d", 1, 1, masks=(("email", "hash", None),)
    )
    assert transform_masks([plain], lambda n: "p." + n) is None
    masks = json.loads(transform_masks([plain, keyed], lambda n: "p." + n, also=["cdc.x"]) or "")
    assert masks == {
        "topics": {"p.cdc.x": {}, "p.public.t": {}, "p.public.k": {"email": {"mode": "hash"}}},
        "keyed": ["public.k"],
    }
    config = pipeline_connector_config(Settings(), [plain, keyed], "__p", "salt")
    assert config["transforms.mask.type"] == "cdc.connect.MaskColumns"
    assert json.loads(config["transforms.mask.masks"])["topics"]["cdc.public.k"]
    assert "transforms" not in pipeline_connector_config(Settings(), [plain], "__p")


def test_kafka_oversized_dead_letter_holds_an_event_back_after_the_masks() -> None:
    plain = _table("id", "a")
    masked = Table(
        "public", "k", (_column("email"),), ("email",), "d", 1, 1, masks=(("email", "hash", None),)
    )
    held = Settings.model_validate(
        {"kafka": {"oversized": "dead_letter", "max_message_bytes": 2 * 1024 * 1024}}
    )
    config = pipeline_connector_config(held, [plain, masked], "__p", "salt")
    assert config["transforms"] == "mask,hold"  # the size of what reaches Kafka: masked
    assert config["transforms.hold.type"] == "cdc.connect.HoldOversized"
    assert config["transforms.hold.max.bytes"] == str(2 * 1024 * 1024)
    assert config["transforms.hold.topic"] == "cdc.dlq"
    assert pipeline_connector_config(held, [plain], "__p")["transforms"] == "hold"
    assert "transforms" not in pipeline_connector_config(Settings(), [plain], "__p")
    with pytest.raises(ValueError):
        Settings.model_validate({"kafka": {"oversized": "skip"}})


def test_a_changed_mask_is_backfilled_and_a_changed_key_mask_repaired() -> None:
    masked = _table("id", "a", masks=(("a", "hash", None),))
    assert rewrites(schema_of(_table("id", "a")), masked) == ["the mask of a changed"]
    assert rewrites(schema_of(masked), masked) == []
    key = _table("id", "a", masks=(("id", "hash", None),))
    assert rewrites(schema_of(_table("id", "a")), key)[0].startswith("its key's mask changed")
