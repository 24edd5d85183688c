"""A separate writer process for the fenced-store concurrency tests.

    python fenced_writer.py STORE TARGET NAME SEED RESOURCE [RESOURCE ...]

STORE is redis (TARGET a URL), sqlite (TARGET a file path) or postgres (TARGET a
DSN). Prints "ready", waits for a line "T0 DEADLINE" on stdin, writes until the
deadline, then prints one JSON record per write.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fence_history


def make_write(store: str, target: str) -> tuple[fence_history.Write, Callable[[], None]]:
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
        records = fence_history.write_loop(name, write, resources, t0, deadline, int(seed))
    finally:
        close()
    for record in records:
        print(record.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
