"""The demo's dashboard (pure rendering, no services)."""

from types import SimpleNamespace

from rich.console import Console

from commands.demo import _view
from commands.workload import Workload


def render(stores: dict[str, dict[str, object]], applying: list[str]) -> str:
    status = SimpleNamespace(topics={"cdc.public.orders": 12}, stores=stores, dead_letters=0)
    view = _view(
        {"cdc.public.orders": "public.orders"},
        {"cdc.public.orders": 3.0},
        status,
        Workload("postgresql://unused", rate=5),
        elapsed=12,
        duration=30,
        applying=applying,
    )
    console = Console(record=True, width=120)
    console.print(view)
    return console.export_text()


def test_a_store_without_a_finished_batch_is_shown_as_running() -> None:
    text = render({"cache": {"backlog_events": 4, "lag_s": 1.25}}, ["warehouse", "cache"])
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert "first batch running" in lines["warehouse"]
    assert "1.2" in lines["cache"] and "4" in lines["cache"]
    assert "public.orders" in text and "18s left" in text


def test_a_component_error_that_looks_like_markup_is_shown_as_it_is() -> None:
    from rich.console import Console

    from cdc.components import ComponentStatus
    from commands.render import status_table

    status = ComponentStatus(
        name="connect",
        managed=True,
        up=False,
        address="x",
        version=None,
        details={},
        error="bad [/x] token [bold]",
    )
    console = Console(record=True, width=200)
    console.print(status_table([status]))
    assert "bad [/x] token [bold]" in console.export_text()


def test_status_shows_a_store_without_backlog_as_caught_up() -> None:
    from commands.pipeline import PipelineStatus
    from commands.render import pipeline_table

    figures = {"backlog_events": 0, "lag_s": 0.0, "last_latency_s": 0.8, "waiting": None}
    behind = {"backlog_events": 7, "lag_s": 12.5, "last_latency_s": 0.8, "waiting": None}
    status = PipelineStatus(
        name="cdc",
        snapshot="done",
        snapshot_lsn=None,
        slot=None,
        connector=None,
        stores={"cache": figures, "search": behind},
    )
    console = Console(record=True, width=200)
    console.print(pipeline_table(status))
    lines = {
        line.split("│")[1].strip(): line
        for line in console.export_text().splitlines()
        if "│" in line
    }
    assert "caught up" in lines["store cache"] and "0.8s after commit" in lines["store cache"]
    assert "backlog 7 events; lag 12.5s" in lines["store search"]
    assert "caught up" not in lines["store search"]
