"""Reconcile each store with the source at a consistent cut.

The cut: note PostgreSQL's current LSN, wait until the slot has confirmed it (every
change before it is in Kafka), note the change topics' end offsets, and wait until
each store has applied up to them. Then each table is read from the source and from
each store, every row brought to one canonical form per store, and compared: row
counts first, then per-key content hashes, narrowing to the keys that differ. A key
that differs is compared again after a fresh cut (the source may have moved on since
it was read); only what still differs is drift.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from datetime import time as clock
from decimal import Decimal
from ipaddress import IPv4Address, IPv6Address
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

from cdc.catalog import TRUNCATIONS_TABLE, Column, Table
from cdc.clients import opensearch_client, redis_client
from cdc.decode import Interval, decode_value, parse_interval
from cdc.errors import CdcError, VerifyError
from cdc.settings import JoinView, Settings
from cdc.source import admin_connection
from cdc.topics import change_topic
from materializers.progress import Progress, read_progress
from materializers.typed import quoted as q

__all__ = [
    "Drift",
    "backfill_keys",
    "consistent_cut",
    "key_filters",
    "key_text",
    "normalize",
    "source_rows",
    "store_rows",
    "verify",
]

EXAMPLES = 5


@dataclass
class Drift:
    """One store's differences from the source for one table."""

    store: str
    table: str
    source_rows: int
    store_rows: int
    missing: list[str] = field(default_factory=list)  # keys the store lacks
    extra: list[str] = field(default_factory=list)  # keys only the store has
    different: list[str] = field(default_factory=list)  # keys whose values differ

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)


def normalize(value: Any) -> Any:
    """psycopg's value of a column in the decoder's terms (cdc.decode)."""
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, UUID | IPv4Address | IPv6Address):
        return str(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def key_text(table: Table, row: dict[str, Any]) -> str:
    """The row's key in one form whichever side it comes from (psycopg's values, a change
    event's key decoded, a Delta row): compact JSON, key columns in order, each value as
    PostgreSQL reads it back in a filter (times in ISO 8601, a timestamptz in UTC, bytea
    as `\\x` hex, a real at the digits that tell it apart)."""
    key = {}
    for name in table.key:
        key[name] = _key_value(table.column(name), row[name])
    return json.dumps(key, separators=(",", ":"), ensure_ascii=False)


def _key_value(column: Column, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, datetime):
        if column.base == "timestamptz":  # a Delta timestamp is UTC without its zone
            value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
        return value.isoformat()
    if isinstance(value, date | clock):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, float) and column.base == "float4":
        return _shortest_real(value)
    if isinstance(value, float):
        return value
    return str(value)


def _shortest_real(value: float) -> float:
    """The shortest decimal of a real's binary value: psycopg reads a real's text into a
    double, Delta's float holds the binary; the same real gives the same number, and
    reals that differ in any bit differ."""
    if value != value or value in (float("inf"), float("-inf")):
        return value
    packed = struct.pack("<f", value)
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == packed:
            return short
    return value


def store_key_text(table: Table, key: str) -> str:
    """A change event's key (Debezium's JSON: a cache key's tail, a document's _id) in
    key_text's form."""
    raw = json.loads(key)
    return key_text(table, {c: decode_value(table.column(c), raw.get(c)) for c in table.key})


def source_rows(
    settings: Settings,
    table: Table,
    keys: list[str] | None = None,
    query: sql.Composed | None = None,
) -> dict[str, dict[str, Any]]:
    """The table's rows now (or only those with `keys`), by key text, values normalized;
    `query` (selecting the table's columns) reads them instead of the table itself."""
    with psycopg.connect(settings.postgres.dsn()) as conn:
        conn.execute("SET intervalstyle = iso_8601")
        conn.adapters.register_loader("interval", TextLoader)
        # JSON_TEXT: json and jsonb as PostgreSQL prints them, the text every store
        # compares (json's key order and spaces are data)
        conn.adapters.register_loader("json", TextLoader)
        conn.adapters.register_loader("jsonb", TextLoader)
        query = query or sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
            sql.Identifier(table.schema, table.name),
        )
        intervals = {c.name for c in table.columns if c.base == "interval"}
        result = {}
        with conn.cursor(name="verify") as cursor:
            cursor.itersize = 5000
            cursor.execute(query)
            names = [d.name for d in cursor.description or []]
            for record in cursor:
                values = {}
                for name, value in zip(names, record, strict=True):
                    if name in intervals and value is not None:
                        value = (
                            [parse_interval(v) for v in value]
                            if isinstance(value, list)
                            else parse_interval(value)
                        )
                    values[name] = normalize(value)
                result[key_text(table, values)] = values
    if keys is not None:
        wanted = set(keys)
        result = {k: v for k, v in result.items() if k in wanted}
    return result


