"""Property: however a per-key ordered log is cut into batches, whatever Debezium delivers
twice (at new offsets), and whatever is replayed, the stores end in the state of applying
each key's newest change once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.log.envelope import event_position
from cdc.log.position import (
    ORDER,
    Event,
    Position,
    Stored,
    apply_changes,
    is_newer,
    newest_per_key,
    older_sql,
)


def event_of(
    key: int,
    partition: int,
    offset: int,
    position: Position | None,
    row: dict | None,  # type: ignore[type-arg]
) -> Event:
    """An event of key `key` (a tombstone when `position` is None, a delete when `row` is)."""
    commit, lsn = position if position is not None else (None, None)
    op = "u" if row is not None else "d"
    return Event("t", str(key), partition, offset, op, row, None, lsn, commit)


@st.composite
def logs_and_deliveries(draw):  # type: ignore[no-untyped-def]
    keys = draw(st.lists(st.integers(0, 8), min_size=1, max_size=40))
    partitions = 3
    offsets = [0] * partitions
    log: list[Event] = []
    changes: list[Event] = []  # what the source committed, in commit order
    commit = 100
    for key in keys:
        partition = key % partitions  # a key always lands in the same partition
        if draw(st.booleans()):
            commit += 10  # a new transaction; otherwise the same one goes on
        lsn = commit + len(changes) + 1
        deleted = draw(st.booleans()) and draw(st.booleans())
        row = None if deleted else {"v": draw(st.integers())}
        change = event_of(key, partition, offsets[partition], (commit, lsn), row)
        changes.append(change)
        log.append(change)
        offsets[partition] += 1
        if deleted and draw(st.booleans()):  # the tombstone after the delete
            log.append(event_of(key, partition, offsets[partition], None, None))
            offsets[partition] += 1
        if draw(st.integers(0, 9)) == 0:  # Connect crashed: a suffix of the log again
            start = draw(st.integers(0, len(log) - 1))
            for old in list(log[start:]):
                log.append(
                    event_of(
                        int(old.key), old.partition, offsets[old.partition], old.position, old.after
                    )
                )
                offsets[old.partition] += 1
    # cut into batches at arbitrary points...
    cuts = sorted(draw(st.sets(st.integers(1, max(len(log) - 1, 1)), max_size=10)))
    batches = [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True) if log[a:b]]
    # ...and deliver them in order, with arbitrary replays of earlier batches in between
    # and at the end (restarts from old checkpoints, retried batches), each batch in any
    # order inside; Debezium's deliveries again include tombstones after newer changes
    deliveries = []

    def replays(upto: int) -> None:
        # a restart from an old checkpoint reads everything from it up to where it was
        for _ in range(draw(st.integers(0, 2))):
            start = draw(st.integers(0, upto))
            deliveries.extend(draw(st.permutations(b)) for b in batches[start:upto])

    for i, batch in enumerate(batches):
        replays(i)
        deliveries.append(draw(st.permutations(batch)))
    replays(len(batches))
    return changes, deliveries


@settings(max_examples=400, deadline=None)
@given(logs_and_deliveries())
def test_any_batching_duplicates_and_replays_converge(case) -> None:  # type: ignore[no-untyped-def]
    changes, deliveries = case
    state: dict = {}
    for batch in deliveries:
        apply_changes(state, batch)
    newest = newest_per_key(changes)
    assert {k: s.position for k, s in state.items()} == {k: c.position for k, c in newest.items()}
    # rows visible to readers: deleted markers hide their key
    visible = {k: s.row for k, s in state.items() if s.row is not None}
    assert visible == {k: c.after for k, c in newest.items() if c.after is not None}


def test_an_older_write_is_refused_and_an_equal_one_is_a_no_op() -> None:
    assert is_newer((5, 1), None)
    assert is_newer((5, 1), Stored((4, 9), {"v": 1}))
    assert is_newer((5, 2), Stored((5, 1), {"v": 1}))  # later in the same transaction
    assert not is_newer((5, 1), Stored((5, 1), {"v": 1}))  # the same change, delivered again
    assert not is_newer((3, 7), Stored((5, 1), None))  # a deleted marker refuses a stale write


def test_a_tombstone_deletes_only_what_an_earlier_record_wrote() -> None:
    state: dict = {"7": Stored((5, 6), {"v": 1}, offset=3)}
    apply_changes(state, [event_of(7, 0, 2, None, None)])  # read again from an old checkpoint
    assert state["7"].row == {"v": 1}
    apply_changes(state, [event_of(7, 0, 4, None, None)])  # the delete itself was compacted
    assert state["7"] == Stored((5, 5), None, 4)  # just below the change it deleted
    apply_changes(state, [event_of(7, 0, 1, (5, 4), {"v": 0})])  # an older change: refused
    assert state["7"].row is None
    # a tombstone Debezium delivered again after a newer change of its key deletes it for a
    # moment; the newer change, delivered again right after, is taken again
    apply_changes(state, [event_of(7, 0, 5, (5, 6), {"v": 1})])
    assert state["7"] == Stored((5, 6), {"v": 1}, 5)


def test_positions_from_debezium_source_blocks() -> None:
    streamed = {"lsn": 4000, "sequence": '["3900","4000"]'}
    assert event_position("u", streamed) == (3900, 4000)
    assert event_position("r", {"lsn": 3000, "sequence": None}) == (3000, 0)  # initial snapshot
    # Debezium's backfill rows: no lsn, the sequence after the watermark's commit
    backfill = {"lsn": None, "sequence": '["5000","5000"]', "snapshot": "incremental"}
    assert event_position("r", backfill) == (5000, 0)
    # a transaction that began before the watermark and committed after it comes later
    assert event_position("u", {"lsn": 4990, "sequence": '["5000","4990"]'}) > (5000, 0)
    # a first transaction of a connector started without an offset (not by cdc)
    assert event_position("c", {"lsn": 4100, "sequence": '[null,"4100"]'}) == (4100, 4100)
    assert event_position("c", {"ts_ms": 1}) is None
    # the snapshot sits before every change streamed after its consistent point
    assert event_position("r", {"lsn": 3000}) < event_position(
        "c", {"lsn": 2990, "sequence": '["3000","2990"]'}
    )


def test_a_resumed_snapshots_rows_sit_after_the_first_runs_and_before_the_stream() -> None:
    import pyarrow as pa

    from cdc.capture.slot import SnapshotPoint
    from cdc.log.envelope import SOURCE_ARROW, arrow_positions

    first = {"snapshot": "true", **SnapshotPoint(3000, 1, "s").source_position()}
    resumed = {"snapshot": "true", **SnapshotPoint(3000, 1, "s", order=1).source_position()}
    assert event_position("r", first) == (3000, 0)
    assert event_position("r", resumed) == (3000, 1)
    # the Arrow decoder reads both alike
    source = pa.array([{"ts_ms": 1, **b} for b in (first, resumed)], SOURCE_ARROW)
    found = arrow_positions(pa.array(["r", "r"]), source)
    assert found is not None
    assert list(zip(*(p.to_pylist() for p in found), strict=True)) == [(3000, 0), (3000, 1)]
    # every change streamed after the point comes later, even one whose LSN is lower
    assert event_position("c", {"lsn": 2990, "sequence": '["3000","2990"]'}) > (3000, 1)


positions = st.tuples(st.integers(0, 3), st.integers(-1, 3))


@given(held=st.none() | positions, change=positions)
def test_the_sql_the_warehouse_runs_is_the_rule(
    held: tuple[int, int] | None, change: tuple[int, int]
) -> None:
    """older_sql (the MERGE's and the TRUNCATE's condition) says what is_newer says, for
    any held position (None: a row with none) and change, evaluated by a SQL engine."""
    import sqlite3

    columns = [f"t_{name}" for name in ORDER]
    literals = [str(v) for v in change]
    with sqlite3.connect(":memory:") as db:
        db.execute(f"CREATE TABLE t ({', '.join(columns)})")
        db.execute("INSERT INTO t VALUES (?, ?)", held or (None, None))
        (older,) = db.execute(f"SELECT {older_sql(columns, literals)} FROM t").fetchone()
    assert bool(older) == is_newer(change, None if held is None else Stored(held, None))
