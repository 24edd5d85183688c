"""Where ours asyncio spends its time above the raw redis.asyncio floor (N=3).

    .venv/bin/python benchmarks/async_overhead.py [--rounds 5] [--cycles 1500]

Uncontended acquire+release; every variant sends the same two Lua scripts (our ACQUIRE
and RELEASE, by EVALSHA) to the three nodes with asyncio.gather, on redis.asyncio
connection pools built with our connection settings:

* gather:             get_connection, send_command, read_response, release
* + wait_for:         each node's exchange wrapped in asyncio.wait_for(..., timeout), as
                      redlock/aio.py _Nodes._exchange does (a Task and a timer per call)
* + read timeout:     and read_response(timeout=...) as well (what _exchange also passes)
* ours asyncio:       AsyncRedlock / AsyncLock, the real client

The difference between rows is what each layer costs per cycle (2 requests x 3 nodes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import statistics
import sys
from typing import Any

import _measure
import structlog

TIMEOUT = 0.05  # our default node_timeout


async def measure(urls: list[str], rounds: int, cycles: int) -> dict[str, list[float]]:
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from redlock import AsyncRedlock, scripts
    from redlock._node_config import pool_overrides

    pools = [redis.asyncio.ConnectionPool.from_url(
        u, **pool_overrides(TIMEOUT, Retry(NoBackoff(), 0))) for u in urls]
    for pool in pools:
        client = redis.asyncio.Redis(connection_pool=pool)
        await client.set("redlock:node-marker", "bench", nx=True)
        await client.script_load(scripts.ACQUIRE.source)
        await client.script_load(scripts.RELEASE.source)

    async def one(pool: Any, command: tuple[Any, ...], level: int) -> Any:
        conn = await pool.get_connection()
        try:
            async def exchange() -> Any:
                await conn.send_command(*command, check_health=False)
                if level >= 2:
                    return await conn.read_response(timeout=TIMEOUT, disconnect_on_error=False)
                return await conn.read_response()

            if level >= 1:
                return await asyncio.wait_for(exchange(), TIMEOUT)
            return await exchange()
        finally:
            await pool.release(conn)

    def variant(level: int) -> tuple[Any, Any]:
        async def acquire(resource: str) -> str:
            owner = secrets.token_hex(16)
            command = ("EVALSHA", scripts.ACQUIRE.sha, 3, f"redlock:{{{resource}}}:lock",
                       f"redlock:{{{resource}}}:fence", "redlock:node-marker", owner, 10000, 0)
            await asyncio.gather(*(one(p, command, level) for p in pools))
            return owner

        async def release(resource: str, owner: str) -> None:
            command = ("EVALSHA", scripts.RELEASE.sha, 2, f"redlock:{{{resource}}}:lock",
                       f"redlock:{{{resource}}}:released", owner)
            await asyncio.gather(*(one(p, command, level) for p in pools))

        return acquire, release

    dlm = AsyncRedlock(urls)

    async def ours_acquire(handle: Any) -> None:
        await handle.acquire()

    async def ours_release(handle: Any, _ctx: Any) -> None:
        await handle.release()

    names = ["gather", "+ wait_for", "+ read timeout", "ours asyncio"]
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        for index in [(i + round_no) % 4 for i in range(4)]:
            name = names[index]
            if name == "ours asyncio":
                out = await _measure.uncontended_async(
                    lambda r: dlm.lock(r, ttl=10.0), ours_acquire, ours_release,
                    "bench:aover:ours", cycles=cycles, warmup=100)
            else:
                acquire, release = variant(index)
                out = await _measure.uncontended_async(
                    lambda r: r, acquire, release, f"bench:aover:{index}", cycles=cycles,
                    warmup=100)
            results[name].append(out["p50_us"])
    await dlm.close()
    for pool in pools:
        await pool.disconnect()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1500)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        cache_logger_on_first_use=True)
    from redlock.testing.redis_nodes import RedisNodes

    with RedisNodes(3) as nodes:
        results = asyncio.run(measure(nodes.urls, args.rounds, args.cycles))
    print(f"uncontended acquire+release on N=3, {args.cycles} cycles x {args.rounds} rounds;"
          f" loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    previous = None
    for name, values in results.items():
        med = statistics.median(values)
        step = "" if previous is None else f"  step {med - previous:+.0f} us"
        print(f"  {name:15s} p50 {med:5.0f} us [{min(values):.0f}-{max(values):.0f}]{step}")
        previous = med
    return 0


if __name__ == "__main__":
    sys.exit(main())
