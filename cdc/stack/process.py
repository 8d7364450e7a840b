"""Background processes of the local stack: start detached, find again, stop.

A process is recorded by a pid file that holds its pid and its start time (in clock
ticks since boot, from /proc/PID/stat): a pid that the kernel has reused for another
process has another start time, so it is never mistaken for ours. The pid files live
in `<data_dir>/run` (the invoking user's, 0700), and one another user wrote is not
believed: the start time of any process is world-readable, so a forged pid file
would otherwise make `cdc down` signal any process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdc.core.files import append_log, chown_tree, read_own, write_file

__all__ = [
    "ServiceUser",
    "alive",
    "port_free",
    "port_open",
    "read_pid",
    "spawn",
    "stop_pid",
    "wait_for",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceUser:
    """The unprivileged account a root-run `cdc` starts PostgreSQL and OpenSearch as."""

    name: str
    uid: int
    gid: int

    @classmethod
    def lookup(cls, name: str) -> ServiceUser | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return cls(name, entry.pw_uid, entry.pw_gid)

    def own(self, path: Path) -> None:
        """Give a directory tree to this user (no link followed: cdc.core.files)."""
        chown_tree(path, self.uid, self.gid)


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (we could bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    """True when pid runs and is not a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in pid_file if that very process still runs (and the file is
    this user's own: cdc.core.files.read_own)."""
    try:
        pid_text, started = (read_own(pid_file) or "").split()
        pid = int(pid_text)
    except ValueError:
        return None
    if alive(pid) and _start_time(pid) == started:
        return pid
    return None


def inherited_env() -> dict[str, str]:
    """This process's environment without cdc's own settings (`CDC_*`: passwords among
    them), for the components it starts: they are configured by their own files."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    pid_file: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    user: ServiceUser | None = None,
) -> int:
    """Start argv detached (its own session), output appended to log_file."""
    log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pid_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # a log may quote a failed statement or a config: its owner alone reads it
    with os.fdopen(append_log(log_file), "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**inherited_env(), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            user=user.uid if user else None,
            group=user.gid if user else None,
            extra_groups=[] if user else None,
        )
    write_file(pid_file, f"{proc.pid} {_start_time(proc.pid)}\n")
    log.debug("started %s as pid %d", argv[0], proc.pid)
    return proc.pid


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Signal pid's process group, wait for it to end, SIGKILL after timeout.

    Returns True if it ended by itself, False if it had to be killed.
    """

    def send(s: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, s)

    send(sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    log.warning("pid %d did not stop within %.0fs; killing it", pid, timeout)
    send(signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)
    return False


def wait_for(
    check: Callable[[], bool],
    *,
    timeout: float,
    still_running: Callable[[], bool],
    interval: float = 0.25,
) -> str | None:
    """Poll check() until it is true. Returns None, or why it never became true."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return None
        except Exception as exc:  # a readiness probe may fail in any way while starting
            log.debug("not ready yet: %s", exc)
        if not still_running():
            return "exited"
        if time.monotonic() >= deadline:
            return f"not ready after {timeout:.0f}s"
        time.sleep(interval)
