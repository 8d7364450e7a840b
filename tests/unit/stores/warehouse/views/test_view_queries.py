"""Which streaming views share a query (cdc/stores/warehouse/views/queries.py), and the
checkpoints of queries the views no longer run in (progress.forget_other_view_queries)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.cli.demo import with_demo_views
from cdc.core.settings import Settings
from cdc.core.settings.apply import ApplySettings
from cdc.core.settings.views import SlidingWindow, TumblingWindow
from cdc.log.checkpoints import checkpoint
from cdc.log.progress import forget_other_view_queries
from cdc.stores.warehouse.views.registry import queries_of, views_of


def test_the_demos_five_streaming_views_run_in_two_queries(clean_env: None) -> None:
    queries = queries_of(views_of(with_demo_views(Settings())))
    members = [[v.name for v in q.members] for q in queries]
    # the windows written as they fill (update mode, the default watermark), and the
    # three written once the watermark has passed (append mode, 10 seconds)
    assert members == [
        ["time_to_ship", "orders_last_minute", "customer_sessions"],
        ["orders_per_minute", "revenue_5_minutes"],
    ]
    assert [q.label for q in queries] == [
        "views-time_to_ship+orders_last_minute+customer_sessions",
        "views-orders_per_minute+revenue_5_minutes",
    ]
    # each view names its query's checkpoint, which `cdc verify` and the demo read
    for query in queries:
        assert {v.checkpoint_label for v in query.members} == {query.label}


def test_views_of_another_table_watermark_or_mode_keep_a_query_of_their_own(
    clean_env: None,
) -> None:
    windows = [
        TumblingWindow(name="a", table="public.orders", watermark="10 seconds"),
        TumblingWindow(name="b", table="public.orders", watermark="10 seconds"),
        TumblingWindow(name="c", table="public.orders", watermark="20 seconds"),
        TumblingWindow(name="d", table="public.items", watermark="10 seconds"),
        SlidingWindow(name="e", table="public.orders", kind="sliding", watermark="10 seconds"),
    ]
    settings = Settings().model_copy(update={"apply": ApplySettings(windows=windows)})
    queries = queries_of(views_of(settings))
    assert [[v.name for v in q.members] for q in queries] == [["a", "b"], ["c"], ["d"], ["e"]]
    # a view alone keeps the checkpoint it had before views shared queries
    assert [q.label for q in queries[1:]] == ["window-c", "window-d", "window-e"]
    # "10 seconds" and "10 second" are one watermark
    windows[1] = windows[1].model_copy(update={"watermark": "10 second"})
    settings = Settings().model_copy(update={"apply": ApplySettings(windows=windows)})
    assert [v.name for v in queries_of(views_of(settings))[0].members] == ["a", "b"]
    # apply.views_share_queries = false: a query per view, each with its own checkpoint
    alone = ApplySettings(windows=windows, views_share_queries=False)
    queries = queries_of(views_of(Settings().model_copy(update={"apply": alone})))
    assert [q.label for q in queries] == [f"window-{n}" for n in "abcde"]


@pytest.mark.usefixtures("clean_env")
def test_the_checkpoints_of_queries_the_views_left_are_removed(tmp_path: Path) -> None:
    settings = Settings().model_copy(update={"data_dir": tmp_path})
    kept = {"views-a+b", "window-c"}
    for name in ("views-a+b", "window-c", "window-a", "views-a+b+d", "warehouse", "cache"):
        (Path(checkpoint(settings, name).path) / "commits").mkdir(parents=True)
        (Path(checkpoint(settings, name).path) / "metadata").write_text('{"id": "q"}')
        Path(checkpoint(settings, name).path).with_name(f"{name}.definition").write_text("d")
    late = Path(checkpoint(settings, "window-a.progress.json").path)
    late.write_text("{}")
    forget_other_view_queries(settings, kept)
    left = sorted(p.name for p in Path(checkpoint(settings, "x").path).parent.iterdir())
    assert left == [
        "cache",
        "cache.definition",
        "views-a+b",
        "views-a+b.definition",
        "warehouse",
        "warehouse.definition",
        "window-a.progress.json",  # late notes: reset when a query starts afresh
        "window-c",
        "window-c.definition",
    ]
