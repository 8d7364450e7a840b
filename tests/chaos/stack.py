"""A stack of the harness's own, started and stopped with the real `cdc` commands.

It runs on free ports in a temporary directory exactly like the integration tests'
session stack (tests/conftest.py), so that killing its components disturbs no other
test. The apply job is `cdc apply` in a process group of its own; `cdc down --purge`
ends everything, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cdc.core.settings import Settings
from tests.conftest import settings_for, stack_env
from tests.helpers import ROOT, run_cdc

__all__ = ["ChaosError", "ChaosStack"]


class ChaosError(Exception):
    """The harness could not go on (a component that does not come back, a failed command)."""


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class ChaosStack:
    """The stack, its CDC_* environment and the apply job."""

    def __init__(
        self, tables: list[str], prefix: str = "chaos", identity: dict[str, str] | None = None
    ) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="cdc-chaos-"))
        # PostgreSQL and OpenSearch run as the service user when tests run as root
        self.data_dir.chmod(0o755)
        self.env = {
            **stack_env(self.data_dir),
            "CDC_PIPELINE__NAME": prefix,
            "CDC_PIPELINE__TOPIC_PREFIX": prefix,
            "CDC_PIPELINE__TABLES": json.dumps(tables),
            "CDC_PIPELINE__REPLICA_IDENTITY": json.dumps(identity or {}),
        }
        self.settings: Settings = settings_for(self.env)
        self.prefix = prefix
        self.apply: subprocess.Popen[bytes] | None = None
        self.apply_log = self.data_dir / "apply.log"
        self.apply_starts = 0
        self.stopped: set[int] = set()  # pids frozen with SIGSTOP, thawed by down()

    # --- the cdc command ------------------------------------------------------------

    def cdc(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run_cdc(*args, env=self.env, timeout=timeout)

    def start_cdc(self, *args: str) -> subprocess.Popen[str]:
        """`cdc ARGS` started in the background (its output together, as text)."""
        return subprocess.Popen(
            [sys.executable, "-m", "cdc", *args],
            env={**{k: v for k, v in os.environ.items() if not k.startswith("CDC_")}, **self.env},
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def up(self, attempts: int = 3) -> None:
        """`cdc up`, as a user would run it again when it fails (a port still held...)."""
        for attempt in range(attempts):
            result = self.cdc("up")
            if result.returncode == 0:
                return
            if attempt == attempts - 1:
                raise ChaosError(f"`cdc up` failed: {result.stderr.strip()[-800:]}")
            time.sleep(5)

    def status(self) -> dict[str, Any]:
        result = self.cdc("status", "-o", "json", timeout=120)
        try:
            document: dict[str, Any] = json.loads(result.stdout)
        except json.JSONDecodeError:
            return {}
        return document

    def down(self) -> None:
        self.stop_apply()
        for pid in list(self.stopped):
            self.thaw(pid)
        try:
            self.cdc("down", "--purge", "--yes", timeout=300)
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # --- components -----------------------------------------------------------------

    def pid(self, component: str) -> int | None:
        """The pid `cdc` recorded for a component, if that process runs."""
        try:
            pid = int((self.data_dir / "run" / f"{component}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def signal_group(self, pid: int, sig: signal.Signals) -> None:
        """Signal the component's process group (`cdc` starts each in a session of its own)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def freeze(self, pid: int) -> None:
        self.stopped.add(pid)
        self.signal_group(pid, signal.SIGSTOP)

    def thaw(self, pid: int) -> None:
        self.signal_group(pid, signal.SIGCONT)
        self.stopped.discard(pid)

    def wait_gone(self, pids: list[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in pids):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    # --- the apply job --------------------------------------------------------------

    def start_apply(self) -> None:
        self.apply_starts += 1
        with self.apply_log.open("a") as out:
            out.write(f"\n--- chaos: apply start {self.apply_starts} ---\n")
            out.flush()
            self.apply = subprocess.Popen(
                [sys.executable, "-m", "cdc", "apply"],
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("CDC_")},
                    **self.env,
                },
                cwd=ROOT,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def apply_exit(self) -> int | None:
        """None while the apply job runs, else its exit code."""
        return None if self.apply is None else self.apply.poll()

    def kill_apply(self) -> None:
        if self.apply is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.apply.pid, signal.SIGKILL)
        self.apply.wait()

    def stop_apply(self) -> None:
        """Ctrl-C, as a user would; SIGKILL if it does not end in a minute."""
        if self.apply is None:
            return
        if self.apply.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.apply.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.apply.wait(timeout=60)
        self.kill_apply()  # its Spark JVM and Python workers too
        self.apply = None

    def apply_errors(self, most: int = 4) -> list[str]:
        """The error lines the apply job logged since it was last started."""
        try:
            text = self.apply_log.read_text(errors="replace")
        except OSError:
            return []
        run = text.rsplit("--- chaos: apply start", 1)[-1]
        found: list[str] = []
        for line in run.splitlines():
            line = line.strip()
            if line.startswith(("at ", "File ", "WARNING")) or " WARN " in line:
                continue
            if ("Error" in line or "Exception" in line or "error:" in line) and line not in found:
                found.append(line[:300])
        return found[-most:]

    def restart_apply_if_ended(self) -> str | None:
        """Start the apply job again if it ended by itself; say how it ended."""
        code = self.apply_exit()
        if code is None:
            return None
        errors = self.apply_errors()
        self.start_apply()
        return f"the apply job ended by itself (exit {code}), started again; it said: " + (
            " | ".join(errors) or "nothing"
        )

    def keep_logs(self, dest: Path) -> Path:
        """Copy the apply job's and the components' logs out before the purge."""
        dest.mkdir(parents=True, exist_ok=True)
        for log in [self.apply_log, *self.data_dir.glob("*/*.log")]:
            with contextlib.suppress(OSError):
                shutil.copy(log, dest / log.name)
        return dest
