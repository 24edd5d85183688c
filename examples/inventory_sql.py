"""Inventory deduction with the fenced SQL store, on SQLite and on PostgreSQL.

    python -m examples.inventory_sql                     # both; local redis + PostgreSQL
    python examples/inventory_sql.py --backend sqlite
    python -m examples.inventory_sql --backend postgres --dsn "host=db user=app dbname=shop"

For each order a worker takes the Redlock ``inventory:<sku>`` and runs a fenced
read-modify-write in a ``FencedTable.guard``: the row's fence is raised to the worker's
token first, then the stock is read, then it is reduced if enough is left (the table
also has ``CHECK (qty >= 0)``).

In the demo six workers (threads, each with its own database connection) process 30
orders for one SKU. Meanwhile worker Z took the lock first, read the stock, and stalled
past its TTL (a pause, a slow disk). When it wakes it writes the stock it computed from
its stale read, with its old token: the table rejects it.

Without --dsn, PostgreSQL is a throwaway server started with the repository's test
tooling, tests/support/postgres.py (skipped, with a note, when its binaries are
missing).
It exits non-zero unless, on every database, the final stock equals the initial
stock minus what the fulfilled orders took, it never went negative, and Z was
rejected.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from typing import Any

from fencing import FencedTable, StaleTokenError
from redlock import LockLost, Redlock

if __package__:
    from examples import _common as common
else:  # python examples/inventory_sql.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager per process; one FencedTable per database connection (sqlite3 or
# psycopg 3), on a table with a fence column:
#     dlm = Redlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     table = FencedTable(connection, "inventory", "sku")

SCHEMA = ("CREATE TABLE inventory (sku TEXT PRIMARY KEY, "
          "qty INTEGER NOT NULL CHECK (qty >= 0), fence BIGINT NOT NULL DEFAULT 0)")
SKU = "widget"


def deduct(dlm: Redlock, table: FencedTable, quantity: int) -> tuple[bool, int]:
    """One order: (fulfilled?, stock seen)."""
    with dlm.lock(f"inventory:{SKU}", ttl=5.0, timeout=60.0) as held, \
            table.guard(SKU, held.token) as row:  # raise the row's fence, then read it
        stock = int(row["qty"])
        if stock < quantity:
            return False, stock
        row.update(qty=stock - quantity)
        return True, stock


# -- The demo around it (the harness is in examples/_common.py) -----------------------------


class StalledWorker:
    """Worker Z: takes the lock with a short TTL, reads the stock, stalls until told to
    go on (its lock expires meanwhile), then writes with its old token."""

    def __init__(self, connect: common.Connect, dlm: Redlock) -> None:
        self.connect, self.lock = connect, dlm.lock(f"inventory:{SKU}", ttl=0.3, timeout=30.0)
        self.has_read, self.resume = threading.Event(), threading.Event()
        self.state: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._work)

    def start(self) -> None:
        self.thread.start()
        self.has_read.wait(60)

    def finish(self) -> Any:
        """Let Z write; its outcome: a StaleTokenError, or what went wrong."""
        self.resume.set()
        self.thread.join(60)
        return self.state.get("outcome")

    def _work(self) -> None:
        conn = self.connect()
        try:
            self.lock.acquire()
            self.state["token"] = token = self.lock.token
            table = FencedTable(conn, "inventory", "sku")
            row = table.read(SKU)
            assert row is not None
            self.state["seen"] = seen = int(row["qty"])
            self.has_read.set()
            self.resume.wait(60)  # stalled: its lock expires meanwhile
            try:
                table.update(SKU, token, qty=seen - 5)
                self.state["outcome"] = "accepted"
            except StaleTokenError as exc:
                self.state["outcome"] = exc
        except BaseException as exc:
            self.state["outcome"] = exc
        finally:
            self.has_read.set()
            try:
                self.lock.release()
            except LockLost:  # expected: it stalled past its TTL, and the release says so
                self.state["lock_expired"] = True
            conn.close()


def scenario(name: str, connect: common.Connect, dlm: Redlock, stock: int, orders: list[int],
             workers: int) -> bool:
    setup = connect()
    setup.execute("DROP TABLE IF EXISTS inventory")
    setup.execute(SCHEMA)
    setup.commit()
    table = FencedTable(setup, "inventory", "sku")
    with dlm.lock(f"inventory:{SKU}", ttl=5.0, timeout=30.0) as held:
        table.upsert(SKU, held.token, qty=stock)
    z = StalledWorker(connect, dlm)
    z.start()

    queue = list(orders)
    mutex = threading.Lock()

    def worker(_index: int) -> list[tuple[int, bool, int]]:
        done: list[tuple[int, bool, int]] = []
        conn = connect()
        try:
            mine = FencedTable(conn, "inventory", "sku")
            while True:
                with mutex:
                    if not queue:
                        return done
                    quantity = queue.pop(0)
                done.append((quantity, *deduct(dlm, mine, quantity)))
        finally:
            conn.close()

    started = time.monotonic()
    per_worker = common.in_threads(worker, range(workers))
    elapsed = time.monotonic() - started
    verdict = z.finish()
    final = table.read(SKU)
    setup.close()
    assert final is not None

    errors = [r for r in per_worker if isinstance(r, Exception)]
    results = [done for r in per_worker if not isinstance(r, Exception) for done in r]
    fulfilled = [q for q, ok, _ in results if ok]
    short = [q for q, ok, _ in results if not ok]
    lowest_seen = min((seen for _, _, seen in results), default=stock)
    expected = stock - sum(fulfilled)
    print(f"{name}: {len(results)} orders by {workers} workers in {elapsed:.2f} s: "
          f"{len(fulfilled)} fulfilled ({sum(fulfilled)} units), {len(short)} refused "
          f"(not enough stock); stock {stock} -> {final['qty']} (expected {expected}); "
          f"lowest stock seen {lowest_seen}")
    if isinstance(verdict, StaleTokenError):
        print(f"{name}: stalled worker Z (token {z.state['token']}) had read stock "
              f"{z.state['seen']} and then tried to write {z.state['seen'] - 5}: REJECTED, "
              f"the row's fence was already {verdict.highest}")
    else:
        print(f"{name}: stalled worker Z's stale write was {verdict!r}: fencing failed")
    for error in errors:
        print(f"{name}: worker failed: {error!r}")
    return (not errors and len(results) == len(orders) and final["qty"] == expected
            and final["qty"] >= 0 and lowest_seen >= 0 and isinstance(verdict, StaleTokenError))


def run(args: argparse.Namespace, lock_urls: list[str], _store_url: str) -> int:
    rng = random.Random(args.seed)
    orders = [rng.randint(1, 3) for _ in range(args.orders)]
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    print(f"{args.orders} orders for {sum(orders)} units of {SKU!r}; {args.stock} in stock")
    ok, ran = True, []
    with Redlock(lock_urls) as dlm:
        if "sqlite" in backends:
            with common.sqlite_database() as connect:
                ok = scenario("SQLite", connect, dlm, args.stock, orders, args.workers) and ok
                ran.append("SQLite")
        if "postgres" in backends:
            with common.postgres_database(args.dsn) as pg_connect:
                if pg_connect is not None:
                    ok = scenario("PostgreSQL", pg_connect, dlm, args.stock, orders,
                                  args.workers) and ok
                    ran.append("PostgreSQL")
    return common.verdict(ok and bool(ran), f"fenced inventory deduction correct on "
                                            f"{' and '.join(ran) or 'no database'}")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--dsn", help="an existing PostgreSQL database (libpq connection string)")
    p.add_argument("--stock", type=int, default=40)
    p.add_argument("--orders", type=int, default=30)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options, store=False))
