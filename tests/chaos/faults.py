"""The faults, one at a time, each followed by the recovery a user would make.

    apply-kill        SIGKILL of the `cdc apply` process group; start `cdc apply` again
    connect-kill      SIGKILL of Kafka Connect; `cdc up`
    kafka-kill        SIGKILL of the Kafka broker; `cdc up`
    opensearch-kill   SIGKILL of OpenSearch; `cdc up`
    redis-kill        SIGKILL of Redis; `cdc up`
    postgres-restart  fast shutdown of PostgreSQL (SIGINT to the postmaster, what
                      `pg_ctl restart -m fast` sends); `cdc up`
    postgres-kill     SIGKILL of the postmaster; its backends end; `cdc up` (crash recovery)
    opensearch-stop   SIGSTOP of OpenSearch for `stop_s` (60 s), then SIGCONT
    redis-stop        SIGSTOP of Redis for `stop_s`, then SIGCONT
    backfill          `cdc backfill public.accounts` under the load, Kafka Connect killed
                      (SIGKILL) while it runs and `cdc up`; the backfill is followed to its end
    rename            `accounts` renamed, a transfer made under the passing name (which no
                      store applies), renamed back; `cdc status` must name the passing
                      name's topic; then what it says: `cdc backfill public.accounts` and
                      `cdc setup`
    swap              the two shelves swapped by renames in one transaction, under the
                      load's updates of both by name; `cdc status` must say so; then
                      what it says: `cdc setup` (it cuts and backfills both)
    partition         a partition added to the events' root and the load's new events moved
                      into it (its rows updated at once: its FULL identity came from the
                      root), then a table holding rows attached as the next one and
                      backfilled as docs/capture.md says: `cdc backfill public.events
                      --where "<its bounds>"`

After every fault the connector must run again (`cdc status -o json`), and an apply job
that ended by itself is noted and started again.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psycopg

from cdc.capture.connect_client import connect_client
from cdc.capture.source_setup import SIGNAL_TABLE
from cdc.core.errors import CdcError
from tests.chaos.load import EVENTS, PARTITION_SPAN, SHELVES, Load
from tests.chaos.stack import ChaosError, ChaosStack

__all__ = ["FaultKind", "FaultRecord", "inject", "plan", "wait_pipeline_healthy"]


class FaultKind(StrEnum):
    APPLY_KILL = "apply-kill"
    CONNECT_KILL = "connect-kill"
    KAFKA_KILL = "kafka-kill"
    OPENSEARCH_KILL = "opensearch-kill"
    REDIS_KILL = "redis-kill"
    POSTGRES_RESTART = "postgres-restart"
    POSTGRES_KILL = "postgres-kill"
    OPENSEARCH_STOP = "opensearch-stop"
    REDIS_STOP = "redis-stop"
    BACKFILL = "backfill"
    RENAME = "rename"
    SWAP = "swap"
    PARTITION = "partition"


_KILLED_COMPONENT = {
    FaultKind.CONNECT_KILL: "connect",
    FaultKind.KAFKA_KILL: "kafka",
    FaultKind.OPENSEARCH_KILL: "opensearch",
    FaultKind.REDIS_KILL: "redis",
}
_FROZEN_COMPONENT = {FaultKind.OPENSEARCH_STOP: "opensearch", FaultKind.REDIS_STOP: "redis"}


@dataclass
class FaultRecord:
    kind: FaultKind
    at_s: float  # since the load started
    recovery_s: float = 0.0  # from the fault to the pipeline running again
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "at_s": round(self.at_s, 1),
            "recovery_s": round(self.recovery_s, 1),
            "notes": self.notes,
        }


def plan(kinds: list[FaultKind], rounds: int, rng: random.Random) -> list[FaultKind]:
    """Every kind `rounds` times, in a random order with no kind twice in a row."""
    order: list[FaultKind] = []
    for _ in range(rounds):
        batch = list(kinds)
        rng.shuffle(batch)
        if order and len(batch) > 1 and batch[0] == order[-1]:
            batch[0], batch[-1] = batch[-1], batch[0]
        order += batch
    return order


def inject(
    stack: ChaosStack, kind: FaultKind, at_s: float, stop_s: float, load: Load | None = None
) -> FaultRecord:
    """Inject one fault, recover from it, and wait until the pipeline runs again (`load`:
    the one running, which the partition fault moves into the partition it adds)."""
    record = FaultRecord(kind, at_s)
    began = time.monotonic()
    if kind is FaultKind.APPLY_KILL:
        stack.kill_apply()
        stack.start_apply()
    elif kind in _KILLED_COMPONENT:
        _kill_component(stack, _KILLED_COMPONENT[kind], record)
    elif kind in _FROZEN_COMPONENT:
        _freeze_component(stack, _FROZEN_COMPONENT[kind], stop_s, record)
    elif kind is FaultKind.POSTGRES_RESTART:
        _stop_postgres(stack, signal.SIGINT, record)
    elif kind is FaultKind.POSTGRES_KILL:
        _stop_postgres(stack, signal.SIGKILL, record)
    elif kind is FaultKind.BACKFILL:
        _backfill_with_connect_killed(stack, record)
    elif kind is FaultKind.RENAME:
        _rename_and_back(stack, record)
    elif kind is FaultKind.SWAP:
        _swap_shelves(stack, record)
    elif kind is FaultKind.PARTITION:
        _add_partitions(stack, record, load)
    wait_pipeline_healthy(stack, record)
    record.recovery_s = time.monotonic() - began
    return record


def _pid(stack: ChaosStack, component: str) -> int:
    pid = stack.pid(component)
    if pid is None:
        raise ChaosError(f"{component} does not run before the fault (no live pid in its pid file)")
    return pid


def _kill_component(stack: ChaosStack, component: str, record: FaultRecord) -> None:
    pid = _pid(stack, component)
    stack.signal_group(pid, signal.SIGKILL)
    if not stack.wait_gone([pid], 30):
        raise ChaosError(f"{component} (pid {pid}) survived SIGKILL")
    stack.up()
    if stack.pid(component) in (None, pid):
        raise ChaosError(f"`cdc up` did not start {component} again")


def _freeze_component(
    stack: ChaosStack, component: str, stop_s: float, record: FaultRecord
) -> None:
    pid = _pid(stack, component)
    stack.freeze(pid)
    try:
        time.sleep(stop_s)
    finally:
        stack.thaw(pid)
    record.notes.append(f"frozen {stop_s:.0f} s")


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _stop_postgres(stack: ChaosStack, sig: signal.Signals, record: FaultRecord) -> None:
    pid = _pid(stack, "postgres")
    backends = _children(pid)
    os.kill(pid, sig)  # the postmaster alone
    # after a SIGKILL the backends notice their postmaster is gone and end; a new
    # postmaster refuses to start while one of them still holds the shared memory
    if not stack.wait_gone([pid, *backends], 60):
        record.notes.append("backends still alive 60 s after the postmaster went")
    stack.up()
    if stack.pid("postgres") in (None, pid):
        raise ChaosError("`cdc up` did not start postgres again")


def _backfill_signals(stack: ChaosStack) -> int:
    """How many backfills the pipeline's signal table has been asked for."""
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {SIGNAL_TABLE} WHERE type = 'execute-snapshot'"
        ).fetchone()
    return int(row[0]) if row else 0


