"""Fuzz: change events from Kafka, any bytes as a record's key and value, any JSON, and
Debezium-like envelopes with wrong types, reach the Python stores' per-record parsing
(cdc/apply/row_batches.py, run by Spark's Python workers) and the decoding every store
does (cdc/types/decode.py, the cache's and the search index's forms, PostgreSQL's input text
for generated columns). Each record either becomes a dead letter with a readable error
or is applied; nothing raises out of a partition, which would fail the whole batch again
and again.

The warehouse parses its events with Spark's from_json (cdc/log/envelope.py, typed.py):
Spark is not run in this tier."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterable
from typing import Any
from unittest import mock

import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from cdc.apply.row_batches import partition_writer
from cdc.core.catalog import Column, Table
from cdc.core.errors import ValueDecodeError
from cdc.log.position import Event
from cdc.stores.base import RowStore, WriteResult
from cdc.stores.cache.store import CacheStore
from cdc.stores.search.store import FastJSON
from cdc.types.decode import DEBEZIUM_PLACEHOLDER, UNAVAILABLE, decode_value
from cdc.types.keys import store_key_text
from cdc.types.postgres_text import postgres_text
from cdc.types.store_forms import document_value
from tests.unit.fuzzing import bounded, json_values


def column(
    name: str, type_: str, base: str, array: bool = False, precision: int | None = None
) -> Column:
    return Column(name, type_, base, "X", array, precision, False)


# a column of every base type the decoders tell apart, and arrays of a few
COLUMNS = (
    column("id", "integer", "int4"),
    column("i2", "smallint", "int2"),
    column("i8", "bigint", "int8"),
    column("flag", "boolean", "bool"),
    column("f4", "real", "float4"),
    column("f8", "double precision", "float8"),
    column("num", "numeric", "numeric"),
    column("price", "numeric(10,2)", "numeric"),
    column("cash", "money", "money"),
    column("doc", "json", "json"),
    column("docb", "jsonb", "jsonb"),
    column("blob", "bytea", "bytea"),
    column("day", "date", "date"),
    column("clock", "time without time zone", "time"),
    column("clocktz", "time with time zone", "timetz"),
    column("ts", "timestamp without time zone", "timestamp"),
    column("ts3", "timestamp(3) without time zone", "timestamp", precision=3),
    column("tstz", "timestamp with time zone", "timestamptz"),
    column("span", "interval", "interval"),
    column("bits", "bit(3)", "bit"),
    column("vbits", "bit varying", "varbit"),
    column("body", "text", "text"),
    column("uid", "uuid", "uuid"),
    column("tags", "hstore", "hstore"),
    column("ints", "integer[]", "int4", array=True),
    column("days", "date[]", "date", array=True),
    column("docs", "jsonb[]", "jsonb", array=True),
    column("stamps", "timestamp with time zone[]", "timestamptz", array=True),
)
TABLE = Table("public", "fuzzed", COLUMNS, ("id",), "d", 1, 1)
TOPIC = "p.public.fuzzed"

_long = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_huge = st.integers(min_value=-(2**80), max_value=2**80)
_b64 = st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())
_deep = st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n)
_iso = st.datetimes().map(lambda d: d.isoformat() + "Z")
_zoned = st.from_regex(
    r"\A[+-]?\d{4,7}-\d\d-\d\dT\d\d:\d\d(:\d\d)?(\.\d{1,9})?(Z|[+-]\d\d(:?\d\d)?)\Z"
)
_interval = st.from_regex(
    r"\A-?P(-?\d{1,5}Y)?(-?\d{1,5}M)?(-?\d{1,5}D)?(T(-?\d{1,6}H)?(-?\d{1,6}(\.\d{1,8})?S)?)?\Z"
)
# values close to what Debezium sends for each base type
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "int2": _long,
    "int4": _long,
    "int8": _huge,
    "bool": st.booleans(),
    "float4": st.floats() | st.sampled_from(["NaN", "Infinity", "-Infinity"]),
    "float8": st.floats() | st.sampled_from(["NaN", "Infinity", "-Infinity"]),
    "numeric": st.decimals().map(str)
    | st.sampled_from(["NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY", "1e999999", "sNaN"]),
    "money": st.decimals(allow_nan=False, places=2).map(str),
    "json": json_values.map(json.dumps) | _deep,
    "jsonb": json_values.map(json.dumps) | _deep,
    "bytea": _b64 | st.just(base64.b64encode(DEBEZIUM_PLACEHOLDER.encode()).decode()),
    "date": _long,
    "time": _long,
    "timetz": st.times().map(lambda t: t.isoformat() + "Z") | st.text(max_size=20),
    "timestamp": _long,
    "timestamptz": _iso | _zoned | st.sampled_from(["infinity", "-infinity"]),
    "interval": _interval,
    "bit": st.booleans() | _b64,
    "varbit": _b64,
    "text": st.text(max_size=20) | st.just(DEBEZIUM_PLACEHOLDER),
    "uuid": st.uuids().map(str),
    "hstore": st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.none()).map(json.dumps)
    | st.text(max_size=20),
}


def values_for(col: Column) -> st.SearchStrategy[Any]:
    """A column's value: plausible for its type, or any JSON (wrong types, junk)."""
    element = PLAUSIBLE[col.base] | json_values
    if col.is_array:
        return st.lists(element | st.none(), max_size=4) | json_values
    return element


