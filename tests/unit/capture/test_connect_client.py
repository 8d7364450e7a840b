"""Connect's REST client asks again while the workers are momentarily busy (a 409 during
a rebalance or a new configuration), says any other conflict at once, and asks the next
worker of the group when one does not answer (local HTTP servers play Connect's answers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from cdc.capture.connect_client import ConnectClient
from cdc.core.errors import ComponentError, ConnectorError

BUSY = (
    "Cannot complete request momentarily due to stale configuration (typically caused by a "
    "concurrent config change)"
)
REBALANCE = "Cannot complete request because of a conflicting operation (e.g. worker rebalance)"


class Connect(BaseHTTPRequestHandler):
    answers: ClassVar[list[tuple[int, str]]] = []
    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        code, message = self.answers.pop(0) if self.answers else (204, "")
        body = json.dumps({"error_code": code, "message": message}).encode() if message else b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def connect() -> Iterator[ConnectClient]:
    server = HTTPServer(("127.0.0.1", 0), Connect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Connect.calls = 0
    try:
        yield ConnectClient(f"http://127.0.0.1:{server.server_port}", timeout=5)
    finally:
        server.shutdown()


def test_a_request_connect_is_momentarily_too_busy_for_is_asked_again(
    connect: ConnectClient,
) -> None:
    Connect.answers = [
        (409, BUSY),
        (409, "Cannot complete request because of a conflicting operation (e.g. worker rebalance)"),
    ]
    connect.restart_failed("c")
    assert Connect.calls == 3


def test_another_conflict_is_said_at_once(connect: ConnectClient) -> None:
    Connect.answers = [(409, "Connector c already exists")]
    with pytest.raises(ConnectorError, match="already exists"):
        connect.create_stopped("c", {})
    assert Connect.calls == 1


class Worker(BaseHTTPRequestHandler):
    """A worker of the group that answers GET /connectors/<name>/status."""

    asked: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        type(self).asked.append(self.server.server_port)
        body = json.dumps(
            {
                "name": "c",
                "connector": {"state": "RUNNING", "worker_id": "w2:8083"},
                "tasks": [{"id": 0, "state": "RUNNING", "worker_id": "w2:8083"}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_a_worker_that_does_not_answer_is_left_for_the_next() -> None:
    server = HTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Worker.asked = []
    down = f"http://127.0.0.1:{_closed_port()}"
    up = f"http://127.0.0.1:{server.server_port}"
    try:
        client = ConnectClient([down, up], timeout=5)
        assert client.status("c")["tasks"][0]["worker_id"] == "w2:8083"
        # the one that answered is asked first from then on
        assert client.url == up and client.urls == [up, down]
        client.status("c")
        assert Worker.asked == [server.server_port] * 2
    finally:
        server.shutdown()


def test_no_worker_answering_is_one_line_naming_each() -> None:
    first, second = (f"http://127.0.0.1:{_closed_port()}" for _ in range(2))
    client = ConnectClient([first, second], timeout=2, auth=("cdc", "rest-secret"))
    with pytest.raises(ComponentError) as refused:
        client.info()
    message = str(refused.value)
    assert "none of the 2 workers" in message and first in message and second in message
    assert "\n" not in message and "rest-secret" not in message
