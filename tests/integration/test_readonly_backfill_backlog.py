"""Finding C of the 2026-12-01 review (issue 66), on the stack: a read-only backfill
(`pipeline.read_only_backfills`) that starts while the connector lags.

Debezium reads the chunk at once, at the present, but opens its window at the next
change it processes: the connector's backlog. With the watermark's xmin 3
(sql/pipeline_schema.sql) every change of that backlog is in the window, and a key the
backlog changes is dropped from the chunk (its change is in the log). Under REPLICA
IDENTITY DEFAULT an UPDATE that leaves a TOASTed column unchanged carries only the
placeholder: a row the stores never held would keep that column NULL.

Here: a pipeline streams a table, and a second table of TOASTed rows is added to it
(`cdc tables add`, sync_pipeline) while the application updates the second table's
rows (never their TOASTed column) and the connector is behind by 100,000
transactions of the first table. Every store, read with the tests' own readers, must
then equal PostgreSQL, the TOASTed column included.

Seen on the stack (2026-12-02, two runs): read-only, 2,000 and 999 of the chunk's
2,000 keys were dropped from it, and every store held those rows without their
TOASTed value. The signal table (the default mode, whose window opens at a watermark
written at read time) is not spared by concurrent updates: 1,000 and 400 of the 2,000
keys were updated while the chunk was read and lost their value the same way.
Both are expected failures until it is fixed; with REPLICA IDENTITY FULL on the table
(the remedy docs/guarantees.md gives) the stores are exact."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from cdc.apply.job import run_apply
from cdc.capture.backfill import watch_backfill
from cdc.capture.pipeline import sync_pipeline
from cdc.core.topics import change_topic, end_offsets, notification_topic, read_topic
from tests.conftest import Capture
from tests.stores import stores

pytestmark = [pytest.mark.integration, pytest.mark.long]  # a 100,000-transaction backlog

ROWS = 2000  # the added table: one chunk (incremental.snapshot.chunk.size 2048)
BACKLOG = 100_000  # transactions of the first table the connector is behind by
BIG = 3200  # characters of each TOASTed value: 100 md5s, incompressible
STORES = ["cache", "search", "warehouse"]


class Updates(threading.Thread):
    """The application: UPDATEs a tenth of the table's rows at a time, `n = n + 1`,
    never the TOASTed column."""

    def __init__(self, dsn: str, table: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table = dsn, table
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    part = self.commits % 10
                    conn.execute(f"UPDATE {self.table} SET n = n + 1 WHERE id % 10 = {part}")
                    self.commits += 1
                    time.sleep(0.05)
        except BaseException as exc:  # the test reads it
            self.error = exc


def _full(after: dict[str, Any] | None) -> bool:
    """Whether a change event's row image holds the TOASTed value itself."""
    return bool(after) and isinstance(after.get("big"), str) and len(after["big"]) == BIG


# what a chunk's window drops: a key changed in it (its change is in the log), here by an
# UPDATE that carries the placeholder (finding C; docs/guarantees.md, "Known limits")
DROPPED = (
    "a key the chunk's window drops is in the log only as an UPDATE carrying the "
    "placeholder of its unchanged TOASTed value: a store that never held the row keeps "
    "it NULL"
)


