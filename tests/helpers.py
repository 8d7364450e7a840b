"""Shared by the test tiers: run the real `cdc` command, pick free ports, the schema of a
warehouse batch."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def ended(pid: int) -> bool:
    """Whether process `pid` is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def free_ports(count: int) -> list[int]:
    """Distinct ports nothing listens on now (held open together so they differ)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def run_cdc(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `cdc ARGS` as a user would, in a clean environment plus env."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    if "CDC_CONFIG" in os.environ:  # the tests' empty settings file (tests/conftest.py)
        base["CDC_CONFIG"] = os.environ["CDC_CONFIG"]
    return subprocess.run(
        [sys.executable, "-m", "cdc", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )


# the parsed events of a warehouse batch (cdc/log/envelope.py, with `cut_ms`), as
# tests hand them to WarehouseStore.write_frame
EVENTS = (
    "table string, topic string, partition int, offset long, key string, op string, "
    "after string, commit_ms long, commit_lsn long, lsn long, error string, value string, "
    "cut_ms long"
)


def recorded_placeholder(dsn: str, pipeline: str) -> str:
    """The pipeline's own placeholder for an unchanged TOASTed value, as `cdc setup`
    recorded it in PostgreSQL (what its connector writes instead of Debezium's default)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT placeholder FROM cdc.placeholders WHERE pipeline = %s", (pipeline,)
        ).fetchone()
    assert row is not None, f"pipeline {pipeline} has no placeholder recorded"
    return str(row[0])


def query_checkpoint(settings: Any, view: str) -> Path:
    """The checkpoint of the streaming query that keeps `view` (its own, or one it shares
    with other views: cdc/stores/warehouse/views/queries.py)."""
    from cdc.log.checkpoints import checkpoint
    from cdc.stores.warehouse.views.registry import streaming, views_of

    (found,) = [v for v in streaming(views_of(settings)) if v.name == view]
    return Path(checkpoint(settings, found.checkpoint_label).path)


def steady_updates(dsn: str, table: str, rows: int, stop: Any) -> None:
    """About 20 single-row updates a second of `table`'s column n (ids 1 to `rows` in
    turn), until the event `stop` is set."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.wait(0.05):
            conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (i % rows + 1,))
            i += 1


@contextlib.contextmanager
def apply_process(
    env: Mapping[str, str], stores: list[str], log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`cdc apply` of `stores` in a process of its own (session leader), with the CDC_*
    environment `env` (its output into `log`, if given); interrupted (Ctrl-C) at the end,
    killed if it does not stop."""
    import signal

    out = log.open("ab") if log is not None else subprocess.DEVNULL
    apply = subprocess.Popen(
        [sys.executable, "-m", "cdc", "apply", *(f"--store={s}" for s in stores)],
        env={**os.environ, **env},
        cwd=ROOT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
    )
    try:
        yield apply
    finally:
        apply.send_signal(signal.SIGINT)
        try:
            apply.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(apply.pid, signal.SIGKILL)
        if log is not None:
            out.close()