def _backfill_with_connect_killed(stack: ChaosStack, record: FaultRecord) -> None:
    asked = _backfill_signals(stack)
    backfill = stack.start_cdc("backfill", "public.accounts")
    # Connect killed once the backfill is under way (its signal written), not while the
    # command still checks the connector, as a loaded machine may take seconds to start it
    deadline = time.monotonic() + 120
    while _backfill_signals(stack) == asked and backfill.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1)
    _kill_component(stack, "connect", record)
    try:
        out, _ = backfill.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        backfill.kill()
        raise ChaosError("`cdc backfill public.accounts` did not end within 600 s") from None
    if backfill.returncode != 0:
        raise ChaosError(f"`cdc backfill public.accounts` failed: {out.strip()[-600:]}")
    record.notes.append("backfill followed to its end")


def _rename_and_back(stack: ChaosStack, record: FaultRecord) -> None:
    passing = "accounts_passing"
    with psycopg.connect(stack.settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE public.accounts RENAME TO {passing}")
        try:  # a transfer of 1 between two accounts that exist: the sum stays
            with conn.transaction():
                rows = conn.execute(
                    f"SELECT aid FROM public.{passing} WHERE balance > 0 ORDER BY aid LIMIT 2 "
                    "FOR UPDATE"
                ).fetchall()
                if len(rows) == 2:
                    conn.execute(
                        f"UPDATE public.{passing} SET balance = balance - 1 WHERE aid = %s",
                        rows[0],
                    )
                    conn.execute(
                        f"UPDATE public.{passing} SET balance = balance + 1 WHERE aid = %s",
                        rows[1],
                    )
        finally:
            conn.execute(f"ALTER TABLE public.{passing} RENAME TO accounts")
    deadline = time.monotonic() + 120
    while True:  # the change reaches its topic, then status names it
        said = stack.cdc("status", "-o", "json")
        if passing in said.stdout and said.returncode != 0:
            break
        if time.monotonic() > deadline:
            raise ChaosError(f"`cdc status` did not name {passing} in 120 s: {said.stdout[-600:]}")
        time.sleep(4)
    record.notes.append(f"cdc status named {passing} (exit {said.returncode})")
    for args in (("backfill", "public.accounts"), ("setup",)):
        done = stack.cdc(*args)
        if done.returncode != 0:
            raise ChaosError(f"`cdc {' '.join(args)}` failed: {done.stderr.strip()[-600:]}")
    said = stack.cdc("status", "-o", "json")
    if passing in said.stdout:
        raise ChaosError(f"`cdc status` still names {passing} after the backfill and setup")


def _swap_shelves(stack: ChaosStack, record: FaultRecord) -> None:
    a, b = (name.split(".", 1)[1] for name in SHELVES)
    with psycopg.connect(stack.settings.postgres.dsn()) as conn, conn.transaction():
        conn.execute(f"ALTER TABLE public.{a} RENAME TO {a}_swapping")
        conn.execute(f"ALTER TABLE public.{b} RENAME TO {a}")
        conn.execute(f"ALTER TABLE public.{a}_swapping RENAME TO {b}")
    said = _status_saying(stack, "a name the pipeline captured another table under")
    record.notes.append(f"cdc status named the swap (exit {said.returncode})")
    done = stack.cdc("setup")
    if done.returncode != 0:
        raise ChaosError(f"`cdc setup` failed after the swap: {done.stderr.strip()[-600:]}")
    if "cut (as a TRUNCATE" not in done.stderr + done.stdout:
        raise ChaosError(f"`cdc setup` did not cut the swapped shelves: {done.stderr[-600:]}")
    record.notes.append("cdc setup cut and backfilled both")


def _add_partitions(stack: ChaosStack, record: FaultRecord, load: Load | None) -> None:
    dsn = stack.settings.postgres.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass", (EVENTS,)
        ).fetchone()
        made = int(row[0]) if row else 1
        base, attached = made * PARTITION_SPAN, (made + 1) * PARTITION_SPAN
        conn.execute(
            f"CREATE TABLE {EVENTS}_{made} PARTITION OF {EVENTS} "
            f"FOR VALUES FROM ({base}) TO ({base + PARTITION_SPAN})"
        )
        if load is not None:  # its new events there, and its updates of them
            load.events.move_to(base + 1)
        conn.execute(f"CREATE TABLE {EVENTS}_{made + 1} (LIKE {EVENTS})")
        conn.execute(
            f"INSERT INTO {EVENTS}_{made + 1} SELECT g, 7, 'attached' "
            f"FROM generate_series({attached}, {attached + 49}) g"
        )
        conn.execute(
            f"ALTER TABLE {EVENTS} ATTACH PARTITION {EVENTS}_{made + 1} "
            f"FOR VALUES FROM ({attached}) TO ({attached + PARTITION_SPAN})"
        )
    where = f"eid >= {attached} AND eid < {attached + PARTITION_SPAN}"
    done = stack.cdc("backfill", EVENTS, "--where", where)
    if done.returncode != 0:
        raise ChaosError(f"`cdc backfill {EVENTS} --where ...` failed: {done.stderr[-600:]}")
    record.notes.append(f"partitions {made} (created) and {made + 1} (attached, 50 rows) added")


def _status_saying(stack: ChaosStack, words: str) -> subprocess.CompletedProcess[str]:
    """`cdc status` once it says `words` and exits 1 (120 s at most)."""
    deadline = time.monotonic() + 120
    while True:
        said = stack.cdc("status", "-o", "json")
        if words in said.stdout and said.returncode != 0:
            return said
        if time.monotonic() > deadline:
            raise ChaosError(f"`cdc status` did not say {words!r} in 120 s: {said.stdout[-600:]}")
        time.sleep(4)


def wait_pipeline_healthy(stack: ChaosStack, record: FaultRecord, timeout: float = 240) -> None:
    """Until `cdc status` shows the connector and its task running and the apply job runs.

    A failed task is restarted through Connect's REST API (the project has no command
    for it) and noted; an apply job that ended by itself is noted and started again.
    """
    deadline = time.monotonic() + timeout
    restarted_task = False
    while True:
        ended = stack.restart_apply_if_ended()
        if ended:
            record.notes.append(ended)
        pipeline = stack.status().get("pipeline") or {}
        connector = pipeline.get("connector") or {}
        tasks = connector.get("tasks") or []
        if connector.get("state") == "RUNNING" and tasks and all(t == "RUNNING" for t in tasks):
            return
        if "FAILED" in tasks and not restarted_task:
            record.notes.append(
                f"connector task FAILED after recovery ({connector.get('error', '?')}); "
                "restarted through Connect's REST API"
            )
            _restart_failed(stack)
            restarted_task = True
        if time.monotonic() > deadline:
            raise ChaosError(
                f"the connector does not run {timeout:.0f} s after {record.kind}: {connector}"
            )
        time.sleep(4)


def _restart_failed(stack: ChaosStack) -> None:
    with contextlib.suppress(CdcError):  # as before: a refusal is retried by the caller
        connect_client(stack.settings, timeout=30).restart_failed(stack.settings.pipeline.connector)
