"""Fuzz: what a person types and what the pipeline reads back from Kafka, outside the
change events: the key of `cdc get TABLE KEY`, table names and patterns, store names,
`--where` filters (their pure checks), window durations, dead letters and Debezium's
backfill notifications. Each gives its result or one CdcError of one line; nothing
else."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc.capture.backfill import BackfillProgress, _check_filter_size, _follow, filter_problem
from cdc.check.dead_letters import DeadLetter, _is_key, _letter
from cdc.check.query import key_json
from cdc.cli.output import Output, OutputForm, console, shown
from cdc.core.catalog import Column, Table, reserved_problem, resolve_tables
from cdc.core.errors import BackfillError, CdcError, QueryError
from cdc.core.settings.pipeline import PipelineSettings
from cdc.core.settings.views import TumblingWindow, duration_ms
from cdc.stores.registry import check_store_names
from tests.unit.fuzzing import bounded, json_values


def table(*key: tuple[str, str]) -> Table:
    columns = tuple(Column(name, base, base, "X", False, None, True) for name, base in key)
    return Table(
        "public",
        "t",
        (*columns, Column("body", "text", "text", "S", False, None, False)),
        tuple(n for n, _ in key),
        "d",
        1,
        1,
    )


TABLES = [table(("id", "int4")), table(("code", "text")), table(("a", "int8"), ("b", "uuid"))]
DEEP = "[" * 5000 + "]" * 5000
_typed = st.text(max_size=40) | json_values.map(json.dumps) | st.integers().map(str) | st.just(DEEP)


def one_line(exc: CdcError) -> None:
    assert str(exc) and "\n" not in str(exc), str(exc)


@bounded(300)
@given(st.sampled_from(TABLES), _typed)
@example(TABLES[0], DEEP).via("a key nested deeper than json parses")
@example(TABLES[1], DEEP).via("a text key that looks like deep JSON")
def test_a_key_for_cdc_get_is_debeziums_key_or_one_query_error(t: Table, key: str) -> None:
    try:
        given_key = key_json(t, key)
    except QueryError as exc:
        one_line(exc)
        return
    parsed = json.loads(given_key)
    assert list(parsed) == list(t.key)


def test_a_text_key_nested_deeper_than_json_parses_is_the_text_itself() -> None:
    """json.loads raised RecursionError (not a ValueError) for it: `cdc get` crashed."""
    assert json.loads(key_json(TABLES[1], DEEP)) == {"code": DEEP}
    with pytest.raises(QueryError, match="is an integer"):
        key_json(TABLES[0], DEEP)


class _Rows:
    def __init__(self, rows: list[tuple[str, str]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[str, str]]:
        return self.rows

    def fetchone(self) -> tuple[bool]:
        return (False,)  # no cdc.captured: no table was renamed


class _Catalog:
    """A connection whose catalog holds `names` (schema, table)."""

    def __init__(self, names: list[tuple[str, str]]) -> None:
        self.names = names
        self.info = mock.Mock(dbname="db")

    def execute(self, query: str, params: Any = None) -> _Rows:
        return _Rows(self.names)


_name = st.text(min_size=1, max_size=6).filter(lambda s: "." not in s)
_pattern = st.text(max_size=12) | st.tuples(_name, st.text(max_size=6)).map(".".join)


@bounded(200)
@given(
    st.lists(st.tuples(_name, _name), max_size=5, unique=True),
    st.lists(_pattern, max_size=3),
    st.lists(_pattern, max_size=2),
)
@example([], [".\n"], []).via("a pattern with a line break: a message of two lines")
def test_table_patterns_select_tables_or_say_why_not(
    names: list[tuple[str, str]], patterns: list[str], excluded: list[str]
) -> None:
    try:
        pipeline = PipelineSettings(tables=patterns, exclude_tables=excluded)
    except ValidationError:
        return
    with mock.patch("cdc.core.catalog.describe_table", lambda conn, qualified, p: qualified):
        try:
            chosen = resolve_tables(_Catalog(names), pipeline)  # type: ignore[arg-type]
        except CdcError as exc:
            one_line(exc)
            return
    existing = {f"{s}.{n}" for s, n in names}
    assert chosen and set(chosen) <= existing  # type: ignore[arg-type]


@bounded(100)
@given(st.lists(st.text(max_size=10), max_size=3))
@example(["\n"]).via("a line break")
def test_store_names_are_stores_or_one_config_error(names: list[str]) -> None:
    try:
        check_store_names(names)
    except CdcError as exc:
        one_line(exc)


@bounded(300)
@given(st.text(max_size=60))
@example("a = '$$' ) ; --").via("quotes, dollars and a statement")
@example("$a$ ; $a").via("an unterminated dollar quote")
def test_a_filter_is_one_expression_or_says_why_not(where: str) -> None:
    problem = filter_problem(where)
    assert problem is None or (problem and "\n" not in problem)
    try:
        _check_filter_size(where)
    except BackfillError as exc:
        one_line(exc)


_duration = st.from_regex(r"\A\d+ (second|minute|hour|day)s?\Z") | st.text(max_size=20)


@bounded(200)
@given(_duration)
@example("1" * 5000 + " seconds").via("a count int() refuses")
@example("\u0661 minute").via("an Arabic-Indic digit, which Spark does not read")
def test_a_window_duration_is_refused_by_the_settings_or_read(text: str) -> None:
    try:
        window = TumblingWindow(name="w", table="public.t", window=text, watermark=text)
    except ValidationError:
        return
    assert duration_ms(window.window) >= 0
    assert window.window.isascii()  # Spark reads the same text


@bounded(200)
@given(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()))
@example(b"[1]").via("a dead letter that is not an object")
@example(b'{"partition": "x"}').via("a partition that is not a number")
@example(b'{"key": [1]}').via("a key that is not text")
def test_any_record_of_the_dead_letter_topic_is_a_dead_letter_or_none(value: bytes) -> None:
    letter = _letter(mock.Mock(value=value, partition=0, offset=0))
    assert letter is None or isinstance(letter, DeadLetter)
    if letter is not None and letter.key is not None:
        _is_key(letter.key, ("id",))


_KEYS = ["current_collection_in_progress", "data_collection", "last_processed_key"]
_KEYS += ["maximum_key", "total_rows_scanned", "status", "scanned_collection"]
_notes = json_values | st.fixed_dictionaries(
    {"aggregate_type": st.just("Incremental Snapshot")},
    optional={
        "id": st.text(max_size=4),
        "type": st.sampled_from(["STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"])
        | json_values,
        "additional_data": st.fixed_dictionaries(
            {}, optional={k: st.integers().map(str) | json_values for k in _KEYS}
        )
        | json_values,
    },
)


@bounded(200)
@given(_notes, st.none() | st.text(max_size=4))
@example({"aggregate_type": "Incremental Snapshot", "additional_data": [1]}, None).via(
    "additional_data that is not an object"
)
@example(
    {"aggregate_type": "Incremental Snapshot", "additional_data": {"total_rows_scanned": "x"}},
    None,
).via("a row count that is not a number")
@example([1], None).via("a notification that is not an object")
@example(
    {
        "aggregate_type": "Incremental Snapshot",
        "additional_data": {"total_rows_scanned": "9" * 5000},
    },
    None,
).via("a row count int() refuses")
@example(
    {"aggregate_type": "Incremental Snapshot", "additional_data": {"last_processed_key": [1]}},
    None,
).via("a key that is not text")
def test_any_backfill_notification_is_taken_or_ignored(note: Any, signal: str | None) -> None:
    progress = BackfillProgress(signal_id=signal)
    _follow(progress, note)
    progress.fraction  # noqa: B018 - what the progress bar shows
    assert isinstance(progress.state, str)


_shown = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=30).filter(
    lambda t: t == t.strip()
)


@bounded(200)
@given(_shown)
@example("[/x]").via("a closing markup tag: rich's MarkupError")
@example("[bold]x").via("an opening markup tag: swallowed")
@example(":fire:").via("an emoji code: printed as an emoji")
def test_what_a_command_prints_is_the_text_as_it_is(text: str) -> None:
    """A value from a store or the log (`cdc get`, `cdc query`, `cdc dlq list`) printed
    for people: the text itself, never read as markup."""
    out = Output(OutputForm.text, console())
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        out.console.file = printed
        out.emit(None, text)
        out.rows(["value"], [(text,)])
    lines = printed.getvalue().splitlines()
    assert lines[0] == text
    assert any(text in line for line in lines[1:]) or len(text) > 20  # a cell may wrap


@pytest.mark.parametrize(
    "where",
    [
        "id IN (SELECT 1 AS a$q$)) OR ((SELECT 1 AS b$q$) IS NOT NULL",  # a$q$: an identifier
        "id > 0) OR (true",
        "x$$ = 1) OR (true",
    ],
)
def test_a_filter_that_leaves_its_where_clause_is_refused(where: str) -> None:
    """PostgreSQL reads `a$q$` as one identifier: taking its `$q$` for a dollar quote
    hid the `)` that ends the WHERE clause Debezium pastes the filter into."""
    assert filter_problem(where) == "it closes a parenthesis it did not open"


@pytest.mark.parametrize(
    "where", ["note = $q$it's ) fine$q$", "e = E'\\')' AND a$b = 1", "price > $1$ OR true"]
)
def test_quoted_text_and_identifiers_with_dollars_pass(where: str) -> None:
    assert filter_problem(where) is None


@bounded(300)
@given(st.lists(st.text(max_size=12), max_size=6), st.booleans())
@example(["_cdc_\n"], True).via("a reserved name with a line break")
def test_any_column_names_are_storable_or_refused_in_one_line(
    names: list[str], warehouse: bool
) -> None:
    problem = reserved_problem(names, ("warehouse",) if warehouse else ())
    reserved = any(n.startswith("_cdc_") for n in names) or (
        warehouse and any(n in ("valid_from", "valid_to") for n in names)
    )
    assert (problem is not None) == reserved
    assert problem is None or "\n" not in problem


@bounded(300)
@given(st.text(max_size=40))
@example("\x1b]52;c;aGk=\x07\x9b2J").via("OSC 52 and a C1 control sequence introducer")
def test_any_value_is_shown_without_a_control_character(value: str) -> None:
    text = shown(value)
    assert not any((ord(c) < 32 and c not in "\t\n") or 127 <= ord(c) < 160 for c in text)
    assert text == value or "\\x" in text
