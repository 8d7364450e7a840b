"""Property: however a per-key ordered log is cut into batches and replayed, the stores end
in the state of applying each key's last event once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from materializers.position import Change, Stored, apply_changes, is_newer, last_per_key


@st.composite
def logs_and_deliveries(draw):  # type: ignore[no-untyped-def]
    keys = draw(st.lists(st.integers(0, 8), min_size=1, max_size=60))
    partitions = 3
    offsets = [0] * partitions
    log = []
    for key in keys:
        partition = key % partitions  # a key always lands in the same partition
        row = None if draw(st.booleans()) and draw(st.booleans()) else {"v": draw(st.integers())}
        log.append(Change(key, partition, offsets[partition], row))
        offsets[partition] += 1
    # cut into batches at arbitrary points...
    cuts = sorted(draw(st.sets(st.integers(1, max(len(log) - 1, 1)), max_size=10)))
    batches = [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True) if log[a:b]]
    # ...and deliver them in order, with arbitrary replays of earlier batches in between
    # and at the end (restarts from old checkpoints, retried batches), each batch in any
    # order inside
    deliveries = []

    def replays(upto: int) -> None:
        for _ in range(draw(st.integers(0, 2))):
            start = draw(st.integers(0, upto))
            end = draw(st.integers(start, upto))
            deliveries.extend(draw(st.permutations(b)) for b in batches[start:end])

    for i, batch in enumerate(batches):
        replays(i)
        deliveries.append(draw(st.permutations(batch)))
    replays(len(batches))
    return log, deliveries


@settings(max_examples=300, deadline=None)
@given(logs_and_deliveries())
def test_any_batching_with_any_replays_converges(case) -> None:  # type: ignore[no-untyped-def]
    log, deliveries = case
    state: dict = {}
    for batch in deliveries:
        apply_changes(state, batch)
    expected = {c.key: Stored(c.offset, c.row) for c in log}  # each key's last event, once
    assert state == expected
    # rows visible to readers: deleted markers hide their key
    visible = {k: s.row for k, s in state.items() if s.row is not None}
    assert visible == {k: c.row for k, c in last_per_key(log).items() if c.row is not None}


def test_an_older_write_is_refused_and_an_equal_one_is_a_no_op() -> None:
    assert is_newer(5, None)
    assert is_newer(5, Stored(4, {"v": 1}))
    assert not is_newer(5, Stored(5, {"v": 1}))
    assert not is_newer(3, Stored(5, None))  # a deleted marker refuses a stale write
