"""A separate writer process for the fenced-store concurrency tests.

    python -m tests.fencing.workers.fenced_writer STORE TARGET NAME SEED RESOURCE [RESOURCE ...]

(run from the repository root). STORE is redis (TARGET a URL), sqlite (TARGET a file
path) or postgres (TARGET a DSN). Prints "ready", waits for a line "T0 DEADLINE" on
stdin, writes until the deadline, then prints one JSON record per write.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable

from tests.fencing.workload import WriteFunction, write_loop


def make_write(store: str, target: str) -> tuple[WriteFunction, Callable[[], None]]:
    if store == "redis":
        import redis

        from fencing import RedisFencedStore

        client = redis.Redis.from_url(target)
        fenced = RedisFencedStore(client)
        return fenced.write, client.close
    from fencing import FencedTable

    if store == "sqlite":
        conn = sqlite3.connect(target, timeout=30.0)
        table = FencedTable(conn, "cells", "name")
        return (lambda key, token, value: table.update(key, token, val=value)), conn.close
    if store == "postgres":
        import psycopg

        pg = psycopg.connect(target)
        table = FencedTable(pg, "cells", "name")
        return (lambda key, token, value: table.update(key, token, val=value)), pg.close
    raise SystemExit(f"unknown store {store!r}")


def main() -> int:
    store, target, name, seed, *resources = sys.argv[1:]
    write, close = make_write(store, target)
    print("ready", flush=True)
    t0, deadline = (float(x) for x in sys.stdin.readline().split())
    try:
        records = write_loop(name, write, resources, t0, deadline, int(seed))
    finally:
        close()
    for record in records:
        print(record.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
