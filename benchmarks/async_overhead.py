"""Where ours asyncio spends its time above the raw redis.asyncio floor (N=3).

    .venv/bin/python benchmarks/async_overhead.py [--rounds 5] [--cycles 1500]

Uncontended acquire+release; every variant sends the same two Lua scripts (our ACQUIRE
and RELEASE, by EVALSHA) to the three nodes with asyncio.gather, on redis.asyncio
connection pools built with our connection settings (benchmarks/_floors.py):

* gather:             get_connection, send_command, read_response, release
* + wait_for:         each node's exchange wrapped in asyncio.wait_for(..., timeout)
                      (a Task and a timer per call: what our client did before it
                      switched to asyncio.timeout)
* + read timeout:     and read_response(timeout=...) as well
* timeout + read t.:  asyncio.timeout instead of wait_for, with the read timeout: the
                      layers redlock/aio.py ``_Nodes._exchange`` puts around each call
                      on Python 3.11+ (``_within``)
* ours asyncio:       AsyncRedlock / AsyncLock, the real client

The step between two rows is what the added layer costs per cycle (2 requests x 3 nodes);
the "timeout + read t." row steps from "+ read timeout", i.e. shows wait_for's extra cost.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

import _measure
from _environment import configure_logging, loadavg_text
from _floors import AsyncFloor

TIMEOUT = 0.05  # our default node_timeout
# name -> (per-call timeout layer, read timeout); None for the real client
VARIANTS: dict[str, tuple[str | None, bool] | None] = {
    "gather": (None, False),
    "+ wait_for": ("wait_for", False),
    "+ read timeout": ("wait_for", True),
    "timeout + read t.": ("timeout", True),
    "ours asyncio": None,
}
if sys.version_info < (3, 11):  # asyncio.timeout is 3.11+
    del VARIANTS["timeout + read t."]


async def measure(urls: list[str], rounds: int, cycles: int) -> dict[str, list[float]]:
    from redlock import AsyncRedlock

    floor = AsyncFloor(urls, node_timeout=TIMEOUT, ttl_s=10.0)
    await floor.prepare()
    dlm = AsyncRedlock(urls)

    async def ours_acquire(handle: Any) -> None:
        await handle.acquire()

    async def ours_release(handle: Any, _ctx: Any) -> None:
        await handle.release()

    names = list(VARIANTS)
    results: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        for index in [(i + round_no) % len(names) for i in range(len(names))]:
            name, layers = names[index], VARIANTS[names[index]]
            if layers is None:
                out = await _measure.uncontended_async(
                    lambda r: dlm.lock(r, ttl=10.0), ours_acquire, ours_release,
                    "bench:aover:ours", cycles=cycles, warmup=100)
            else:
                acquire, release = floor.calls(*layers)
                out = await _measure.uncontended_async(
                    lambda r: r, acquire, release, f"bench:aover:{index}", cycles=cycles,
                    warmup=100)
            results[name].append(out["p50_us"])
    await dlm.close()
    await floor.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1500)
    args = parser.parse_args()
    configure_logging()
    from redlock.testing import RedisNodes

    with RedisNodes(3) as nodes:
        results = asyncio.run(measure(nodes.urls, args.rounds, args.cycles))
    print(f"uncontended acquire+release on N=3, {args.cycles} cycles x {args.rounds} rounds;"
          f" loadavg {loadavg_text()}")
    previous = None
    for name, values in results.items():
        med = statistics.median(values)
        step = "" if previous is None else f"  step {med - previous:+.0f} us"
        print(f"  {name:17s} p50 {med:5.0f} us [{min(values):.0f}-{max(values):.0f}]{step}")
        previous = med
    return 0


if __name__ == "__main__":
    sys.exit(main())
