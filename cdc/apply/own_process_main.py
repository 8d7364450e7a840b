"""The child process of cdc/apply/own_process.py: one store's apply job.

Reads from standard input 8 bytes of length, then the pickled (Settings, store name,
nice); lowers its CPU priority by that nice (its Spark JVM inherits it; see
`lower_priority`), runs the store's queries until standard input closes or SIGTERM
comes, and exits with the exit code of the error that stopped it (its one line on
standard error). Killed with its parent (Linux's parent-death signal); its Spark JVM
exits when it does."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from pathlib import Path

from cdc.apply.job import run_apply
from cdc.core.errors import CdcError
from cdc.core.settings import Settings


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (as a kill of the parent's
    process group would have): a `cdc apply` killed mid-batch leaves no warehouse
    writing beside the one its restart starts. Elsewhere, the closed pipe stops it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def lower_priority(nice: int, autogroup: Path = Path("/proc/self/autogroup")) -> None:
    """Lower this process's CPU priority by `nice`, against every other process.

    Where Linux groups processes by session (autogroups, on by default:
    /proc/sys/kernel/sched_autogroup_enabled), a process's nice weighs only against its
    own session's processes, and each session gets an equal share of the cores. This
    process is a session of its own (own_process.py), so its nice alone would weigh
    against nothing: its session's own nice (the autogroup's) is lowered as well."""
    os.nice(nice)
    if nice <= 0:
        return
    try:
        current = int(autogroup.read_text().split("nice")[1])
        autogroup.write_text(f"{max(current, min(nice, 19))}\n")
    except (OSError, IndexError, ValueError):  # no autogroups here: the nice is enough
        pass


def main() -> int:
    _die_with_parent()
    stdin = sys.stdin.buffer
    size = int.from_bytes(stdin.read(8), "big")
    given = pickle.loads(stdin.read(size))
    settings, name, nice = given if isinstance(given, tuple) else (None, "", 0)
    if not isinstance(settings, Settings):
        print("cdc apply: the store's own process got no settings", file=sys.stderr)
        return 2
    lower_priority(nice)
    stop = threading.Event()

    def watch_parent() -> None:
        stdin.read()  # returns when the parent closes the pipe, or dies
        stop.set()

    threading.Thread(target=watch_parent, name="parent", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        run_apply(settings, [name], stop=stop)
    except CdcError as exc:
        print(f"cdc apply: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