# ---- one canonical form per store ---------------------------------------------------


def _cache_form(table: Table, row: dict[str, Any]) -> dict[str, str]:
    from materializers.stores.cache import cache_text, json_text

    json_columns = {c.name: c for c in table.columns if c.base in ("json", "jsonb")}
    return {
        name: json_text(json_columns[name], value) if name in json_columns else cache_text(value)
        for name, value in row.items()
        if value is not None
    }


def _search_form(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    from materializers.stores.search import json_field, plain_value

    def plain(column: Column, value: Any) -> Any:
        if column.base in ("json", "jsonb"):  # the source's text (JSON_TEXT), parsed
            if isinstance(value, list):
                return json_field(column, [None if v is None else json.loads(v) for v in value])
            return json_field(column, None if value is None else json.loads(value))
        if isinstance(value, list):
            return [plain(column, v) for v in value]
        return plain_value(value)

    return {c.name: plain(c, row.get(c.name)) for c in table.columns}


def _warehouse_value(column: Column, value: Any) -> Any:
    """A value from either side in one form: text for most types."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_warehouse_value(column, v) for v in value]
    base = column.base
    if base in ("json", "jsonb"):  # text on both sides, compared as such (JSON_TEXT)
        return value
    if base == "interval":
        parsed = parse_interval(value) if isinstance(value, str) else value
        return json.dumps(parsed.__dict__) if isinstance(parsed, Interval) else str(parsed)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, clock):
        return value.strftime("%H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if base == "float4":
        return _shortest_real(value)
    if isinstance(value, Decimal):
        return str(value)
    return str(value) if not isinstance(value, bool | int | float) else value


def _warehouse_form(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    return {c.name: _warehouse_value(c, row.get(c.name)) for c in table.columns}


FORMS = {"cache": _cache_form, "search": _search_form, "warehouse": _warehouse_form}


def store_rows(settings: Settings, store: str, table: Table) -> dict[str, dict[str, Any]]:
    """The live rows a store holds for `table`, by key text, in that store's form."""
    if store == "cache":
        return _cache_rows(settings, table)
    if store == "search":
        return _search_rows(settings, table)
    return _warehouse_rows(settings, table)


def _cache_rows(settings: Settings, table: Table) -> dict[str, dict[str, Any]]:
    from materializers.stores.cache import cache_key, column_fields

    client = redis_client(settings.redis)
    prefix = cache_key(settings.pipeline.topic_prefix, table.qualified, "")
    rows = {}
    keys = list(client.scan_iter(match=prefix.replace("[", "\\[") + "*", count=2000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    for key, entry in zip(keys, pipe.execute(), strict=True):
        fields = {k.decode(): v.decode() for k, v in entry.items()}
        if fields and "_deleted" not in fields:
            rows[store_key_text(table, key.decode()[len(prefix) :])] = column_fields(fields)
    return rows


def _search_rows(settings: Settings, table: Table) -> dict[str, dict[str, Any]]:
    from opensearchpy import helpers

    from materializers.stores.search import index_name

    client = opensearch_client(settings.opensearch.url, 60)
    index = index_name(settings.pipeline.topic_prefix, table.qualified)
    if not client.indices.exists(index=index):
        return {}
    client.indices.refresh(index=index)
    names = {c.name for c in table.columns}
    return {
        store_key_text(table, hit["_id"]): {name: hit["_source"].get(name) for name in names}
        for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}})
    }


def _warehouse_rows(
    settings: Settings, table: Table, path: str | None = None
) -> dict[str, dict[str, Any]]:
    """The table's live rows in the warehouse; or the rows of the Delta table at `path`
    (a join view, whose deleted rows are gone)."""
    from delta.tables import DeltaTable

    from cdc.spark import spark_session
    from materializers.stores.delta_tables import current_path, warehouse_root

    spark = spark_session(settings, "cdc-verify")
    live = path is None
    path = path or current_path(warehouse_root(settings), table.qualified)
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    frame = spark.read.format("delta").load(path)
    if live:
        frame = frame.where("NOT _cdc_deleted")
    names = [c.name for c in table.columns]
    rows = {}
    for record in frame.select(*[q(n) for n in names]).toLocalIterator():
        values = dict(zip(names, record, strict=True))
        rows[key_text(table, values)] = _warehouse_form(table, values)
    return rows


# ---- the cut and the comparison -----------------------------------------------------