def check_decoded(col: Column, raw: Any) -> None:
    """What each store does with one value: the value decodes, in the cache's and the
    search index's forms, or it raises ValueDecodeError (the store dead-letters the
    record); PostgreSQL's input text of it (generated columns) likewise; nothing else."""
    try:
        text = postgres_text(col, raw)
    except ValueDecodeError as exc:
        assert "\n" not in str(exc)
    else:
        assert text is None or isinstance(text, str)
    try:
        decode_value(col, raw)
    except ValueDecodeError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"column {col.name}:")
        return
    FastJSON().dumps({col.name: document_value(col, raw)})


_column_values = st.sampled_from(COLUMNS).flatmap(lambda c: st.tuples(st.just(c), values_for(c)))


@bounded(300)
@given(_column_values)
@example((COLUMNS[23], "not json")).via("an hstore that is not a JSON object")
@example((COLUMNS[23], "[1]")).via("an hstore that is not a JSON object")
@example((COLUMNS[23], {"k": True})).via("an hstore value that is not text")
@example((COLUMNS[19], [1])).via("a bit string that is not base64")
def test_every_value_decodes_or_is_a_value_decode_error(column_value: tuple[Column, Any]) -> None:
    check_decoded(*column_value)


def test_a_json_value_nested_deeper_than_pythons_parser_is_a_decode_error() -> None:
    """PostgreSQL takes jsonb nested thousands deep; Python's json parser stops at its
    recursion limit (RecursionError, which escaped decode_value and failed the batch)."""
    deep = "[" * 5000 + "]" * 5000
    for col in (COLUMNS[9], COLUMNS[10]):
        check_decoded(col, deep)


def test_a_json_integer_beyond_64_bits_goes_to_the_search_index() -> None:
    """jsonb holds integers of any size; orjson writes 64 bits at most (TypeError)."""
    doc = document_value(COLUMNS[10], '{"n": 123456789012345678901234567890}')
    assert "123456789012345678901234567890" in FastJSON().dumps({"docb": doc})


# --- whole records through the partition writer ---------------------------------------

_op = st.sampled_from(["c", "u", "d", "r", "t", "m"]) | st.text(max_size=3) | json_values
_position_value = _long | _huge | st.floats() | st.text(max_size=12) | st.none() | json_values
_sequence = (
    st.lists(_position_value, max_size=3).map(json.dumps)
    | st.tuples(_long, _long).map(lambda p: json.dumps([str(p[0]), str(p[1])]))
    | json_values
)
_source = (
    st.fixed_dictionaries(
        {},
        optional={
            "lsn": _position_value,
            "sequence": _sequence,
            "ts_ms": _position_value,
            "snapshot": st.sampled_from(["true", "false", "incremental", "last"]) | json_values,
            "table": st.text(max_size=8),
        },
    )
    | json_values
)


