"""Inventory deduction with the fenced SQL store, on SQLite and on PostgreSQL.

    python -m examples.inventory_sql                     # both; local redis + PostgreSQL
    python examples/inventory_sql.py --backend sqlite
    python -m examples.inventory_sql --backend postgres --dsn "host=db user=app dbname=shop"

Six workers (threads, each with its own database connection) process 30 orders
for one SKU. For each order a worker takes the Redlock ``inventory:<sku>`` and
runs a fenced read-modify-write in a ``FencedTable.guard``: the row's fence is
raised to the worker's token first, then the stock is read, then it is reduced
if enough is left (the table also has ``CHECK (qty >= 0)``).

Meanwhile worker Z took the lock first, read the stock, and stalled past its TTL
(a pause, a slow disk). When it wakes it writes the stock it computed from its
stale read, with its old token: the table rejects it.

Without --dsn, PostgreSQL is a throwaway server started with
redlock.testing.postgres (skipped, with a note, when its binaries are missing).
Exits non-zero unless, on every database, the final stock equals the initial
stock minus what the fulfilled orders took, it never went negative, and Z was
rejected.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__:
    from examples import _common as common
else:  # python examples/inventory_sql.py
    import _common as common  # type: ignore[no-redef]

from fencing import FencedTable, StaleTokenError
from redlock import Redlock

SKU = "widget"
Connect = Callable[[], Any]


@contextlib.contextmanager
def sqlite_db() -> Iterator[Connect]:
    with tempfile.TemporaryDirectory(prefix="inventory-") as tmp:
        path = Path(tmp) / "shop.sqlite3"
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").connection.close()
        yield lambda: sqlite3.connect(path, timeout=30.0)


@contextlib.contextmanager
def postgres_db(dsn: str | None) -> Iterator[Connect | None]:
    import psycopg

    if dsn:
        yield lambda: psycopg.connect(dsn)
        return
    from redlock.testing.postgres import PostgresServer, postgres_available

    if not postgres_available():
        print("PostgreSQL: skipped, server binaries not found (bash scripts/setup.sh "
              "installs them)")
        yield None
        return
    with PostgresServer() as server:
        print(f"started a throwaway PostgreSQL server on {server.host}:{server.port}")
        yield lambda: psycopg.connect(server.dsn)


def deduct(dlm: Redlock, table: FencedTable, quantity: int) -> tuple[bool, int]:
    """One order: (fulfilled?, stock seen)."""
    with dlm.lock(f"inventory:{SKU}", ttl=5.0, timeout=60.0) as held, \
            table.guard(SKU, held.token) as row:
        stock = int(row["qty"])
        if stock < quantity:
            return False, stock
        row.update(qty=stock - quantity)
        return True, stock


def scenario(name: str, connect: Connect, dlm: Redlock, stock: int, orders: list[int],
             workers: int) -> bool:
    setup = connect()
    setup.execute("DROP TABLE IF EXISTS inventory")
    setup.execute("CREATE TABLE inventory (sku TEXT PRIMARY KEY, "
                  "qty INTEGER NOT NULL CHECK (qty >= 0), fence BIGINT NOT NULL DEFAULT 0)")
    setup.commit()
    table = FencedTable(setup, "inventory", "sku")
    with dlm.lock(f"inventory:{SKU}", ttl=5.0, timeout=30.0) as held:
        table.upsert(SKU, held.token, qty=stock)

    # Worker Z: takes the lock with a short TTL, reads, then stalls past it.
    z_lock = dlm.lock(f"inventory:{SKU}", ttl=0.3, timeout=30.0)
    z_state: dict[str, Any] = {}
    z_has_read = threading.Event()
    workers_done = threading.Event()

    def worker_z() -> None:
        conn = connect()
        try:
            z_lock.acquire()
            z_state["token"] = token = z_lock.token
            z_table = FencedTable(conn, "inventory", "sku")
            row = z_table.read(SKU)
            assert row is not None
            z_state["seen"] = seen = int(row["qty"])
            z_has_read.set()
            workers_done.wait(60)  # stalled: its lock expires meanwhile
            try:
                z_table.update(SKU, token, qty=seen - 5)
                z_state["outcome"] = "accepted"
            except StaleTokenError as exc:
                z_state["outcome"] = exc
        except BaseException as exc:
            z_state["outcome"] = exc
        finally:
            z_has_read.set()
            z_lock.release()
            conn.close()

    stalled = threading.Thread(target=worker_z)
    stalled.start()
    z_has_read.wait(60)

    results: list[tuple[int, bool, int]] = []
    errors: list[BaseException] = []
    queue = list(enumerate(orders))
    mutex = threading.Lock()

    def worker() -> None:
        conn = connect()
        try:
            mine = FencedTable(conn, "inventory", "sku")
            while True:
                with mutex:
                    if not queue:
                        return
                    _, quantity = queue.pop(0)
                fulfilled, seen = deduct(dlm, mine, quantity)
                with mutex:
                    results.append((quantity, fulfilled, seen))
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    workers_done.set()
    stalled.join(60)
    final = table.read(SKU)
    setup.close()
    assert final is not None

    fulfilled = [q for q, ok, _ in results if ok]
    short = [q for q, ok, _ in results if not ok]
    lowest_seen = min((seen for _, _, seen in results), default=stock)
    expected = stock - sum(fulfilled)
    print(f"{name}: {len(results)} orders by {workers} workers in {elapsed:.2f} s: "
          f"{len(fulfilled)} fulfilled ({sum(fulfilled)} units), {len(short)} refused "
          f"(not enough stock); stock {stock} -> {final['qty']} (expected {expected}); "
          f"lowest stock seen {lowest_seen}")
    verdict = z_state.get("outcome")
    if isinstance(verdict, StaleTokenError):
        print(f"{name}: stalled worker Z (token {z_state['token']}) had read stock "
              f"{z_state['seen']} and then tried to write {z_state['seen'] - 5}: REJECTED, "
              f"the row's fence was already {verdict.highest}")
    else:
        print(f"{name}: stalled worker Z's stale write was {verdict!r}: fencing failed")
    for error in errors:
        print(f"{name}: worker failed: {error!r}")
    return (not errors and len(results) == len(orders) and final["qty"] == expected
            and final["qty"] >= 0 and lowest_seen >= 0 and isinstance(verdict, StaleTokenError))


def run(lock_urls: list[str], backends: list[str], dsn: str | None, stock: int, n_orders: int,
        workers: int, seed: int) -> int:
    rng = random.Random(seed)
    orders = [rng.randint(1, 3) for _ in range(n_orders)]
    print(f"{n_orders} orders for {sum(orders)} units of {SKU!r}; {stock} in stock")
    ok = True
    ran = []
    with Redlock(lock_urls) as dlm:
        if "sqlite" in backends:
            with sqlite_db() as connect:
                ok = scenario("SQLite", connect, dlm, stock, orders, workers) and ok
                ran.append("SQLite")
        if "postgres" in backends:
            with postgres_db(dsn) as pg_connect:
                if pg_connect is not None:
                    ok = scenario("PostgreSQL", pg_connect, dlm, stock, orders, workers) and ok
                    ran.append("PostgreSQL")
    return common.verdict(ok and bool(ran), f"fenced inventory deduction correct on "
                                            f"{' and '.join(ran) or 'no database'}")


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__, store=False)
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--dsn", help="an existing PostgreSQL database (libpq connection string)")
    p.add_argument("--stock", type=int, default=40)
    p.add_argument("--orders", type=int, default=30)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    common.quiet_logging()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    with common.redis_nodes(args.urls, None, store=False) as (lock_urls, _):
        return run(lock_urls, backends, args.dsn, args.stock, args.orders, args.workers,
                   args.seed)


if __name__ == "__main__":
    sys.exit(main())
