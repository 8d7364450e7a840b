"""`cdc status` names the worker of the Connect group that runs each task of the
connector (Connect's `tasks[].worker_id`), in JSON and in text."""

from __future__ import annotations

from cdc.check.status import task_workers
from cdc.cli.render import _tasks_line


def test_each_task_is_paired_with_its_worker() -> None:
    status = {
        "connector": {"state": "RUNNING", "worker_id": "10.0.0.7:8083"},
        "tasks": [
            {"id": 0, "state": "RUNNING", "worker_id": "10.0.0.8:8083"},
            {"id": 1, "state": "UNASSIGNED", "worker_id": ""},
        ],
    }
    assert task_workers(status) == ["10.0.0.8:8083", None]
    assert task_workers({"connector": {"state": "RUNNING"}}) == []


def test_the_text_says_where_each_task_runs() -> None:
    connector = {
        "state": "RUNNING",
        "tasks": ["RUNNING", "UNASSIGNED"],
        "workers": ["10.0.0.8:8083", None],
    }
    assert _tasks_line(connector) == "RUNNING on 10.0.0.8:8083, UNASSIGNED"
    assert _tasks_line({"state": "RUNNING", "tasks": []}) == "none"
    assert _tasks_line({"state": "RUNNING", "tasks": ["RUNNING"]}) == "RUNNING"  # older JSON