@st.composite
def images(draw: Any) -> Any:
    """An after (or before) image: some of the table's columns, with plausible or junk
    values, maybe a column it does not have; or any JSON."""
    if draw(st.integers(0, 5)) == 0:
        return draw(json_values)
    chosen = draw(st.lists(st.sampled_from(COLUMNS), max_size=6, unique_by=lambda c: c.name))
    image = {c.name: draw(values_for(c)) for c in chosen}
    if draw(st.booleans()):
        image["id"] = draw(_long)
    if draw(st.integers(0, 4)) == 0:
        image["not_a_column"] = draw(json_values)
    return image


@st.composite
def envelopes(draw: Any) -> bytes:
    """A Debezium-like envelope: op c/u/d/r/t/m or junk, before/after with wrong types,
    the source block missing or wrong, huge ints, NaN, nested junk."""
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        body["op"] = draw(_op)
    for part in ("before", "after"):
        if draw(st.booleans()):
            body[part] = draw(images() | st.none())
    if draw(st.integers(0, 5)):
        body["source"] = draw(_source)
    if draw(st.booleans()):
        body["ts_ms"] = draw(_position_value)
    if draw(st.integers(0, 9)) == 0:
        body["junk"] = float("nan")  # json.dumps writes NaN, which JSON has not
    return json.dumps(body).encode()


_keys = (
    st.none()
    | st.binary(max_size=20)
    | json_values.map(lambda v: json.dumps(v).encode())
    | _long.map(lambda i: json.dumps({"id": i}).encode())
)
_values = (
    st.none()
    | st.binary(max_size=40)
    | json_values.map(lambda v: json.dumps(v).encode())
    | envelopes()
)


def spark_strings(values: list[bytes | None]) -> pa.Array:
    """A string column as Spark hands it to a Python worker: the Kafka record's bytes cast
    to string, unchecked (bytes that are not UTF-8 stay as they are)."""
    binary = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(binary), binary.buffers(), binary.null_count)


def kafka_batch(
    records: list[tuple[bytes | None, bytes | None]],
    first_offset: int = 0,
    table: str = "public.fuzzed",
) -> pa.RecordBatch:
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([table] * n, pa.string()),
            pa.array([f"p.{table}"] * n, pa.string()),
            pa.array([0] * n, pa.int32()),
            pa.array(range(first_offset, first_offset + n), pa.int64()),
            spark_strings([k for k, _ in records]),
            spark_strings([v for _, v in records]),
        ],
        ["table", "topic", "partition", "offset", "key", "value"],
    )


class DecodingStore(RowStore):
    """Does with each event what the cache and the search index do before they write
    (the cache's script calls, the search documents as serialized), without a server;
    reads each written key back as verify does."""

    name = "fuzz"

    def __init__(self) -> None:
        self.cache = CacheStore.__new__(CacheStore)  # its script calls, without a server
        self.cache.prefix, self.cache.marker_ttl_s = "p", 60
        self.written: list[Event] = []

    def write(self, tables: dict[str, Table], events: list[Event]) -> WriteResult:
        result = WriteResult()
        self.cache._calls(tables, events, result)
        refused = {id(event) for event, _ in result.rejected}
        columns = {c.name: c for c in TABLE.columns}
        for event in events:
            if id(event) in refused:
                continue
            store_key_text(TABLE, event.key)  # verify reads the stores' keys back
            if event.op != "d" and event.after is not None:
                try:
                    doc = {
                        name: document_value(columns[name], raw)
                        for name, raw in event.after.items()
                        if name in columns and raw != UNAVAILABLE
                    }
                except ValueDecodeError as exc:
                    result.rejected.append((event, str(exc)[:500]))
                    continue
                FastJSON().dumps(doc)
            self.written.append(event)
            result.written += 1
        return result

    def prepare(self, tables: Iterable[Table]) -> None:
        pass

    def truncate(self, table: Table, before: tuple[int, int], commit_ms: int) -> None:
        pass


