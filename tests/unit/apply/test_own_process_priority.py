"""The warehouse's own process yields the cores to the other stores' process, also where
Linux shares the cores between sessions first (autogroups): its nice is its session's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(
    not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroups"
)
def test_a_process_in_a_session_of_its_own_lowers_its_sessions_priority() -> None:
    # as own_process.py starts it: a session of its own
    code = (
        "import os; from cdc.apply.own_process_main import lower_priority; "
        "lower_priority(19); "
        "print(os.getpriority(os.PRIO_PROCESS, 0), open('/proc/self/autogroup').read())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.split()
    assert out[0] == "19"
    assert out[-2:] == ["nice", "19"], out  # the session's share, not only within it


def test_without_autogroups_the_nice_alone_is_set(tmp_path: Path) -> None:
    missing = tmp_path / "autogroup"  # a kernel without them: nothing to write, no error
    code = (
        "import os, sys; from pathlib import Path; "
        "from cdc.apply.own_process_main import lower_priority; "
        "lower_priority(5, Path(sys.argv[1])); print(os.getpriority(os.PRIO_PROCESS, 0))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(missing)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.split()
    assert out == ["5"] and not missing.exists()
