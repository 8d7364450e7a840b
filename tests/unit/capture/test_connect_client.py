"""Connect's REST client asks again while the workers are momentarily busy (a 409 during
a rebalance or a new configuration), and says any other conflict at once (a local HTTP
server plays Connect's answers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from cdc.capture.connect_client import ConnectClient
from cdc.core.errors import ConnectorError

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