def apply_records(
    records: list[tuple[bytes | None, bytes | None]], chunk: int = 3
) -> list[dict[str, Any]]:
    """The records through the partition writer (the Arrow result as rows), checking that
    each one is accounted for: applied (counted), or a dead letter with a one-line error."""
    store = DecodingStore()
    run = partition_writer(
        lambda: store, {TABLE.qualified: TABLE}, lambda t: f"p.{t}", "cdc.truncations", {}, chunk
    )
    batches = [kafka_batch(records[i : i + 4], i) for i in range(0, len(records), 4)]
    out = pa.Table.from_batches(list(run(iter(batches)))).to_pylist()
    dead = [r for r in out if r["kind"] == "dead"]
    for letter in dead:
        assert letter["error"] and "\n" not in letter["error"]
        assert letter["topic"] == TOPIC and 0 <= letter["offset"] < len(records)
    applied = [r for r in out if r["kind"] == "applied"]
    if records:
        assert applied and applied[0]["offset"] == len(records) - 1
    counted = sum(r["n"] or 0 for r in applied)
    refused = sum(1 for r in dead if not r["error"].startswith("not a change event"))
    # every record: counted as a change event, or a dead letter for not being one
    assert counted + len(dead) - refused == len(records)
    return out


@bounded(100)
@given(st.lists(st.tuples(_keys, _values), max_size=8))
@example([(b'{"id": 1}', b'\xff\xfe{"op": "c"}')]).via("a value that is not UTF-8")
@example([(b"\xff", None)]).via("a tombstone whose key is not UTF-8")
@example([(None, b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 1}}')]).via("no key")
@example(
    [(b'{"id": 1}', b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 1, "ts_ms": "x"}}')]
).via("ts_ms of the wrong type")
@example(
    [(b'{"id": 1}', b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 18446744073709551616}}')]
).via("an LSN beyond a long")
@example(
    [(b'{"id": 1}', b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 1, "ts_ms": 1.5}}')]
).via("ts_ms of the wrong type")
@example([(b"not json", b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 1}}')]).via(
    "a key that is not Debezium's"
)
@example(
    [
        (
            b'{"id": 1}',
            b'{"op": "c", "after": {"docb": "'
            + b"[" * 3000
            + b"]" * 3000
            + b'"}, "source": {"lsn": 1}}',
        )
    ]
).via("a jsonb value nested 3000 deep")
def test_any_kafka_record_is_applied_or_a_dead_letter(
    records: list[tuple[bytes | None, bytes | None]],
) -> None:
    apply_records(records)


def test_a_value_that_is_not_utf8_is_a_dead_letter_not_a_failed_partition() -> None:
    """Spark's string cast keeps a record's bytes unchecked; reading them as text in the
    worker raised UnicodeDecodeError for the whole partition, every time it was retried."""
    out = apply_records([(b'{"id": 1}', b'\xff{"op": "c"}'), (b'{"id": 2}', _change(2))])
    assert [(r["offset"], r["error"], r["value"]) for r in out if r["kind"] == "dead"] == [
        (0, "not a change event", '\ufffd{"op": "c"}')
    ]


def test_a_key_that_is_not_a_json_object_is_a_dead_letter() -> None:
    """The stores keep rows by the key's text and verify reads it back as JSON: a key
    that is not Debezium's (or none: the cache wrote it under "None") was written, then
    failed every `cdc verify`."""
    records = [(b"\xff\xfe", _change(1)), (b"[1]", _change(1)), (None, _change(1))]
    out = apply_records([*records, (b'{"id": 2}', _change(2))])
    dead = [(r["offset"], r["key"], r["error"]) for r in out if r["kind"] == "dead"]
    why = "not a change event: its key is not a JSON object"
    assert dead == [(0, "\ufffd\ufffd", why), (1, "[1]", why), (2, None, why)]


def test_a_source_block_of_the_wrong_types_is_a_dead_letter() -> None:
    """ts_ms as text, or a position beyond a long, failed the partition's result (a
    comparison of text with a number, Arrow's long)."""
    records = [
        (b'{"id": 1}', _change(1, ts_ms="soon")),
        (b'{"id": 2}', _change(2, lsn=2**64)),
        (b'{"id": 3}', _change(3, op="t")),
        (b'{"id": 4}', _change(4, after=None)),
        (b'{"id": 5}', _change(5)),
    ]
    out = apply_records(records)
    assert [(r["offset"], r["error"]) for r in out if r["kind"] == "dead"] == [
        (0, "not a change event: source.ts_ms is not a time in ms"),
        (1, "not a change event: its source position is not two longs"),
        (2, "not a change event: op 't' is not one of c, u, d, r"),
        (3, "not a change event: op 'c' without an after image"),
    ]


def _change(key: int, op: str = "c", after: Any = "x", lsn: Any = 10, ts_ms: Any = 1) -> bytes:
    image = {"id": key, "body": "x"} if after == "x" else after
    return json.dumps({"op": op, "after": image, "source": {"lsn": lsn, "ts_ms": ts_ms}}).encode()


_truncation = st.fixed_dictionaries(
    {"op": st.sampled_from(["c", "r", "u", "d"]), "source": st.just({"lsn": 7, "ts_ms": 1})},
    optional={
        "after": st.fixed_dictionaries({"id": _long}, optional={"table_name": json_values})
        | json_values
    },
).map(lambda v: json.dumps(v).encode())


@bounded(100)
@given(st.lists(st.tuples(_keys, _truncation | _values), max_size=6))
@example([(b'{"id": 1}', b'{"op": "c", "after": {"table_name": [1]}, "source": {"lsn": 7}}')]).via(
    "a table_name that is not text, which failed the partition's Arrow result"
)
def test_any_record_of_the_truncations_topic_is_a_truncate_or_a_dead_letter(
    records: list[tuple[bytes | None, bytes | None]],
) -> None:
    store = DecodingStore()
    run = partition_writer(
        lambda: store, {TABLE.qualified: TABLE}, lambda t: f"p.{t}", "cdc.truncations", {}, 3
    )
    out = pa.Table.from_batches(list(run(iter([kafka_batch(records, 0, "cdc.truncations")]))))
    rows = out.to_pylist()
    assert not store.written
    for row in rows:
        assert row["kind"] != "truncate" or (row["table"] and row["commit_lsn"] == 7)
        assert row["kind"] != "dead" or (row["error"] and "\n" not in row["error"])


def test_a_generated_column_whose_input_is_malformed_is_read_back_not_a_failed_batch() -> None:
    """postgres_text raised (JSONDecodeError for an hstore that is not JSON, a
    TypeError for bits that are not base64) out of the batch's generated columns."""
    from cdc.log.generated_columns import compute

    tags, bits = COLUMNS[23], COLUMNS[20]
    generated = Column(
        "g", "text", "text", "S", False, None, False, generated="x", inputs=("tags", "vbits")
    )
    table = Table("public", "gen", (COLUMNS[0], tags, bits, generated), ("id",), "d", 1, 1)

    class Source:
        def transaction(self) -> Any:
            return contextlib.nullcontext()

        def execute(self, query: Any, params: list[Any] | None = None) -> Any:
            evaluated = bool(params) and str(params[0]).startswith("SELECT v.n")  # type: ignore[index]
            found = [(0, '["computed"]')] if evaluated else []  # the row is gone: kept
            return mock.Mock(fetchall=lambda: found)

    for after in (
        {"id": 1, "tags": "not json", "vbits": "AQ=="},
        {"id": 1, "tags": "{}", "vbits": [1]},
    ):
        compute(Source(), table, [after])
        assert after["g"] == DEBEZIUM_PLACEHOLDER  # its inputs unknown: kept as the store holds it
