"""The column types whose values Debezium's change events carry (the capture's types).

Debezium's PostgreSQL connector leaves a column of a type it does not know out of every
event (`include.unknown.datatypes` = false), and carries a few others in a shape the
stores cannot hold as the source does. Such a column is not captured at all
(cdc.core.catalog.describe_table): the snapshot, which PostgreSQL formats itself, would
otherwise write values the stream never updates, and verify would compare them. Each
type here was seen in the connector's events (tests/integration/test_schema_zoo.py, and
a table of every other type read back from its topic, 2026-12-06); any other is left
out, said by `cdc setup` and `cdc snapshot` (tests/integration/test_unstreamed_types.py).

Left out, as the connector (Debezium 3.x, pgoutput) streams them: the geometric types
(point is a struct of x, y, WKB and SRID; box, circle, line, lseg, path and polygon are
dropped), multiranges, name, pg_lsn, jsonpath, tsquery, the reg* and transaction-id
types, tid, txid_snapshot, pg_snapshot and refcursor (dropped), int2vector and
oidvector (always an empty array), composite types (dropped), and the arrays of bit,
money, xml, interval, varbit, name and the types above (dropped, or null for bit).
"""

from __future__ import annotations

__all__ = ["streamed", "type_name"]

_RANGES = frozenset({"int4range", "int8range", "numrange", "daterange", "tsrange", "tstzrange"})
# base types (after domains) whose values the events carry
_SCALARS = frozenset(
    {"int2", "int4", "int8", "oid", "numeric", "money", "float4", "float8", "bool"}
    | {"text", "varchar", "bpchar", "char", "bytea", "uuid", "json", "jsonb", "xml"}
    | {"date", "time", "timetz", "timestamp", "timestamptz", "interval"}
    | {"inet", "cidr", "macaddr", "macaddr8", "bit", "varbit", "tsvector"}
    | {"hstore", "ltree", "citext"}  # extensions' types, by name
    | _RANGES
)
# element types whose arrays the events carry
_ARRAYS = frozenset(
    {"int2", "int4", "int8", "oid", "numeric", "float4", "float8", "bool"}
    | {"text", "varchar", "bpchar", "char", "bytea", "uuid", "json", "jsonb"}
    | {"date", "time", "timetz", "timestamp", "timestamptz"}
    | {"inet", "cidr", "macaddr", "macaddr8", "tsvector", "hstore", "ltree", "citext"}
    | _RANGES
)


def streamed(base: str, category: str, is_array: bool) -> bool:
    """Whether Debezium's events carry the values of a column of base type `base` (after
    domains; pg_type's `category`), or of its arrays (module doc); an enum's are."""
    if category == "E":
        return True
    return base in (_ARRAYS if is_array else _SCALARS)


def type_name(base: str, is_array: bool) -> str:
    """A column's type as a person reads it in a message: `box`, `point[]`."""
    return base + ("[]" if is_array else "")