@pytest.mark.parametrize(
    ("read_only", "identity"),
    [
        pytest.param(
            True,
            "default",
            id="read_only",
            marks=pytest.mark.xfail(
                strict=True,
                reason=f"C: the window spans the connector's whole backlog; {DROPPED}",
            ),
        ),
        pytest.param(
            False,
            "default",
            id="signal_table",
            marks=pytest.mark.xfail(
                strict=True, reason=f"C: updates committed while the chunk is read; {DROPPED}"
            ),
        ),
        # REPLICA IDENTITY FULL: PostgreSQL logs the old row whole, and Debezium fills
        # the unchanged value in
        pytest.param(True, "full", id="read_only_full_identity"),
    ],
)
def test_a_backfill_behind_a_lagging_connector_keeps_toasted_values(
    captured: Capture, read_only: bool, identity: str
) -> None:
    made = captured(
        "CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO {name} VALUES (1, 0)",
        "CREATE TABLE {name}_b (id int PRIMARY KEY, n int NOT NULL, big text)",
        "INSERT INTO {name}_b SELECT i, 0, (SELECT string_agg(md5(g::text || i::text), '') "
        f"FROM generate_series(1, 100) g) FROM generate_series(1, {ROWS}) i",
        prefix="robl",
        read_only_backfills=read_only,
        replica_identity={"public.{name}_b": identity} if identity == "full" else {},
    )
    first, second = made.table, f"{made.table}_b"
    both = made.settings.model_copy(
        update={"pipeline": made.settings.pipeline.model_copy(update={"tables": [first, second]})}
    )
    with psycopg.connect(made.dsn) as conn:
        toasted = conn.execute(
            "SELECT reltoastrelid <> 0 AND pg_relation_size(reltoastrelid) > 0 "
            "FROM pg_class WHERE oid = %s::regclass",
            (second,),
        ).fetchone()
    assert toasted == (True,), "the values are not TOASTed"

    mode = ("read-only" if read_only else "signal table") + f", identity {identity}"
    app = Updates(made.dsn, second)
    app.start()
    try:
        # the connector's backlog: BACKLOG transactions, each an UPDATE of the first
        # table's one row
        with psycopg.connect(made.dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            conn.execute(
                f"DO $$ BEGIN FOR i IN 1..{BACKLOG} LOOP "
                f"UPDATE {first} SET n = n + 1 WHERE id = 1; COMMIT; END LOOP; END $$"
            )
        notes = notification_topic(both.pipeline)
        start = end_offsets(both.kafka, [notes])[notes][0]
        result = sync_pipeline(both)  # `cdc tables add`
        assert result.backfills == [second]
        done = watch_backfill(both, start, lambda p: None, timeout=600)
        assert done.state == "COMPLETED"
        time.sleep(1)
    finally:
        app.stop.set()
        app.join(30)
    assert app.error is None and app.commits > 10, (app.error, app.commits)

    with psycopg.connect(made.dsn) as conn:
        wanted = {
            int(i): (str(n), big) for i, n, big in conn.execute(f"SELECT id, n, big FROM {second}")
        }
    assert len(wanted) == ROWS and all(
        big is not None and len(big) == BIG for _, big in wanted.values()
    )

    # the log has caught up with the table's n; how many keys it ever held whole
    topic = change_topic(both.pipeline, second)
    deadline = time.monotonic() + 300
    while True:
        records = read_topic(both.kafka, topic)
        last: dict[int, dict[str, Any]] = {}
        whole: set[int] = set()
        backfilled = 0
        for r in sorted(records, key=lambda r: (r.partition, r.offset)):
            value = r.value
            if value is None or value["after"] is None:
                continue
            key = int(value["after"]["id"])
            last[key] = value["after"]
            backfilled += value["op"] == "r"
            if _full(value["after"]):
                whole.add(key)
        logged_n = {k: str(a["n"]) for k, a in last.items()}
        if logged_n == {k: n for k, (n, _) in wanted.items()} or time.monotonic() > deadline:
            break
        time.sleep(2)
    print(
        f"\nC ({mode}): {app.commits} application UPDATE commits, {backfilled} backfilled rows in "
        f"the log, {ROWS - len(whole)} of {ROWS} keys never logged with their TOASTed value"
    )

    held: dict[str, dict[int, tuple[str, Any]]] = {}
    for _ in range(3):
        run_apply(both, STORES, once=True)
        held = {
            store: {int(k): (str(r["n"]), r.get("big")) for k, r in rows.items()}
            for store, rows in stores(both, second).items()
        }
        if all(rows == wanted for rows in held.values()):
            break
    problems = []
    for store, rows in held.items():
        missing = sorted(set(wanted) - set(rows))
        lost = sorted(k for k in set(rows) & set(wanted) if rows[k][1] != wanted[k][1])
        other = sorted(k for k in set(rows) & set(wanted) if rows[k] != wanted[k] and k not in lost)
        print(
            f"C: {store}: {len(missing)} missing, {len(lost)} without their TOASTed value, "
            f"{len(other)} otherwise different"
        )
        if missing or lost or other or set(rows) - set(wanted):
            problems.append(
                f"{store}: {len(missing)} missing, {len(lost)} TOASTed value lost "
                f"{lost[:5]}, {len(other)} otherwise different"
            )
    assert not problems, problems
