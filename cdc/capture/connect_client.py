"""A small client of the Kafka Connect REST API.

The local worker's API asks for basic authentication (Kafka's
BasicAuthSecurityRestExtension): its one user, REST_USER, has a password generated
into `<data_dir>/secrets/connect-rest.password` (0600) that only `cdc` reads, so no
other local user may read connector configs, create a connector that names the
pipeline's secrets, or pause, rewind or delete the pipeline's connector. A worker you
run yourself takes `connect.username`/`connect.password`, if it asks for them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests

from cdc.core.errors import ComponentError, ConnectorError
from cdc.core.settings import Settings

__all__ = ["REST_USER", "ConnectClient", "connect_client", "refusal", "rest_password_file"]

REST_USER = "cdc"

log = logging.getLogger(__name__)


def rest_password_file(settings: Settings) -> Path:
    return settings.data_dir / "secrets" / "connect-rest.password"


def connect_client(settings: Settings, timeout: float = 10.0) -> ConnectClient:
    """A client of the pipeline's Connect workers (connect.hosts, else host:port; https
    with connect.tls), logged in as the settings say (the local worker: REST_USER and
    its generated password)."""
    section = settings.connect
    auth = None
    if section.username is not None and section.password is not None:
        auth = (section.username, section.password.get_secret_value())
    elif section.managed:
        try:
            auth = (REST_USER, rest_password_file(settings).read_text().strip())
        except OSError:  # a worker started before it asked for one
            auth = None
    verify: bool | str = str(section.ca_file) if section.ca_file is not None else True
    return ConnectClient(section.urls, timeout, auth, verify)


class ConnectClient:
    """Asks the workers of one Connect group, each in turn while one does not answer;
    the one that last answered is asked first (any worker takes any request: it
    forwards to the group's leader what only the leader does)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        timeout: float = 10.0,
        auth: tuple[str, str] | None = None,
        verify: bool | str = True,
    ) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed:
            raise ValueError("a Connect client needs at least one worker's URL")
        self.urls = [u.rstrip("/") for u in listed]
        self.timeout = timeout
        self._session = requests.Session()
        self._session.auth = auth
        # given with each request: a session's own `verify` loses to REQUESTS_CA_BUNDLE
        # or CURL_CA_BUNDLE in the environment (psf/requests#3829)
        self.verify = verify

    @property
    def url(self) -> str:
        """The worker asked first: the one that last answered."""
        return self.urls[0]

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """The answer of the first worker that gives one; a worker that cannot be reached
        (refused, no route, TLS refused, or no answer to a read) is left for the next."""
        failures = []
        for url in list(self.urls):
            try:
                resp = self._session.request(
                    method, url + path, timeout=self.timeout, verify=self.verify, **kwargs
                )
            except requests.exceptions.SSLError as exc:
                failures.append(f"{url}: TLS refused ({_tls_reason(exc)})")
            except requests.ConnectionError as exc:
                failures.append(f"{url}: {type(exc).__name__}")
            except requests.Timeout as exc:
                failures.append(f"{url}: {type(exc).__name__}")
                if method != "GET":  # it may have been done: said, not sent to another
                    break
            except requests.RequestException as exc:
                failures.append(f"{url}: {type(exc).__name__}")
            else:
                if url != self.urls[0]:
                    log.info("Kafka Connect: %s answers (%s did not)", url, self.urls[0])
                    self.urls.remove(url)
                    self.urls.insert(0, url)
                return resp
        workers = "the worker" if len(self.urls) == 1 else f"none of the {len(self.urls)} workers"
        raise ComponentError(
            f"Kafka Connect does not answer ({workers}: {'; '.join(failures)}); is the stack "
            "up? (`cdc up`, then `cdc status`; your own workers: connect.hosts)"
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        deadline = time.monotonic() + BUSY_RETRY_S
        while True:
            resp = self._send(method, path, **kwargs)
            # 409 while the workers rebalance or take a new configuration ("Cannot complete
            # request momentarily due to stale configuration", "… because of a conflicting
            # operation"): asked again once they have; a conflict of another kind is said
            if not (resp.status_code == 409 and _busy(resp)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if resp.status_code == 401:
            raise ConnectorError(
                f"Kafka Connect at {self.url} refused cdc's login: set connect.username and "
                "connect.password for your workers (the local one: `cdc down`, then `cdc up`)"
            )
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise ConnectorError(f"Kafka Connect refused {method} {path}: {refusal(message)}")
        return resp.json() if resp.content else None

    def info(self) -> dict[str, Any]:
        return dict(self._call("GET", "/"))

    def plugins(self) -> list[str]:
        return [p["class"] for p in self._call("GET", "/connector-plugins")]

    def connectors(self) -> dict[str, Any]:
        """Every connector with its status (state, and each task's state) and its info
        (its configuration as stored: secrets as references)."""
        return dict(self._call("GET", "/connectors", params={"expand": ["status", "info"]}))

    def put_config(self, name: str, config: dict[str, str]) -> None:
        """Create the connector, or update its configuration (idempotent)."""
        self._call("PUT", f"/connectors/{name}/config", json=config)

    def create_stopped(self, name: str, config: dict[str, str]) -> None:
        """Create the connector in the STOPPED state (no tasks until resume(), KIP-980), so
        that its offsets can be set before it reads anything."""
        body = {"name": name, "config": config, "initial_state": "STOPPED"}
        self._call("POST", "/connectors", json=body)

    def task_configs(self, name: str) -> list[dict[str, str]]:
        """The configuration each running task was started with."""
        return [dict(t["config"]) for t in self._call("GET", f"/connectors/{name}/tasks")]

    def config(self, name: str) -> dict[str, str]:
        return dict(self._call("GET", f"/connectors/{name}/config"))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/connectors/{name}/status"))

    def restart_failed(self, name: str) -> None:
        """Restart the connector's failed tasks (with its configuration now)."""
        params = {"includeTasks": "true", "onlyFailed": "true"}
        self._call("POST", f"/connectors/{name}/restart", params=params)

    def pause(self, name: str) -> None:
        self._call("PUT", f"/connectors/{name}/pause")

    def resume(self, name: str) -> None:
        self._call("PUT", f"/connectors/{name}/resume")

    def stop(self, name: str) -> None:
        """Stop the connector and its tasks; it keeps its configuration (resume() restarts it)."""
        self._call("PUT", f"/connectors/{name}/stop")

    def delete(self, name: str) -> None:
        self._call("DELETE", f"/connectors/{name}")

    def offsets(self, name: str) -> list[dict[str, Any]]:
        """The source offsets Connect holds for the connector's name: partition and offset."""
        return list(self._call("GET", f"/connectors/{name}/offsets")["offsets"])

    def set_offsets(self, name: str, offsets: list[dict[str, Any]], timeout: float = 30.0) -> None:
        """Replace the offset of each given partition (KIP-875); the connector must be stopped."""
        self._while_stopping(
            "PATCH", f"/connectors/{name}/offsets", timeout, json={"offsets": offsets}
        )

    def reset_offsets(self, name: str, timeout: float = 30.0) -> None:
        """Remove every offset of the connector (KIP-875); the connector must be stopped."""
        self._while_stopping("DELETE", f"/connectors/{name}/offsets", timeout)

    def _while_stopping(self, method: str, path: str, timeout: float, **kwargs: Any) -> None:
        """Call, retrying while Connect still winds the connector's tasks down (or rebalances)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._call(method, path, **kwargs)
                return
            except ConnectorError as exc:
                message = str(exc).lower()
                transient = ("stopped state", "rebalance", "momentarily")
                if not any(t in message for t in transient) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def wait_stopped(self, name: str, timeout: float = 60.0) -> None:
        """Wait until the connector is STOPPED and none of its tasks is left."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(name)
            if status.get("connector", {}).get("state") == "STOPPED" and not status.get("tasks"):
                return
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"connector {name} has not stopped after {timeout:.0f}s "
                    f"(state {status.get('connector', {}).get('state', 'unknown')}); "
                    "see the Connect log"
                )
            time.sleep(0.3)

    def wait_running(self, name: str, timeout: float = 60.0) -> None:
        """Wait until the connector and its tasks run; a failed task raises with its trace."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = self.status(name)
            except ConnectorError:
                status = {}
            tasks = status.get("tasks", [])
            for task in tasks:
                if task.get("state") == "FAILED":
                    why = summarize_trace(task.get("trace", ""))
                    raise ConnectorError(f"connector {name} task {task.get('id')} failed: {why}")
            if (
                status.get("connector", {}).get("state") == "RUNNING"
                and tasks
                and all(t.get("state") == "RUNNING" for t in tasks)
            ):
                return
            if time.monotonic() > deadline:
                raise ConnectorError(
                    f"connector {name} is not running after {timeout:.0f}s "
                    f"(state {status.get('connector', {}).get('state', 'unknown')}); "
                    "see the Connect log"
                )
            time.sleep(0.5)


def _tls_reason(exc: Exception) -> str:
    """Why the TLS handshake failed, in a few words (a certificate not trusted, a name
    that does not match), not the chain of wrapped exceptions."""
    text = str(exc)
    for known in ("certificate verify failed", "hostname mismatch", "wrong version number"):
        if known in text:
            return known + (": set connect.ca_file" if "verify" in known else "")
    return "handshake failed"


def summarize_trace(trace: str) -> str:
    """The most telling line of a Java stack trace: the deepest 'Caused by', else the first."""
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("Caused by:")]
    line = causes[-1].removeprefix("Caused by:").strip() if causes else (lines[0] if lines else "")
    return line[:300] or "no trace given"


BUSY_RETRY_S = 30.0  # how long a request Connect is too busy for is asked again


def _busy(resp: Any) -> bool:
    """A 409 that says the workers are momentarily busy (rebalancing, or reading a new
    configuration), not that the request conflicts with what exists."""
    text = resp.text.lower()
    return "momentarily" in text or "rebalance" in text or "conflicting operation" in text


def too_large(trace: str, limit: int) -> str | None:
    """What to do when the task failed on a change event larger than Kafka takes (None
    for another failure): the connector stops at that event and resumes there, so
    raising the limit loses nothing."""
    if "RecordTooLargeException" not in trace:
        return None
    return (
        f"a change event is larger than kafka.max_message_bytes ({limit} bytes), so capture "
        "stopped at it (nothing after it is lost: the slot keeps the WAL): raise "
        "kafka.max_message_bytes (at most 268435456), run `cdc up` (a local broker) and "
        "`cdc setup` (the topics and the connector); the connector resumes at that event. "
        'Or set kafka.oversized = "dead_letter" and run `cdc setup`: such an event then '
        "goes to the dead-letter topic and capture goes on"
    )


def refusal(message: object) -> str:
    """Connect's error message on one line: an invalid config lists its errors on the
    lines after the first, and they are the part that says what is wrong."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    kept = [line for line in lines if not line.startswith("You can also find the above list")]
    text = ""
    for line in kept:
        text += (" " if text.endswith(":") else "; ") + line if text else line
    return text[:600]
