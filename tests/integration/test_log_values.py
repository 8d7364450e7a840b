"""Values and keys in the log: every common type exact, snapshot and stream keys identical."""

from __future__ import annotations

import psycopg
import pytest

from cdc.types.decode import decode_row
from tests.conftest import Capture
from tests.logcheck import events_by_key, table_info, wait_until_equal

pytestmark = pytest.mark.integration

TYPES = """
    id          int PRIMARY KEY,
    c_int2      int2,
    c_int4      int4,
    c_int8      int8,
    c_num       numeric(14, 4),
    c_num_free  numeric,
    c_real      real,
    c_double    double precision,
    c_bool      boolean,
    c_text      text,
    c_varchar   varchar(40),
    c_char      char(5),
    c_bytea     bytea,
    c_uuid      uuid,
    c_date      date,
    c_time      time,
    c_ts        timestamp,
    c_ts3       timestamp(3),
    c_tstz      timestamptz,
    c_interval  interval,
    c_json      json,
    c_jsonb     jsonb,
    c_int_arr   int[],
    c_text_arr  text[],
    c_num_arr   numeric[],
    c_mood      {enum},
    c_toast     text,
    c_bits      bit(12),
    c_varbit    varbit,
    c_bit1      bit(1)
"""

VALUES = """
    (1, -32768, 2147483647, -9223372036854775808, 12345.6789, 3.141592653589793238462643383279,
     1.5, 2.718281828459045, true, 'plain ascii', 'Zürich — 東京 ✓', 'ab',
     '\\x00ff10'::bytea, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-02-29', '23:59:59.999999',
     '2024-02-29 12:34:56.123456', '2024-02-29 12:34:56.789', '2024-02-29 12:34:56.123456+05:30',
     '1 year 2 mons 3 days 04:05:06.78', '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": {"c": null}}',
     '{1,2,3}', '{"x","y z",NULL}', '{1.50,-2}', 'happy',
     (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 400) g),
     B'100000000001', B'1011', B'1'),
    (2, 0, 0, 0, 0, 0, 0, 0, false, '', '', '', ''::bytea, '00000000-0000-0000-0000-000000000000',
     '1970-01-01', '00:00:00', '1970-01-01 00:00:00', '1969-12-31 23:59:59.999',
     '1999-12-31 23:59:59+00',
     '-3 days -00:00:01', '[]', '{}', '{}', '{}', '{}', 'sad', 'short', B'000000000000', B'0',
     B'0'),
    (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
"""


def test_every_common_type_round_trips_exactly(captured: Capture) -> None:
    t = captured(
        "CREATE TYPE {name}_mood AS ENUM ('sad', 'happy')",
        f"CREATE TABLE {{name}} ({TYPES.format(enum='{name}_mood')})",
        f"INSERT INTO {{name}} VALUES {VALUES}",
        prefix="types",
    )
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        # the same values again, now through Debezium's streaming
        conn.execute(
            f"INSERT INTO {t.name} SELECT id + 100, c_int2, c_int4, c_int8, "
            "c_num, c_num_free, c_real, c_double, c_bool, c_text, c_varchar, c_char, "
            "c_bytea, c_uuid, c_date, c_time, c_ts, c_ts3, c_tstz, c_interval, c_json, "
            "c_jsonb, c_int_arr, c_text_arr, c_num_arr, c_mood, c_toast, c_bits, c_varbit, "
            f"c_bit1 FROM {t.name}"
        )
    table = table_info(t.settings, t.table)
    source, records = wait_until_equal(t.settings, table, timeout=60)
    assert len(source) == 6
    # twins: a snapshot row and the streamed copy of it decode to the same values
    after = {r.value["after"]["id"]: (r.op, r.value["after"]) for r in records if r.value}
    for i in (1, 2, 3):
        snap_op, snap = after[i]
        stream_op, streamed = after[i + 100]
        assert (snap_op, stream_op) == ("r", "c")
        for bits in ("c_bits", "c_varbit", "c_bit1"):  # Debezium's Bits, byte for byte
            assert snap[bits] == streamed[bits], (i, bits, snap[bits], streamed[bits])
        a, b = decode_row(table, snap), decode_row(table, streamed)
        a.pop("id"), b.pop("id")
        assert a == b
    assert len(source[(1,)]["c_toast"]) == 12800  # stored out of line, and whole in the log


def test_snapshot_and_stream_events_of_a_row_share_key_bytes_and_partition(
    captured: Capture,
) -> None:
    t = captured(
        "CREATE TABLE {name} (region text, seq bigint, tag uuid, amount numeric(8,2), "
        "PRIMARY KEY (region, seq, tag))",
        "INSERT INTO {name} SELECT r, g, md5(r || g)::uuid, g FROM generate_series(1, 40) g, "
        "unnest(ARRAY['Zürich', 'a\"b\\\\c', 'tab\tnew\nline', '東京']) r",
        prefix="keys",
        partitions=4,
    )
    name, settings, dsn = t.name, t.settings, t.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {name} SET amount = amount + 1")
        conn.execute(f"DELETE FROM {name} WHERE seq % 10 = 0")
    table = table_info(settings, f"public.{name}")
    _, records = wait_until_equal(settings, table, timeout=60)
    by_key = events_by_key(records)
    assert len(by_key) == 160  # a snapshot key equal to its stream key: one key per row
    for key, events in by_key.items():
        assert [e.op for e in events][:2] == ["r", "u"], key
        assert len({e.partition for e in events}) == 1
    assert len({e.partition for e in records}) == 4