def consistent_cut(
    settings: Settings, tables: list[Table], stores: list[str], timeout: float
) -> None:
    """Wait until every store has applied every change committed before now."""
    from cdc.topics import end_offsets

    deadline = time.monotonic() + timeout
    with admin_connection(settings) as conn:
        conn.autocommit = True
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        while True:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (lsn, settings.pipeline.slot),
            ).fetchone()
            if row is None:
                raise VerifyError(
                    f"pipeline {settings.pipeline.name} has no slot {settings.pipeline.slot}: "
                    "run `cdc snapshot` first"
                )
            if row[0]:
                break
            if time.monotonic() > deadline:
                raise VerifyError(
                    f"the connector has not confirmed LSN {lsn} within {timeout:.0f}s: "
                    "check `cdc status` (is Kafka Connect running?)"
                )
            time.sleep(0.5)
    topics = [change_topic(settings.pipeline, t.qualified) for t in tables]
    topics.append(change_topic(settings.pipeline, TRUNCATIONS_TABLE))
    ends = end_offsets(settings.kafka.bootstrap_servers, topics)
    for store in stores:
        while True:
            behind = (read_progress(settings, store) or Progress()).behind(ends)
            if not behind:
                break
            if time.monotonic() > deadline:
                raise VerifyError(
                    f"store {store} has not applied up to the cut within {timeout:.0f}s "
                    f"({len(behind)} partitions behind, e.g. {behind[0]}): is `cdc apply` "
                    "running? (`cdc apply --once` applies what the topics hold)"
                )
            time.sleep(0.5)


def _digest(form: dict[str, Any]) -> str:
    text = json.dumps(form, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()


def _compare(
    store: str, table: Table, source: dict[str, dict[str, Any]], held: dict[str, dict[str, Any]]
) -> Drift:
    form = FORMS[store]
    drift = Drift(store, table.qualified, len(source), len(held))
    if len(source) == len(held) and _fingerprint(source, form, table) == _fingerprint(
        held, None, table
    ):
        return drift  # the cheap aggregate agrees: no need to look key by key
    drift.missing = sorted(set(source) - set(held))
    drift.extra = sorted(set(held) - set(source))
    drift.different = sorted(
        k for k in set(source) & set(held) if _digest(form(table, source[k])) != _digest(held[k])
    )
    return drift


def _fingerprint(rows: dict[str, dict[str, Any]], form: Any, table: Table) -> int:
    """An order-free aggregate of every (key, content) pair."""
    total = 0
    for key, row in rows.items():
        content = _digest(form(table, row) if form else row)
        total ^= int(hashlib.sha1(f"{key}\0{content}".encode()).hexdigest()[:15], 16)
    return total


def verify(
    settings: Settings,
    tables: list[Table],
    stores: list[str],
    timeout: float = 120.0,
    rounds: int = 3,
) -> list[Drift]:
    """Each (store, table)'s drift from the source; an empty difference means in sync."""
    consistent_cut(settings, tables, stores, timeout)
    results = []
    for table in tables:
        source = source_rows(settings, table)
        for store in stores:
            results.append(_compare(store, table, source, store_rows(settings, store, table)))
    for _ in range(rounds - 1):  # what differs may have changed since: look again
        suspects = [d for d in results if not d.ok]
        if not suspects:
            break
        time.sleep(1)
        consistent_cut(settings, tables, stores, timeout)
        for drift in suspects:
            table = next(t for t in tables if t.qualified == drift.table)
            keys = drift.missing + drift.extra + drift.different
            source = source_rows(settings, table, keys)
            held = store_rows(settings, drift.store, table)
            again = _compare(drift.store, table, source, {k: held[k] for k in keys if k in held})
            drift.missing, drift.extra, drift.different = (
                again.missing,
                again.extra,
                again.different,
            )
    return results


def view_table(join: JoinView, tables: dict[str, Table]) -> Table:
    """A join view as a table: the left table's columns and key, then the referenced
    table's columns under their prefix."""
    left, right = tables[join.table], tables[join.references]
    carried = tuple(
        replace(right.column(c), name=join.column_prefix + c, not_null=False) for c in join.columns
    )
    return Table("_views", join.name, (*left.columns, *carried), left.key, "d", 0, 0)


def _view_query(join: JoinView, tables: dict[str, Table]) -> sql.Composed:
    """The view as PostgreSQL computes it: a LEFT JOIN on the referenced primary key."""
    left, right = tables[join.table], tables[join.references]
    (ref,) = right.key
    return sql.SQL("SELECT {}, {} FROM {} AS l LEFT JOIN {} AS r ON r.{} = l.{}").format(
        sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(c.name)) for c in left.columns),
        sql.SQL(", ").join(
            sql.SQL("r.{} AS {}").format(sql.Identifier(c), sql.Identifier(join.column_prefix + c))
            for c in join.columns
        ),
        sql.Identifier(left.schema, left.name),
        sql.Identifier(right.schema, right.name),
        sql.Identifier(ref),
        sql.Identifier(join.on),
    )


