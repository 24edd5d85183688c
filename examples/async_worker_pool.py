"""Async worker pool: jobs longer than the lock's TTL kept by auto_extend, even through a
frozen event loop; a lock taken away mid-build: on_lost stops the job, and the fenced
store would refuse its write.

    python -m examples.async_worker_pool      # starts its own local redis-server nodes
    python examples/async_worker_pool.py --ttl 1.0 --build 1.5

Each job rebuilds one account's report. A worker task takes the lock
``report:<account>`` with ``auto_extend=True`` (a build outlasts the TTL; the manager's
renewal thread renews the lock at about ttl/3) and ``on_lost`` (called when renewing
fails: it cancels the build). Under the lock it raises the report record's fence to its
token and reads it: a record means the report is built already; otherwise it builds the
report and writes it with its token.

The demo runs two application instances, each an event loop with a pool of worker
tasks (threads here; processes or machines in production), and gives both every job
(an at-least-once queue delivering twice).

* Round 1: builds take longer than the TTL, yet every report is built once: the lock
  stays held while the build runs, and the instance that waited finds the report built.
* Round 2: a build makes a blocking call (a synchronous client in async code) that
  freezes its instance's event loop for twice the TTL. The lock is renewed from a
  thread, not from the loop, so it is kept and the other instance goes on waiting.
  Then the lock is taken away while the build runs (an operator's force-release here;
  in production a network partition or a process pause longer than the TTL). The
  other instance takes the lock, raises the fence and builds; the first one's renewal
  finds its key gone and on_lost cancels the stale build (had it got as far as
  writing, the fence would have refused it).

It exits non-zero unless every report was written exactly once, by the instance that
built it, and the stale build wrote nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fencing import AsyncRedisFencedStore, StaleTokenError
from redlock import AsyncLock, AsyncRedlock, LockLost
from redlock.admin import AsyncAdmin

if __package__:
    from examples import _common as common
else:  # python examples/async_worker_pool.py
    import _common as common  # type: ignore[no-redef, import-not-found]

# -- The part to copy -----------------------------------------------------------------------
# One lock manager and one fenced store per event loop, shared by its tasks:
#     dlm = AsyncRedlock(["redis://h1:6379", "redis://h2:6379", "redis://h3:6379"])
#     store = AsyncRedisFencedStore(redis.asyncio.Redis.from_url("redis://data:6379"))

Build = Callable[[str], Coroutine[Any, Any, bytes]]


async def build_once(dlm: AsyncRedlock, store: AsyncRedisFencedStore, account: str,
                     build: Build, ttl: float) -> str:
    """Build ``account``'s report unless it is built already; say what happened."""
    resource = f"report:{account}"
    work: asyncio.Task[bytes] | None = None

    def stop_work(_lock: AsyncLock) -> None:  # on_lost: runs in the lock's watchdog task
        if work is not None:
            work.cancel()

    outcome = "built"
    try:
        async with dlm.lock(resource, ttl=ttl, timeout=60.0, auto_extend=True,
                            on_lost=stop_work) as held:
            token = held.token
            if await store.fence(resource, token) is not None:  # raise the fence, then read
                return "skipped: already built"
            work = asyncio.create_task(build(account))
            try:
                report = await work
            except asyncio.CancelledError:
                if not held.lost:
                    raise  # this task itself is being cancelled
                outcome = "stopped by on_lost: the lock was lost"
            else:
                try:
                    await store.write(resource, token, report)
                except StaleTokenError:
                    outcome = "refused by the store: a newer holder took over"
    except LockLost:  # leaving the block says so too; on_lost already stopped the build
        if outcome == "built":
            outcome = "lost after the write"
    return outcome


async def worker_pool(dlm: AsyncRedlock, store: AsyncRedisFencedStore, accounts: list[str],
                      build: Build, ttl: float, workers: int) -> dict[str, str]:
    """``workers`` tasks taking jobs from one queue; each job's outcome."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for account in accounts:
        queue.put_nowait(account)
    outcomes: dict[str, str] = {}

    async def worker() -> None:
        while not queue.empty():
            account = queue.get_nowait()
            outcomes[account] = await build_once(dlm, store, account, build, ttl)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return outcomes


# -- The demo around it (the harness is in examples/_common.py) -----------------------------

INSTANCES = ("instance-A", "instance-B")
ROUND_1 = ["northwind", "initech", "globex"]
ROUND_2 = ["acme"]  # its first build freezes its event loop, then loses its lock


class Stall:
    """Round 2's incidents, in the first build of the account: its event loop frozen by
    a blocking call, then its lock taken away until the other instance builds."""

    def __init__(self, lock_urls: list[str], ttl: float) -> None:
        self.lock_urls = lock_urls
        self.freeze = 2 * ttl
        self.rival_building = threading.Event()
        self.stalled: str | None = None
        self._mutex = threading.Lock()

    def first(self, instance: str) -> bool:
        with self._mutex:
            if self.stalled is None:
                self.stalled = instance
                return True
            return False

    async def take_lock_away(self, resource: str) -> None:
        """What an operator's ``redlock release --force`` does (docs/operations.md)."""
        async with AsyncRedlock(self.lock_urls) as dlm:
            await AsyncAdmin(dlm).force_release(resource)

    async def rival_has_taken_over(self) -> None:
        while not self.rival_building.is_set():  # the loop stays free meanwhile
            await asyncio.sleep(0.01)


