"""A writer thread: committed inserts, updates and deletes against a table, under test."""

from __future__ import annotations

import random
import threading
import time

import psycopg


class Writer(threading.Thread):
    """Committed inserts, updates (version + 1) and deletes, one per transaction, until stopped."""

    def __init__(
        self, dsn: str, table: str, first_new_id: int, max_id: int, rate: float | None = None
    ) -> None:
        """`rate`: at most that many transactions a second (none: as fast as it can)."""
        super().__init__(daemon=True)
        self.dsn, self.table, self.rate = dsn, table, rate
        self.next_id, self.max_id = first_new_id, max_id
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            started = time.monotonic()
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    if self.rate is not None:  # the next commit's moment, at `rate` a second
                        wait = started + self.commits / self.rate - time.monotonic()
                        if wait > 0:
                            self.stop.wait(wait)
                            continue
                    roll = rng.random()
                    if roll < 0.6:
                        conn.execute(
                            f"UPDATE {self.table} SET version = version + 1, "
                            "note = md5(random()::text) WHERE id = %s",
                            (rng.randint(1, self.max_id),),
                        )
                    elif roll < 0.85:
                        conn.execute(
                            f"INSERT INTO {self.table} (id, version, note) VALUES (%s, 0, 'new')",
                            (self.next_id,),
                        )
                        self.next_id += 1
                    else:
                        conn.execute(
                            f"DELETE FROM {self.table} WHERE id = %s",
                            (rng.randint(1, self.max_id),),
                        )
                    self.commits += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc
