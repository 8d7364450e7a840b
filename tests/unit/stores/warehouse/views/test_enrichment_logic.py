"""Which change of a referenced row enriches an event (cdc/stores/warehouse/views/enrichment.py,
the log-side reference `cdc verify` compares the stream-table join with)."""

from __future__ import annotations

import random

import pyarrow as pa

from cdc.stores.warehouse.views.enrichment import Version, enrich, latest_at_or_before

SNAPSHOT = Version((100, 0), "r", {"id": 1, "price": 10}, 1_000)
RAISED = Version((200, 5), "u", {"id": 1, "price": 15}, 2_000)
DELETED = Version((300, 5), "d", None, 3_000)


def test_the_latest_change_at_or_before_the_event_gives_its_values() -> None:
    versions = [SNAPSHOT, RAISED, DELETED]
    assert enrich(versions, [], (150, 1), 1_500) is SNAPSHOT
    assert enrich(versions, [], (200, 5), 2_000) is RAISED  # its own transaction's change
    assert enrich(versions, [], (200, 7), 2_000) is RAISED
    assert enrich(versions, [], (200, 4), 2_000) is SNAPSHOT  # the statement before it


def test_no_change_before_the_event_or_a_delete_gives_nothing() -> None:
    assert enrich([RAISED], [], (150, 1), 1_500) is None
    assert enrich([], [], (150, 1), 1_500) is None
    assert enrich([SNAPSHOT, RAISED, DELETED], [], (400, 1), 4_000) is None


def test_a_truncate_between_the_change_and_the_event_ends_it() -> None:
    truncate = ((250, 1), 2_500)
    assert enrich([SNAPSHOT, RAISED], [truncate], (260, 1), 2_600) is None
    # a TRUNCATE after the event leaves it its values
    assert enrich([SNAPSHOT, RAISED], [((270, 1), 2_700)], (260, 1), 2_600) is RAISED
    # one before the change it followed does not end that change
    assert enrich([SNAPSHOT, RAISED], [((150, 1), 1_500)], (260, 1), 2_600) is RAISED


def test_the_arrow_lookup_picks_what_a_reading_one_by_one_picks() -> None:
    """latest_at_or_before (the driver's path) against a plain reading of the same
    versions, over random keys and positions, ties and keys without a version."""
    rng = random.Random(7)
    for _ in range(300):
        versions = [
            (rng.choice([1, 2, 3, None]), rng.randrange(5), rng.randrange(3))
            for _ in range(rng.randrange(12))
        ]
        versions = [v for v in versions if v[0] is not None]
        events = [
            (rng.choice([1, 2, 3, 4, None]), rng.randrange(6), rng.randrange(3))
            for _ in range(rng.randrange(1, 10))
        ]
        chosen = latest_at_or_before(
            *[pa.array([v[i] for v in versions], pa.int64()) for i in range(3)],
            *[pa.array([e[i] for e in events], pa.int64()) for i in range(3)],
        ).to_pylist()
        for event, index in zip(events, chosen, strict=True):
            before = [
                (v[1], v[2], i)
                for i, v in enumerate(versions)
                if v[0] == event[0] and event[0] is not None and v[1:] <= event[1:]
            ]
            if not before:
                assert index is None, (versions, event)
            else:  # the greatest position (a position is one version of a key)
                best = max(before)[:2]
                assert index is not None and versions[index][1:] == best, (versions, event)