def builder(instance: str, seconds: float, stall: Stall | None, clock: common.Clock) -> Build:
    """The demo's report build: ``seconds`` of awaited work in ten steps."""
    async def build(account: str) -> bytes:
        stalls = stall is not None and stall.first(instance)
        if stall is not None and not stalls:
            print(f"{clock()}  {instance} took the lock over and builds {account}'s report")
            stall.rival_building.set()
        for step in range(10):
            if stalls and step == 2:
                assert stall is not None
                print(f"{clock()}  {instance} makes a blocking call while building "
                      f"{account}'s report: its event loop freezes for {stall.freeze:.1f} s")
                time.sleep(stall.freeze)  # blocking on purpose: the whole loop stops
                print(f"{clock()}  {instance}'s event loop runs again: its lock was renewed"
                      " meanwhile, the other instance still waits")
            if stalls and step == 4:
                assert stall is not None
                print(f"{clock()}  the lock report:{account} is taken away while "
                      f"{instance} builds (an operator's force-release)")
                await stall.take_lock_away(f"report:{account}")
                await stall.rival_has_taken_over()
            await asyncio.sleep(seconds / 10)
        return json.dumps({"account": account, "by": instance}).encode()
    return build


async def instance(name: str, lock_urls: list[str], store_url: str, accounts: list[str],
                   build: Build, ttl: float) -> dict[str, str]:
    async with common.async_clients(lock_urls, store_url) as (dlm, store):
        return await worker_pool(dlm, store, accounts, build, ttl, workers=len(accounts))


def play(lock_urls: list[str], store_url: str, accounts: list[str], ttl: float,
         seconds: float, stall: Stall | None, clock: common.Clock
         ) -> dict[str, dict[str, str]]:
    """Both instances on every job; per instance, each job's outcome."""
    def start(name: str) -> Callable[[], Coroutine[Any, Any, dict[str, str]]]:
        return lambda: instance(name, lock_urls, store_url, accounts,
                                builder(name, seconds, stall, clock), ttl)

    outcomes = {}
    for name, result in zip(INSTANCES, common.event_loops([start(n) for n in INSTANCES]),
                            strict=True):
        if isinstance(result, Exception):
            raise result
        outcomes[name] = result
    return outcomes


def report(outcomes: dict[str, dict[str, str]], records: dict[str, bytes | None]) -> bool:
    """Print each job's outcome; True if its report was written once, by its builder."""
    ok = True
    for account, record in records.items():
        stored = json.loads(record) if record else None
        built = [name for name in INSTANCES if outcomes[name][account] == "built"]
        others = "; ".join(f"{name}: {outcomes[name][account]}" for name in INSTANCES
                           if name not in built)
        print(f"  {account}: built by {', '.join(built) or 'nobody'} ({others}); "
              f"stored report by {stored['by'] if stored else None}")
        ok = ok and len(built) == 1 and stored is not None and stored["by"] == built[0]
    return ok


def skipped_by_the_other(outcomes: dict[str, dict[str, str]]) -> bool:
    """No job was taken over mid-build: whoever did not build it found it built."""
    return all(outcome in ("built", "skipped: already built")
               for by_job in outcomes.values() for outcome in by_job.values())


def run(args: argparse.Namespace, lock_urls: list[str], store_url: str) -> int:
    ttl, seconds, clock = args.ttl, args.build, common.Clock()
    resources = [f"report:{account}" for account in ROUND_1 + ROUND_2]
    with common.fenced_store(store_url) as store:
        store.client.delete(*(store.key(r) for r in resources))
        print(f"round 1: {len(ROUND_1)} report jobs, each given to both {' and '.join(INSTANCES)};"
              f" a build takes {seconds:.1f} s, the lock's TTL is {ttl:.1f} s (auto_extend)")
        outcomes = play(lock_urls, store_url, ROUND_1, ttl, seconds, None, clock)
        ok = report(outcomes, {a: store.read(f"report:{a}") for a in ROUND_1})
        kept = skipped_by_the_other(outcomes)
        print("  every build outlasted the TTL, and auto_extend kept its lock: no instance "
              "took a job over mid-build" if kept else "  a job was taken over mid-build")
        ok = ok and kept

        print(f"round 2: one report job ({ROUND_2[0]}), given to both instances")
        stall = Stall(lock_urls, ttl)
        outcomes = play(lock_urls, store_url, ROUND_2, ttl, seconds, stall, clock)
        ok = report(outcomes, {a: store.read(f"report:{a}") for a in ROUND_2}) and ok
    stalled = outcomes[stall.stalled][ROUND_2[0]] if stall.stalled else "no incident happened"
    print(f"the stale build in {stall.stalled}: {stalled}")
    ok = ok and stalled.startswith(("stopped by on_lost", "refused by the store"))
    return common.verdict(ok, "every report written exactly once by the instance that built "
                              "it; the stale build wrote nothing")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttl", type=float, default=1.0, help="lock TTL in seconds (default 1)")
    p.add_argument("--build", type=float, default=1.5,
                   help="seconds a report build takes (default 1.5; more than the TTL)")


if __name__ == "__main__":
    sys.exit(common.main(__doc__, run, options=options))