def verify_join(
    settings: Settings, join: JoinView, tables: dict[str, Table], rounds: int = 3
) -> Drift:
    """The join view in the warehouse against the same join computed by PostgreSQL, after
    a cut on both tables (a row that differs is looked at again after a fresh cut)."""
    from materializers.stores.delta_tables import warehouse_root
    from materializers.views import view_path

    view = view_table(join, tables)
    sides = [tables[join.table], tables[join.references]]
    path = view_path(warehouse_root(settings), join.name)
    drift = Drift("warehouse", f"view {join.name}", 0, 0)
    for _ in range(rounds):
        consistent_cut(settings, sides, ["warehouse"], 120.0)
        source = source_rows(settings, view, query=_view_query(join, tables))
        drift = _compare("warehouse", view, source, _warehouse_rows(settings, view, path))
        drift.table = f"view {join.name}"
        if drift.ok:
            break
        time.sleep(1)
    return drift


# ---- repair -------------------------------------------------------------------------

REPAIR_WHOLE_TABLE_SHARE = 0.5  # at least this share of a table's rows drifted: backfill it all
REPAIR_FILTER_CHARS = 64 * 1024  # one backfill signal's key filter at most (a few thousand keys)
REPAIR_TIMEOUT = 600.0  # seconds each signal's backfill may take


def repair(
    settings: Settings,
    tables: list[Table],
    drifts: list[Drift],
    report: Callable[[str], None] | None = None,
) -> list[str]:
    """Mend what verify found; returns what was done, one line each.

    Keys a store lacks or holds different values for are backfilled (Debezium's
    incremental snapshot of just those keys, or of the table when at least half its
    rows drifted): the rows come through the log again at new positions and every
    store takes them. The keys go in signals of at most REPAIR_FILTER_CHARS of filter
    each, one after the other (Debezium keeps a running backfill's filter in its
    offsets, and reads a queue of them one by one anyway); `report` hears of each.
    Keys only a store has (no such row in the source) are removed from that store.
    """
    done = []
    by_name = {t.qualified: t for t in tables}
    for name in sorted({d.table for d in drifts if not d.ok}):
        table = by_name[name]
        mine = [d for d in drifts if d.table == name]
        stale = sorted({k for d in mine for k in d.missing + d.different})
        if stale:
            filters = repair_filters(table, stale, max(d.source_rows for d in mine))
            backfill_keys(settings, table, filters, len(stale), report)
            if filters is None:
                done.append(f"{name}: backfilled the whole table ({len(stale)} keys drifted)")
            else:
                signals = f"{len(filters)} signal" + ("s" if len(filters) > 1 else "")
                done.append(f"{name}: backfilled {len(stale)} keys ({signals})")
        for drift in mine:
            if drift.extra:
                _remove(settings, drift.store, table, drift.extra)
                done.append(f"{name}: removed {len(drift.extra)} keys only {drift.store} had")
    return done


def repair_filters(table: Table, stale: list[str], source_rows: int) -> list[str] | None:
    """The backfill filters that bring back the `stale` keys: None for the whole table."""
    if len(stale) >= REPAIR_WHOLE_TABLE_SHARE * source_rows:
        return None
    return key_filters(table, stale)


def key_filters(table: Table, keys: list[str], limit: int = REPAIR_FILTER_CHARS) -> list[str]:
    """WHERE clauses that together match exactly these keys, each at most `limit` long
    (a single key longer than that gets a clause of its own)."""
    head = _key_columns(table)
    filters: list[str] = []
    rows: list[str] = []
    size = len(head) + 1
    for key in keys:
        row = _key_row(table, key)
        if rows and size + len(row) + 2 > limit:
            filters.append(f"{head}{', '.join(rows)})")
            rows, size = [], len(head) + 1
        rows.append(row)
        size += len(row) + 2
    if rows:
        filters.append(f"{head}{', '.join(rows)})")
    return filters


def _key_filter(table: Table, keys: list[str]) -> str:
    """A WHERE clause matching exactly these keys (key texts as verify reports them)."""
    return f"{_key_columns(table)}{', '.join(_key_row(table, k) for k in keys)})"


def _key_columns(table: Table) -> str:
    columns = sql.SQL(", ").join(sql.Identifier(k) for k in table.key).as_string(None)
    return f"({columns}) IN ("


