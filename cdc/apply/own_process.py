"""A store's apply in a process of its own, at a lower CPU priority (a store that
declares the "own_process" ability: the warehouse).

On a small machine the warehouse's Spark jobs (MERGEs, window and join queries) take the
cores the cache's and the search index's micro-batches need to stay seconds behind the
source (contract point 9). In a process of its own, with a Spark JVM of its own, at
`apply.own_process_nice` (the OS gives the fast stores' process the cores first), such a
store uses what they leave; a store that is slow, down or failing holds no other store
back.

The parent hands the child its settings (pickled, on the child's standard input: they
hold secrets, so never on a command line or in the environment) and keeps that pipe
open: the child stops when it closes, whether the parent stopped it or died. The child
is in a session of its own (a terminal's Ctrl-C reaches the parent, which stops it) and
its output comes through the parent's standard error, line by line.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from typing import IO

from cdc.core.settings import PROJECT_ROOT, Settings

__all__ = ["StoreProcess"]


class StoreProcess:
    """`python -m cdc.apply.own_process_main`: `cdc apply --store <name>`, started,
    watched and stopped by the apply job of the other stores, at CPU priority `nice`."""

    def __init__(self, settings: Settings, name: str, nice: int) -> None:
        self.settings = settings
        self.name = name
        self.nice = nice
        self._process: subprocess.Popen[bytes] | None = None
        self.last_said = ""  # the last line it said as `cdc apply: ...`: why it stopped

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        self.stop(timeout=5)  # the one that exited, if any
        env = dict(os.environ)
        # the child imports this checkout's modules, as this process does
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "cdc.apply.own_process_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=PROJECT_ROOT,
        )
        assert process.stdin is not None and process.stdout is not None
        payload = pickle.dumps((self.settings, self.name, self.nice))
        process.stdin.write(len(payload).to_bytes(8, "big") + payload)
        process.stdin.flush()
        self._process = process
        threading.Thread(
            target=self._forward, args=(process.stdout,), name=f"{self.name}-output", daemon=True
        ).start()

    def _forward(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("cdc apply: "):
                self.last_said = line.removeprefix("cdc apply: ")
            print(line, file=sys.stderr, flush=True)

    def exit_code(self) -> int | None:
        """None while it runs (or before it started), else its exit code."""
        return None if self._process is None else self._process.poll()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop it: its queries stop (an unfinished batch is not committed), then it
        exits; killed after `timeout` seconds."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            assert process.stdin is not None
            process.stdin.close()  # the child's signal to stop
        except OSError:
            pass
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
