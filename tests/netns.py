"""A network namespace of the test's own, for a service at another address than
loopback: a veth pair joins it to this machine, the namespace at 10.x.y.2 and this
machine at 10.x.y.1 (a /30 of its own). Needs root (`ip netns`); removed at the end."""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Namespace:
    name: str
    address: str  # the namespace's side: where its services listen
    host_address: str  # this machine's side: where the namespace reaches it

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True, timeout=30)


def _taken() -> str:
    return subprocess.run(
        ["ip", "-4", "addr"], check=True, capture_output=True, text=True, timeout=30
    ).stdout


@contextmanager
def namespace() -> Iterator[Namespace]:
    """A namespace with its veth pair, addresses and loopback up; gone afterwards."""
    tag = uuid.uuid4().hex[:6]
    name, outside, inside = f"cdc{tag}", f"vc{tag}h", f"vc{tag}n"
    taken = _taken()
    while True:  # a /30 no interface of this machine is in
        net = f"10.{random.randint(64, 250)}.{random.randint(0, 255)}.{4 * random.randint(0, 63)}"
        if f"inet {net.rsplit('.', 1)[0]}." not in taken:
            break
    base, last = net.rsplit(".", 1)
    here, there = f"{base}.{int(last) + 1}", f"{base}.{int(last) + 2}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a network namespace here ({exc}): run as root")
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", name)
        _ip("addr", "add", f"{here}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{there}/30", "dev", inside)
        _ip("netns", "exec", name, "ip", "link", "set", inside, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield Namespace(name, there, here)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30)
