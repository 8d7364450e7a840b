"""The warehouse's own process dies with the apply job that started it, even when that
job is killed outright (no warehouse keeps writing beside the job's restart)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.helpers import ROOT, ended

# a parent that starts a child as StoreProcess does (a session of its own), the child
# asking for its parent's death as own_process_main does, then ignoring everything else
PARENT = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, time\\n"
     "from cdc.apply.own_process_main import _die_with_parent\\n"
     "_die_with_parent()\\n"
     "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
     "print('ready', flush=True)\\n"
     "time.sleep(120)\\n"],
    start_new_session=True, stdout=subprocess.PIPE, cwd=sys.argv[1],
)
assert child.stdout.readline().strip() == b"ready"
print(child.pid, flush=True)
time.sleep(120)
"""


def test_the_warehouse_process_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(ROOT)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not ended(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while not ended(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()


def test_a_store_runs_apart_in_the_local_profile_only() -> None:
    """On a standalone master a second application gets no cores while the first holds
    every worker's: in the cluster profile the warehouse runs in the one application."""
    from cdc.apply.job import own_processes
    from cdc.core.settings import load_settings

    stores = ["cache", "search", "warehouse"]
    local = load_settings(spark={"master": "local[2]"}, apply={"profile": "auto"})
    assert own_processes(local, stores, once=False) == ["warehouse"]
    assert own_processes(local, stores, once=True) == []
    cluster = load_settings(spark={"master": "spark://spark-master:7077"})
    assert own_processes(cluster, stores, once=False) == []
