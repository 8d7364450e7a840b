"""What a test that loses a service under load checks at the end (a Kafka broker, a
Connect worker): the log holds every version of each key, the newest last (a change sent
again after the loss is there twice), and after an apply every store equals the source,
read with the tests' own readers, with one history version per change."""

from __future__ import annotations

from cdc.apply.job import run_apply
from cdc.core.settings import Settings
from tests.contents import expected_cache, expected_search, source_tuples
from tests.logcheck import events_by_key, table_info, wait_until_equal
from tests.stores import (
    cache_contents,
    history_rows,
    open_and_live,
    search_contents,
    warehouse_rows,
)


def assert_nothing_lost_or_doubled(settings: Settings, qualified: str) -> None:
    """`qualified`: a table of columns id, version (one more at each update), note."""
    table = table_info(settings, qualified)
    _, records = wait_until_equal(settings, table, timeout=300)
    for key, events in events_by_key(records).items():
        versions = [e.value["after"]["version"] for e in events if e.op in ("r", "c", "u")]
        assert sorted(set(versions)) == list(range(versions[0], max(versions) + 1)), key
        assert versions[-1] == max(versions), key
    changes = {
        (r.key_bytes, r.value["source"].get("sequence"), r.value["source"]["lsn"])
        for r in records
        if r.value is not None
    }

    run_apply(settings, ["cache", "search", "warehouse"], once=True)
    assert cache_contents(settings, qualified) == expected_cache(settings, qualified)
    assert search_contents(settings, qualified) == expected_search(settings, qualified)
    columns = ["version", "note"]
    assert warehouse_rows(settings, qualified, columns) == source_tuples(
        settings, qualified, columns
    )
    # one version per change in the history: none lost, none doubled
    assert history_rows(settings, qualified).count() == len(changes)
    opened, live = open_and_live(settings, qualified, ["id", "version", "note"])
    assert opened == live
