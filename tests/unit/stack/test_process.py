"""Finding and stopping the stack's processes, with real processes and sockets."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

from cdc.stack.process import alive, port_free, port_open, read_pid, spawn, stop_pid


def test_port_free_and_open_follow_a_listening_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.listen()
        assert not port_free("127.0.0.1", port)
        assert port_open("127.0.0.1", port)
    assert port_free("127.0.0.1", port)
    assert not port_open("127.0.0.1", port)


def test_spawned_process_is_found_then_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "p.pid"
    pid = spawn(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log_file=tmp_path / "p.log",
        pid_file=pid_file,
        cwd=tmp_path,
    )
    assert read_pid(pid_file) == pid
    assert stop_pid(pid, signal.SIGTERM, timeout=10) is True
    assert not alive(pid)
    assert read_pid(pid_file) is None


def test_a_process_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    log = tmp_path / "p.log"
    pid = spawn(
        [sys.executable, "-c", code], log_file=log, pid_file=tmp_path / "p.pid", cwd=tmp_path
    )
    while "ready" not in log.read_text():
        pass
    assert stop_pid(pid, signal.SIGTERM, timeout=0.5) is False
    assert not alive(pid)


def test_a_reused_pid_is_not_mistaken_for_ours(tmp_path: Path) -> None:
    import os

    pid_file = tmp_path / "p.pid"
    pid_file.write_text(f"{os.getpid()} 1\n")  # our pid, but another start time
    assert read_pid(pid_file) is None
    pid_file.write_text("garbage")
    assert read_pid(pid_file) is None
