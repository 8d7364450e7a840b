"""`cdc status` says a store waits only while the apply process that noted the wait runs:
a job killed while its store was down left the note behind, and status said the store
had been waiting for the half hour since (no process applied it)."""

from __future__ import annotations

import os
import subprocess
import sys

from cdc.check.status import still_waiting


def test_a_wait_noted_by_a_running_process_is_said() -> None:
    waiting = {"reason": "Redis does not answer", "since_ms": 1, "pid": os.getpid()}
    assert still_waiting(waiting) == waiting


def test_a_wait_left_by_a_process_that_stopped_is_not() -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(ended.stdout)
    assert still_waiting({"reason": "Redis does not answer", "since_ms": 1, "pid": pid}) is None


def test_a_note_without_a_process_or_no_note_is_no_wait() -> None:
    assert still_waiting({"reason": "Redis does not answer", "since_ms": 1}) is None
    assert still_waiting(None) is None
