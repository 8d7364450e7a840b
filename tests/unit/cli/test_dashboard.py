"""The demo's dashboard (pure rendering, no services)."""

from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from cdc.cli.demo import _view
from cdc.cli.workload import Workload


def render(
    stores: dict[str, dict[str, object]],
    applying: list[str],
    capture: dict[str, object] | None = None,
) -> str:
    status = SimpleNamespace(
        topics={"cdc.public.orders": 12}, stores=stores, dead_letters=0, capture=capture
    )
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


def test_the_capture_s_lag_is_shown_beside_the_stores_and_a_stall_stands_out() -> None:
    capture = {"lag_s": 0.4, "stalled": False}
    lines = [line for line in render({}, ["cache"], capture).splitlines() if "capture" in line]
    assert len(lines) == 1 and "0.4" in lines[0] and "stalled" not in lines[0]
    stalled = render({}, ["cache"], {"lag_s": 42.0, "stalled": True})
    assert "42.0 (stalled)" in stalled


def test_a_component_error_that_looks_like_markup_is_shown_as_it_is() -> None:
    from rich.console import Console

    from cdc.cli.render import status_table
    from cdc.stack.components import ComponentStatus

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
    from cdc.check.status import PipelineStatus
    from cdc.cli.render import pipeline_table

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


def test_a_store_whose_first_batch_runs_shows_its_lag_from_the_snapshot(tmp_path: Path) -> None:
    """Before a store's first batch ends, status and the dashboard list it with the log's
    events as its backlog and its lag counted from the snapshot (it lacks the snapshot's
    rows): a figure from the start, not "first batch running" for minutes."""
    import json
    import time

    from cdc.capture.generation import generation_file
    from cdc.check.status import _store_progress
    from cdc.core.settings import Settings
    from cdc.log.progress import Progress, write_progress

    settings = Settings(data_dir=tmp_path)  # type: ignore[call-arg]
    ends = {"cdc.public.orders": {0: 12}}
    assert _store_progress(settings, {"cdc.public.orders": {0: 0}}) == {}  # nothing to apply
    snapshot_ms = int(time.time() * 1000) - 40_000
    path = generation_file(settings)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"lsn": 5, "ts_ms": snapshot_ms, "ends": {}}))
    write_progress(settings, "cache", Progress(applied={"cdc.public.orders:0": 11}))

    stores = _store_progress(settings, ends)
    assert stores["cache"]["backlog_events"] == 0 and not stores["cache"]["nothing_applied"]
    warehouse = stores["warehouse"]
    assert warehouse["nothing_applied"] and warehouse["backlog_events"] == 12
    assert 40 <= warehouse["lag_s"] < 100

    text = render(stores, ["warehouse", "cache"])
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert "first batch running" in lines["warehouse"] and "12" in lines["warehouse"]
    assert f"{warehouse['lag_s']:.1f}" in lines["warehouse"]

    from cdc.check.status import PipelineStatus
    from cdc.cli.render import pipeline_table

    console = Console(record=True, width=200)
    console.print(pipeline_table(PipelineStatus("cdc", "done", None, None, None, stores=stores)))
    line = next(x for x in console.export_text().splitlines() if "store warehouse" in x)
    assert "no batch finished yet (backlog 12 events; lag" in line and "caught up" not in line


def test_status_names_a_table_delta_rs_cannot_write() -> None:
    from cdc.check.status import PipelineStatus
    from cdc.cli.render import pipeline_table

    slow = {"/w/cdc/public/odd/current": "column-mapped"}
    figures = {"backlog_events": 0, "lag_s": 0.0, "waiting": None, "written_by_spark": slow}
    status = PipelineStatus("cdc", "done", None, None, None, stores={"warehouse": figures})
    console = Console(record=True, width=300)
    console.print(pipeline_table(status))
    line = next(x for x in console.export_text().splitlines() if "store warehouse" in x)
    assert "1 table(s) written by Spark, not delta-rs (slower)" in line
    assert "/w/cdc/public/odd/current (column-mapped)" in line
