"""Many locks held at once with automatic renewal: threads and memory (network.py).

Each library runs in a fresh process (``python _held.py child JSON``), so its thread
count and RSS start from a bare interpreter with the library imported, a manager made
and one lock taken and released (connections open). Then it acquires COUNT locks on
distinct resources with auto-renewal, holds them HOLD seconds (longer than the TTL, so
every lock lives only through renewals), checks on one node that every lock key is
still there, and releases them.

Measured: threads (``threading.active_count()`` and the kernel's count from
/proc/self/status), asyncio tasks, RSS (VmRSS) and tracemalloc's traced memory, at the
base, with the locks held, and at the end of the hold (the most threads seen while
holding too); the commands one node ran during the hold (``INFO commandstats``), per
lock per second: the renewal traffic; and the client connections that node had.

* ours sync / asyncio: ``lock(resource, ttl, auto_extend=True)``: the manager's one
  renewal loop (a thread, or a task), renewals due together pipelined per node.
* python-redis-lock: ``Lock(conn, name, expire, auto_renewal=True)``: a renewal thread
  per lock (single node). Its threads share the client's pool, which redis-py 8 caps at
  100 connections by default (MaxConnectionsError beyond): measured as it comes, and
  with ``max_connections`` raised to COUNT + 10.
* aioredlock: ``lock(resource)`` without a ``lock_timeout``: a watchdog task per lock
  extending it every 0.6 x ``internal_lock_timeout``.

pottery, redlock-py and redlock-ng have no automatic renewal.
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LIBRARIES = [("ours", "ours sync"), ("ours_async", "ours asyncio"),
             ("prl", "python-redis-lock (N=1)"),
             ("prl_pool", "python-redis-lock (N=1, max_connections raised)"),
             ("aioredlock", "aioredlock")]


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def snapshot() -> dict[str, float]:
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop
        tasks = 0
    return {"threads": threading.active_count(), "os_threads": _status("Threads"),
            "tasks": tasks, "rss_kib": _status("VmRSS"),
            "traced_kib": tracemalloc.get_traced_memory()[0] / 1024}


def _node_commands(node: Any) -> int:
    return sum(int(s["calls"]) for name, s in node.info("commandstats").items()
               if name != "cmdstat_info")


class Holder:
    """The common steps; ``take`` acquires one lock and returns what release needs."""

    def __init__(self, options: dict[str, Any], key_of: Any) -> None:
        import redis

        self.options = options
        self.key_of = key_of
        self.node = redis.Redis.from_url(options["check_url"], socket_timeout=10)
        self.out: dict[str, Any] = {}
        self.lost = 0

    def begin(self) -> None:
        tracemalloc.start()
        self.out["base"] = snapshot()
        self.started = time.perf_counter()

    def held(self) -> None:
        self.out["acquire_s"] = time.perf_counter() - self.started
        self.out["held"] = snapshot()
        self.commands = _node_commands(self.node)
        self.hold_started = time.monotonic()
        self.most_threads = self.out["held"]["os_threads"]

    def sample(self) -> bool:
        """One look while holding; False once the hold is over."""
        self.most_threads = max(self.most_threads, _status("Threads"))
        return time.monotonic() - self.hold_started < self.options["hold_s"]

    def end(self) -> None:
        self.out["end"] = snapshot()
        self.out["most_os_threads"] = self.most_threads
        hold = time.monotonic() - self.hold_started
        count = self.options["count"]
        self.out["node_commands_per_lock_s"] = (
            (_node_commands(self.node) - self.commands) / count / hold)
        self.out["hold_s"] = hold
        clients = self.node.info("clients")
        self.out["node_clients"] = int(clients["connected_clients"])
        with self.node.pipeline(transaction=False) as pipe:
            for i in range(count):
                pipe.exists(self.key_of(f"bench:held:{i}"))
            self.out["keys_alive"] = sum(pipe.execute())
        self.out["lost"] = self.lost
        tracemalloc.stop()


def hold_ours_sync(options: dict[str, Any]) -> dict[str, Any]:
    from redlock import Redlock

    holder = Holder(options, lambda r: f"redlock:{{{r}}}:lock")
    with Redlock(options["urls"]) as dlm:
        warm = dlm.lock("bench:held:warm")
        warm.acquire()
        warm.release()
        holder.begin()
        handles = []
        for i in range(options["count"]):
            handle = dlm.lock(f"bench:held:{i}", ttl=options["ttl_s"], auto_extend=True,
                              on_lost=lambda _h: setattr(holder, "lost", holder.lost + 1))
            if not handle.acquire():
                raise RuntimeError("acquire returned False")
            handles.append(handle)
        holder.held()
        while holder.sample():
            time.sleep(0.2)
        holder.end()
        for handle in handles:
            handle.release()
    return holder.out


async def hold_ours_async(options: dict[str, Any]) -> dict[str, Any]:
    from redlock import AsyncRedlock

    holder = Holder(options, lambda r: f"redlock:{{{r}}}:lock")
    async with AsyncRedlock(options["urls"]) as dlm:
        warm = dlm.lock("bench:held:warm")
        await warm.acquire()
        await warm.release()
        holder.begin()
        handles = []
        for i in range(options["count"]):
            handle = dlm.lock(f"bench:held:{i}", ttl=options["ttl_s"], auto_extend=True,
                              on_lost=lambda _h: setattr(holder, "lost", holder.lost + 1))
            if not await handle.acquire():
                raise RuntimeError("acquire returned False")
            handles.append(handle)
        holder.held()
        while holder.sample():
            await asyncio.sleep(0.2)
        holder.end()
        for handle in handles:
            await handle.release()
    return holder.out


def hold_prl(options: dict[str, Any], max_connections: int | None) -> dict[str, Any]:
    import redis
    import redis_lock

    holder = Holder(options, lambda r: f"lock:{r}")
    conn = redis.Redis.from_url(options["urls"][0], max_connections=max_connections)
    warm = redis_lock.Lock(conn, "bench:held:warm", expire=10)
    warm.acquire()
    warm.release()
    holder.begin()
    locks = []
    for i in range(options["count"]):
        lock = redis_lock.Lock(conn, f"bench:held:{i}", expire=round(options["ttl_s"]),
                               auto_renewal=True)
        if not lock.acquire():
            raise RuntimeError("acquire returned False")
        locks.append(lock)
    holder.held()
    while holder.sample():
        time.sleep(0.2)
    holder.end()
    failed = 0
    for lock in locks:
        try:
            lock.release()
        except redis_lock.NotAcquired:  # its renewals failed: the lock expired
            failed += 1
    holder.out["lost"] = failed
    conn.close()
    return holder.out


async def hold_aioredlock(options: dict[str, Any]) -> dict[str, Any]:
    from aioredlock import Aioredlock

    holder = Holder(options, lambda r: r)
    manager = Aioredlock(list(options["urls"]), internal_lock_timeout=options["ttl_s"])
    warm = await manager.lock("bench:held:warm", lock_timeout=10)
    await manager.unlock(warm)
    holder.begin()
    locks = [await manager.lock(f"bench:held:{i}") for i in range(options["count"])]
    holder.held()
    while holder.sample():
        await asyncio.sleep(0.2)
    holder.end()
    for lock in locks:
        await manager.unlock(lock)
    await manager.destroy()
    return holder.out


def child(options: dict[str, Any]) -> None:
    import logging
    import threading
    import warnings

    logging.basicConfig(level=logging.WARNING)
    failures: collections.Counter[str] = collections.Counter()

    def renewal_failed(hook: Any) -> None:  # python-redis-lock's renewal threads die
        failures[hook.exc_type.__name__] += 1

    threading.excepthook = renewal_failed
    warnings.simplefilter("ignore", DeprecationWarning)  # aioredlock's distutils import
    library = options["library"]
    if library == "ours":
        out = hold_ours_sync(options)
    elif library == "ours_async":
        out = asyncio.run(hold_ours_async(options))
    elif library == "prl":
        out = hold_prl(options, None)
    elif library == "prl_pool":
        out = hold_prl(options, options["count"] + 10)
    else:
        out = asyncio.run(hold_aioredlock(options))
    out["thread_failures"] = failures.most_common(3)
    print(json.dumps(out), flush=True)


def run_section(urls: list[str], args: Any, monitor: Any, loads: Any) -> dict[str, Any]:
    import _netreport
    from _sections import section

    results: dict[str, Any] = {}
    title = (f"{args.held} locks held at once with automatic renewal, TTL {args.held_ttl:g} s,"
             f" held {args.hold_s:g} s; N={len(urls)} loopback (python-redis-lock: N=1)")
    with section(title, monitor, loads):
        for key, _label in LIBRARIES:
            if args.peers and key.removesuffix("_pool") not in args.peers \
                    and not key.startswith("ours"):
                continue
            node_urls = urls[:1] if key.startswith("prl") else urls
            options = {"library": key, "urls": node_urls, "check_url": urls[0],
                       "count": args.held, "ttl_s": args.held_ttl, "hold_s": args.hold_s}
            try:
                done = subprocess.run(
                    [sys.executable, str(HERE / "_held.py"), "child", json.dumps(options)],
                    capture_output=True, text=True, cwd=str(HERE), check=False,
                    timeout=args.hold_s + 180)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr.strip().splitlines()[-1][-300:])
                results[key] = json.loads(done.stdout.strip().splitlines()[-1])
            except Exception as exc:
                results[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            print(f"   {key} done", flush=True)
        print(_netreport.held_table(results, dict(LIBRARIES), args))
    return {"results": results, "labels": dict(LIBRARIES)}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "child":
    child(json.loads(sys.argv[2]))
