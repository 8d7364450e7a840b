"""Which change of a referenced row enriches an event (materializers/views/enrichment.py,
the log-side reference `cdc verify` compares the stream-table join with)."""

from __future__ import annotations

from materializers.views.enrichment import Version, enrich

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
