"""The demo's workload: a shop's transactions against the demo schema, at a fixed rate.

Each transaction is one of: a new order with its items, an order's status moving on,
a customer's details changing, a product's price or stock changing, an order
cancelled and deleted, a new customer. The mix is weights per kind.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg

__all__ = ["DEFAULT_MIX", "Workload"]

DEFAULT_MIX = {
    "new_order": 40,
    "order_status": 25,
    "customer_update": 15,
    "product_update": 10,
    "delete_order": 5,
    "new_customer": 5,
}


class Workload(threading.Thread):
    """Runs until `stop` is set; counts committed transactions per kind in `done`."""

    def __init__(
        self, dsn: str, rate: float = 50.0, mix: dict[str, int] | None = None, seed: int = 1
    ) -> None:
        super().__init__(daemon=True, name="workload")
        self.dsn, self.rate, self.seed = dsn, rate, seed
        self.mix = dict(mix or DEFAULT_MIX)
        unknown = set(self.mix) - set(DEFAULT_MIX)
        if unknown or rate <= 0:
            raise ValueError(
                f"a workload needs a positive rate and kinds among {sorted(DEFAULT_MIX)}"
            )
        self.stop = threading.Event()
        self.done: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.seed)
        kinds, weights = zip(*self.mix.items(), strict=True)
        interval = 1.0 / self.rate
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                next_at = time.monotonic()
                while not self.stop.is_set():
                    kind = rng.choices(kinds, weights)[0]
                    with conn.transaction():
                        getattr(self, f"_{kind}")(conn, rng)
                    self.done[kind] += 1
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        self.stop.wait(delay)
                    else:
                        next_at = time.monotonic()  # behind: do not burst to catch up
        except BaseException as exc:  # shown by the demo
            self.error = exc

    def once_each(self) -> None:
        """One transaction of each kind of the mix, now (the demo's warm-up)."""
        rng = random.Random(self.seed)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for kind in self.mix:
                with conn.transaction():
                    getattr(self, f"_{kind}")(conn, rng)

    @staticmethod
    def _one(conn: psycopg.Connection[Any], query: str) -> Any:
        row = conn.execute(query).fetchone()
        return row[0] if row else None

    def _new_order(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        customer = self._one(conn, "SELECT id FROM customers ORDER BY random() LIMIT 1")
        if customer is None:
            return
        lines = conn.execute(
            "SELECT id, price FROM products ORDER BY random() LIMIT %s", (rng.randint(1, 4),)
        ).fetchall()
        quantities = [rng.randint(1, 3) for _ in lines]
        total = sum((price * q for (_, price), q in zip(lines, quantities, strict=True)), 0)
        order = self._one(  # placed with its total, so the order's creation carries it
            conn,
            f"INSERT INTO orders (customer_id, total) VALUES ({int(customer)}, {total}) "
            "RETURNING id",
        )
        for line, ((product, price), quantity) in enumerate(zip(lines, quantities, strict=True)):
            conn.execute(
                "INSERT INTO order_items (order_id, line, product_id, quantity, unit_price) "
                "VALUES (%s, %s, %s, %s, %s)",
                (order, line + 1, product, quantity, price),
            )

    def _order_status(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        # half the time one of the newest orders: orders are paid and shipped soon
        recent = "ORDER BY id DESC LIMIT 20" if rng.random() < 0.5 else ""
        conn.execute(
            "UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' WHEN 'paid' THEN "
            "'shipped' WHEN 'shipped' THEN 'delivered' ELSE status END, updated_at = now() "
            "WHERE id = (SELECT id FROM (SELECT id FROM orders WHERE status IN "
            f"('new', 'paid', 'shipped') {recent}) o ORDER BY random() LIMIT 1)"
        )

    def _customer_update(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        conn.execute(
            "UPDATE customers SET balance = balance + %s, attributes = attributes || "
            "jsonb_build_object('visits', coalesce((attributes->>'visits')::int, 0) + 1), "
            "updated_at = now() WHERE id = (SELECT id FROM customers ORDER BY random() LIMIT 1)",
            (round(rng.uniform(-20, 50), 2),),
        )

    def _product_update(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        conn.execute(
            "UPDATE products SET price = greatest(1, price * %s)::numeric(10, 2), "
            "in_stock = greatest(0, in_stock + %s), updated_at = now() "
            "WHERE id = (SELECT id FROM products ORDER BY random() LIMIT 1)",
            (round(rng.uniform(0.9, 1.1), 3), rng.randint(-3, 5)),
        )

    def _delete_order(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        conn.execute(  # items go with it (ON DELETE CASCADE)
            "DELETE FROM orders WHERE id = (SELECT id FROM orders WHERE status = 'new' "
            "ORDER BY random() LIMIT 1)"
        )

    def _new_customer(self, conn: psycopg.Connection[Any], rng: random.Random) -> None:
        conn.execute(
            "INSERT INTO customers (email, name, country, attributes) VALUES "
            "('c-' || gen_random_uuid() || '@example.com', %s, %s, %s)",
            (
                rng.choice(["Ada", "Grace", "Alan", "Edsger", "Barbara"])
                + " "
                + str(rng.randint(1, 999)),
                rng.choice(["NL", "DE", "FR", "GB", "US"]),
                '{"tier": "bronze"}',
            ),
        )
