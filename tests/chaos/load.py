"""The bank: accounts and the transfers between them, and a load that keeps the sum of
balances constant; beside it two shelves of one shape (swapped by a fault) and a log of
events partitioned by range (a fault adds a partition under the load).

Each transfer moves an amount from one account to another (both rows updated in key
order, so two transfers never deadlock) and appends a row to `transfers`; it commits only
if both accounts still exist. New accounts open with a zero balance, and only an account
whose balance is zero is closed (deleted): the sum of balances never changes. The load
reconnects after PostgreSQL restarts; a commit whose outcome is unknown (the connection
broke during COMMIT) is counted as ambiguous, which does not matter to the checks: the
stores are compared with what PostgreSQL holds, not with these counters.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import psycopg

__all__ = [
    "ACCOUNTS",
    "EVENTS",
    "PARTITION_SPAN",
    "SHELVES",
    "TRANSFERS",
    "Load",
    "LoadStats",
    "create_bank",
]

ACCOUNTS = "public.accounts"
TRANSFERS = "public.transfers"
SHELVES = ("public.shelf_a", "public.shelf_b")
EVENTS = "public.events"
PARTITION_SPAN = 1_000_000  # the event ids each partition of EVENTS holds
FIRST_NEW_ACCOUNT = 1_000_001


def create_bank(dsn: str, accounts: int, balance: int) -> int:
    """Create and fill the two tables; return the sum of balances the load keeps."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {ACCOUNTS} (aid int PRIMARY KEY, balance bigint NOT NULL, "
            "transfers int NOT NULL DEFAULT 0, note text)"
        )
        conn.execute(
            f"CREATE TABLE {TRANSFERS} (tid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "src int NOT NULL, dst int NOT NULL, amount int NOT NULL, note text)"
        )
        conn.execute(
            f"INSERT INTO {ACCOUNTS} (aid, balance, note) "
            "SELECT g, %s, 'opened' FROM generate_series(1, %s) g",
            (balance, accounts),
        )
        for n, shelf in enumerate(SHELVES):  # keys that overlap: a mix of the two shows
            conn.execute(
                f"CREATE TABLE {shelf} (sid int PRIMARY KEY, qty bigint NOT NULL, note text)"
            )
            conn.execute(
                f"INSERT INTO {shelf} SELECT g, g, %s FROM generate_series(%s::int, %s::int) g",
                (shelf, 1 + 25 * n, 50 + 25 * n),
            )
        conn.execute(
            f"CREATE TABLE {EVENTS} (eid bigint PRIMARY KEY, kind int NOT NULL, note text) "
            "PARTITION BY RANGE (eid)"
        )
        conn.execute(
            f"CREATE TABLE {EVENTS}_0 PARTITION OF {EVENTS} "
            f"FOR VALUES FROM (0) TO ({PARTITION_SPAN})"
        )
        conn.execute(f"INSERT INTO {EVENTS} SELECT g, 0, 'first' FROM generate_series(1, 100) g")
    return accounts * balance


@dataclass
class LoadStats:
    """What the load did (each counter is of committed transactions, unless named otherwise)."""

    transfers: int = 0
    opened: int = 0
    closed: int = 0
    refused: int = 0  # an account was gone: rolled back
    ambiguous: int = 0  # the connection broke during COMMIT
    errors: int = 0  # statements that failed (PostgreSQL restarting, deadlock)
    reconnects: int = 0
    shelved: int = 0  # shelf rows updated
    logged: int = 0  # events written or updated
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    @property
    def transactions(self) -> int:
        return self.transfers + self.opened + self.closed + self.shelved + self.logged

    def figures(self) -> dict[str, int]:
        return {
            "transactions": self.transactions,
            "transfers": self.transfers,
            "accounts_opened": self.opened,
            "accounts_closed": self.closed,
            "shelf_updates": self.shelved,
            "events_written": self.logged,
            "refused": self.refused,
            "ambiguous_commits": self.ambiguous,
            "errors": self.errors,
            "reconnects": self.reconnects,
        }


class _Accounts:
    """The account ids the load may pick (PostgreSQL stays the truth)."""

    def __init__(self, initial: int) -> None:
        self.lock = threading.Lock()
        self.live = list(range(1, initial + 1))
        self.opened: list[int] = []
        self.next_id = FIRST_NEW_ACCOUNT

    def pick_two(self, rng: random.Random) -> tuple[int, int]:
        with self.lock:
            a, b = rng.sample(self.live, 2)
        return a, b

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id - 1

    def opened_one(self, aid: int) -> None:
        with self.lock:
            self.live.append(aid)
            self.opened.append(aid)

    def pick_opened(self, rng: random.Random) -> int | None:
        with self.lock:
            return rng.choice(self.opened) if self.opened else None

    def closed_one(self, aid: int) -> None:
        with self.lock:
            if aid in self.opened:
                self.opened.remove(aid)
                self.live.remove(aid)


