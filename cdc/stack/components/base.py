"""What every component of the stack is: something that can be started, asked and stopped."""

from __future__ import annotations

import logging
import os
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.core.errors import INSTALL_HINT, ComponentError, NotInstalledError, PortInUseError
from cdc.core.settings import Settings
from cdc.core.state_folders import make_state_dir
from cdc.stack.process import ServiceUser, port_free, read_pid, spawn, stop_pid, wait_for

__all__ = ["Component", "ComponentStatus"]

log = logging.getLogger(__name__)


@dataclass
class ComponentStatus:
    """What `cdc status` shows of one component."""

    name: str
    up: bool
    address: str
    managed: bool
    version: str | None = None
    pid: int | None = None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Component(ABC):
    """One part of the local stack, with its state directory and log file.

    Subclasses say how to prepare their state, what to run, how to ask
    whether they are ready, and what to report.
    """

    name: str
    start_timeout = 120.0
    stop_timeout = 30.0
    stop_signal = signal.SIGTERM
    needs_service_user = False  # PostgreSQL and OpenSearch refuse to run as root

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    # --- what subclasses provide -------------------------------------------------

    @property
    @abstractmethod
    def section(self) -> Any:
        """This component's settings section."""

    @property
    @abstractmethod
    def address(self) -> str:
        """Where clients reach it, for people."""

    @abstractmethod
    def ports(self) -> list[int]:
        """Every port it listens on."""

    @abstractmethod
    def check_installed(self) -> None:
        """Raise NotInstalledError naming what is missing."""

    @abstractmethod
    def prepare(self) -> None:
        """Create or refresh the state directory (idempotent)."""

    @abstractmethod
    def command(self) -> tuple[list[str], dict[str, str]]:
        """The argv and extra environment that run it in the foreground."""

    @abstractmethod
    def ready(self) -> bool:
        """Ask the component itself whether it serves requests."""

    @abstractmethod
    def version(self) -> str | None:
        """Its version, asked of it (None if it does not say)."""

    def details(self) -> dict[str, Any]:
        """Extra facts for `cdc status`."""
        return {}

    def after_start(self) -> None:  # noqa: B027 - optional hook
        """Work once it is ready on first start (e.g. create a database)."""

    # --- shared behaviour ----------------------------------------------------------

    @property
    def managed(self) -> bool:
        return bool(self.section.managed)

    @property
    def state_dir(self) -> Path:
        return self.settings.data_dir / self.name

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        """In the invoking user's own folder: the state folder may be the service user's,
        who could leave a pid file there naming any process (cdc.stack.process)."""
        return self.settings.data_dir / "run" / f"{self.name}.pid"

    @property
    def _old_pid_file(self) -> Path:  # where a cdc before `run/` kept it
        return self.state_dir / f"{self.name}.pid"

    def pid(self) -> int | None:
        return read_pid(self.pid_file) or read_pid(self._old_pid_file)

    def service_user(self) -> ServiceUser | None:
        """The user to run as: None to run as ourselves."""
        if not self.needs_service_user or os.geteuid() != 0:
            return None
        user = ServiceUser.lookup(self.settings.service_user)
        if user is None:
            raise NotInstalledError(
                f"{self.name} cannot run as root and the service user "
                f"'{self.settings.service_user}' does not exist: {INSTALL_HINT} (it creates it) "
                "or set service_user to an existing unprivileged user"
            )
        return user

    def check_ports(self) -> None:
        host = self.section.host
        for port in self.ports():
            if not port_free(host, port):
                raise PortInUseError(
                    f"{self.name}: port {port} on {host} is already in use by another process; "
                    f"stop that process or set {self.name} ports to free ones "
                    f"(cdc.toml [{self.name}] or CDC_{self.name.upper()}__PORT)"
                )

    def _check_reachable(self, path: Path, user: ServiceUser) -> None:
        for parent in [path, *path.parents]:
            if parent.exists() and not os.stat(parent).st_mode & 0o001:
                if os.stat(parent).st_uid == user.uid:
                    continue
                raise ComponentError(
                    f"{self.name}: the service user '{user.name}' cannot enter {parent}; "
                    f"run `chmod o+x {parent}` or choose a data_dir it can reach"
                )

    def start(self) -> None:
        """Start it detached and wait until it answers."""
        if self.pid() is not None:
            log.info("%s already runs", self.name)
            return
        # marked when made (a purge removes it); enterable by the service user it is given to
        make_state_dir(self.settings, self.state_dir, 0o711)
        user = self.service_user()
        if user is not None:
            self._check_reachable(self.state_dir, user)
        self.prepare()
        if user is not None:
            user.own(self.state_dir)
        self.state_dir.chmod(0o700)  # logs, configs and secrets: its owner alone
        make_state_dir(self.settings, self.pid_file.parent, 0o700)
        argv, env = self.command()
        spawn(
            argv,
            log_file=self.log_file,
            pid_file=self.pid_file,
            cwd=self.state_dir,
            env=env,
            user=user,
        )
        self.wait_ready()
        self.after_start()

    def wait_ready(self) -> None:
        why = wait_for(
            self.ready, timeout=self.start_timeout, still_running=lambda: self.pid() is not None
        )
        if why is not None:
            raise ComponentError(
                f"{self.name} failed to start ({why}){self._last_log_line()}; see {self.log_file}"
            )

    def _last_log_line(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines[-200:]):
            if any(w in line for w in ("ERROR", "FATAL", "Exception", "error:", "Error")):
                return f": {line.strip()[:200]}"
        return ""

    def stop(self) -> bool:
        """Stop it if it runs. Returns True if it was running."""
        pid = self.pid()
        if pid is None:
            return False
        stop_pid(pid, self.stop_signal, self.stop_timeout)
        self.pid_file.unlink(missing_ok=True)
        if read_pid(self._old_pid_file) is None:
            self._old_pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> ComponentStatus:
        status = ComponentStatus(
            self.name, up=False, address=self.address, managed=self.managed, pid=self.pid()
        )
        try:
            status.up = self.ready()
            if status.up:
                status.version = self.version()
                status.details = self.details()
        except Exception as exc:  # status reports, it never fails
            status.error = _short_reason(exc, status.pid is None and self.managed)
        return status


def _short_reason(exc: Exception, not_running: bool) -> str:
    if not_running:
        return "not running"
    text = str(exc).strip()
    if "refused" in text or "Max retries" in text or "NoBrokersAvailable" in type(exc).__name__:
        return "does not answer"
    return (text.splitlines()[0] if text else type(exc).__name__)[:120]