def _key_row(table: Table, key: str) -> str:
    values = json.loads(key)
    return (
        sql.SQL("({})")
        .format(sql.SQL(", ").join(sql.Literal(values[c]) for c in table.key))
        .as_string(None)
    )


def backfill_keys(
    settings: Settings,
    table: Table,
    filters: list[str] | None,
    keys: int,
    report: Callable[[str], None] | None,
) -> None:
    """One incremental snapshot per filter (or of the whole table), each to its end."""
    from cdc.errors import BackfillError
    from snapshot.backfill import start_backfill, watch_backfill

    parts: list[str | None] = [None] if filters is None else list(filters)
    for number, where in enumerate(parts, 1):
        try:
            signal, offset = start_backfill(settings, table.qualified, where)
            watch_backfill(settings, offset, lambda _: None, REPAIR_TIMEOUT, signal_id=signal)
        except BackfillError as exc:
            part = f" (signal {number} of {len(parts)})" if len(parts) > 1 else ""
            raise VerifyError(f"the repair of {table.qualified} failed{part}: {exc}") from None
        if report is not None:
            report(f"{table.qualified}: backfill {number} of {len(parts)} done ({keys} keys)")


def _remove(settings: Settings, store: str, table: Table, keys: list[str]) -> None:
    try:
        _remove_from(settings, store, table, keys)
    except CdcError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise VerifyError(
            f"could not remove {len(keys)} keys only {store} has from {table.qualified} "
            f"({first}): check `cdc status`, then run `cdc verify --repair` again"
        ) from None


REMOVE_BATCH = 1000  # keys per cache DEL, per warehouse UPDATE of a many-column key


def _remove_from(settings: Settings, store: str, table: Table, keys: list[str]) -> None:
    if store == "cache":
        from materializers.stores.cache import cache_key

        # the store's own keys (Debezium's JSON) of the keys to remove
        client = redis_client(settings.redis)
        prefix = cache_key(settings.pipeline.topic_prefix, table.qualified, "").encode()
        wanted = set(keys)
        held = [
            k
            for k in client.scan_iter(match=prefix.replace(b"[", b"\\[") + b"*", count=2000)
            if store_key_text(table, k[len(prefix) :].decode()) in wanted
        ]
        for at in range(0, len(held), REMOVE_BATCH):
            client.delete(*held[at : at + REMOVE_BATCH])
    elif store == "search":
        from opensearchpy import helpers

        from materializers.stores.search import index_name

        index = index_name(settings.pipeline.topic_prefix, table.qualified)
        client = opensearch_client(settings.opensearch.url, 60)
        wanted = set(keys)
        ids = [
            hit["_id"]
            for hit in helpers.scan(
                client, index=index, query={"query": {"match_all": {}}}, _source=False
            )
            if store_key_text(table, hit["_id"]) in wanted
        ]
        actions = ({"_op_type": "delete", "_index": index, "_id": k} for k in ids)
        helpers.bulk(client, actions, raise_on_error=False, refresh=True)
    else:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from cdc.spark import spark_session
        from materializers.stores.delta_tables import current_path, warehouse_root

        spark = spark_session(settings, "cdc-verify")
        target = DeltaTable.forPath(spark, current_path(warehouse_root(settings), table.qualified))
        # the Delta values of the keys to remove (a key's text is not its Delta value)
        wanted = set(keys)
        live = target.toDF().where("NOT _cdc_deleted").select(*[q(k) for k in table.key])
        values = [
            row.asDict()
            for row in live.toLocalIterator()
            if key_text(table, row.asDict()) in wanted
        ]
        if not values:
            return
        if len(table.key) == 1:  # one IN list (Spark makes it a hash set)
            column = table.key[0]
            condition = F.col(q(column)).isin([v[column] for v in values])
            target.update(condition, {"_cdc_deleted": F.lit(True)})
            return
        for at in range(0, len(values), REMOVE_BATCH):
            matches = []
            for value in values[at : at + REMOVE_BATCH]:
                match = F.lit(True)
                for column in table.key:
                    match = match & (F.col(q(column)) == F.lit(value[column]))
                matches.append(match)
            target.update(_any_of(matches), {"_cdc_deleted": F.lit(True)})


def _any_of(conditions: list[Any]) -> Any:
    """OR of the conditions as a balanced tree (a chain of thousands is too deep for Spark)."""
    while len(conditions) > 1:
        pairs = [conditions[i : i + 2] for i in range(0, len(conditions), 2)]
        conditions = [p[0] | p[1] if len(p) == 2 else p[0] for p in pairs]
    return conditions[0]