class _Events:
    """The event ids the load writes: new ones in the newest partition (a fault adds one
    and moves the load there), updates of one written in it (or of the first 100)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_id = 101

    def new_id(self) -> int:
        with self.lock:
            self.next_id += 1
            return self.next_id - 1

    def pick(self, rng: random.Random) -> int:
        with self.lock:
            low = max(self.next_id - self.next_id % PARTITION_SPAN, 1)
            return rng.randint(low, self.next_id - 1) if self.next_id > low else rng.randint(1, 100)

    def move_to(self, base: int) -> None:
        """New events go to the partition that starts at `base` (it exists now)."""
        with self.lock:
            self.next_id = base


class Load:
    """`workers` threads together committing about `rate` transactions per second."""

    def __init__(self, dsn: str, accounts: int, rate: float, seed: int, workers: int = 2) -> None:
        self.dsn = dsn
        self.rate = rate
        self.seed = seed
        self.workers = workers
        self.stats = LoadStats()
        self.accounts = _Accounts(accounts)
        self.events = _Events()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failure: BaseException | None = None

    def start(self) -> None:
        for n in range(self.workers):
            thread = threading.Thread(
                target=self._guarded, args=(n,), name=f"chaos-load-{n}", daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _guarded(self, n: int) -> None:
        try:
            self._work(n)
        except BaseException as exc:  # reported by the run, never swallowed
            self.failure = exc

    def _work(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        interval = self.workers / self.rate
        due = time.monotonic()
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        while not self.stop_event.is_set():
            due += interval
            pause = due - time.monotonic()
            if pause > 0:
                self.stop_event.wait(pause)
            elif pause < -2:
                due = time.monotonic()  # far behind (PostgreSQL was down): no burst
            if conn is None or conn.closed:
                conn = self._connect()
                if conn is None:
                    continue
            try:
                self._one(conn, rng)
            except psycopg.OperationalError:
                self.stats.add("errors")
                conn.close()
                conn = None
            except psycopg.Error:
                self.stats.add("errors")
                if not conn.closed:
                    conn.rollback()
        if conn is not None:
            conn.close()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]] | None:
        try:
            conn = psycopg.connect(self.dsn, connect_timeout=5)
        except psycopg.OperationalError:
            self.stats.add("reconnects")
            self.stop_event.wait(0.5)
            return None
        return conn

    def _one(self, conn: psycopg.Connection[tuple[object, ...]], rng: random.Random) -> None:
        dice = rng.random()
        if dice < 0.1:  # a shelf's row, by name (the names may be swapped under it)
            shelf = rng.choice(SHELVES)
            conn.execute(
                f"UPDATE {shelf} SET qty = qty + 1, note = %s WHERE sid = %s",
                (f"moved {rng.randint(0, 999)}", rng.randint(1, 75)),
            )
            if self._commit(conn):
                self.stats.add("shelved")
            return
        if dice < 0.2:  # an event: a new one, or an update of one (its partition's identity)
            if rng.random() < 0.6:
                conn.execute(
                    f"INSERT INTO {EVENTS} (eid, kind, note) VALUES (%s, 1, 'new')",
                    (self.events.new_id(),),
                )
            else:
                conn.execute(
                    f"UPDATE {EVENTS} SET kind = kind + 1, note = 'seen' WHERE eid = %s",
                    (self.events.pick(rng),),
                )
            if self._commit(conn):
                self.stats.add("logged")
            return
        if dice < 0.23:
            aid = self.accounts.new_id()
            conn.execute(
                f"INSERT INTO {ACCOUNTS} (aid, balance, note) VALUES (%s, 0, 'opened')", (aid,)
            )
            if self._commit(conn):
                self.accounts.opened_one(aid)
                self.stats.add("opened")
            return
        if dice < 0.25:
            closing = self.accounts.pick_opened(rng)
            if closing is None:
                return
            cur = conn.execute(f"DELETE FROM {ACCOUNTS} WHERE aid = %s AND balance = 0", (closing,))
            closed = cur.rowcount == 1
            if self._commit(conn) and closed:
                self.accounts.closed_one(closing)
                self.stats.add("closed")
            return
        src, dst = self.accounts.pick_two(rng)
        amount = rng.randint(1, 100)
        note = f"sent {amount} to {dst}" if rng.random() < 0.5 else f"got {amount} from {src}"
        touched = 0
        for aid, delta in sorted(((src, -amount), (dst, amount))):
            cur = conn.execute(
                f"UPDATE {ACCOUNTS} SET balance = balance + %s, transfers = transfers + 1, "
                "note = %s WHERE aid = %s",
                (delta, note, aid),
            )
            touched += cur.rowcount
        if touched != 2:  # an account was closed meanwhile
            conn.rollback()
            self.stats.add("refused")
            return
        conn.execute(
            f"INSERT INTO {TRANSFERS} (src, dst, amount, note) VALUES (%s, %s, %s, %s)",
            (src, dst, amount, "x" * rng.randint(0, 40)),
        )
        if self._commit(conn):
            self.stats.add("transfers")

    def _commit(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        try:
            conn.commit()
        except psycopg.OperationalError:
            self.stats.add("ambiguous")
            conn.close()
            return False
        return True
