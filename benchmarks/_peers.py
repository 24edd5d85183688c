"""The peers: one adapter per library measured, all behind the same three calls.

A peer is ``make(resource)`` -> handle, ``acquire(handle)`` -> context (blocking until
held) and ``release(handle, context)``; its kind says how the measuring loops of
benchmarks/_measure.py run it: in this thread (sync), on the benchmark's event loop
(async), or in a subprocess (redlock-py and redlock-ng, whose module name clashes with
ours: benchmarks/_clashing.py). ``attempt(handle)``, where given, is *one* call of the
library's own acquire with its defaults, raising when it fails (network.py's success
rates); by default it is ``acquire``.

Every peer runs with its library's default retry/back-off settings and the same TTL.
A library that cannot be imported is skipped, with the reason, not failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _clashing
import _measure
from _floors import AsyncFloor, SyncFloor

HERE = Path(__file__).resolve().parent
TTL_S = 10.0


# -- the three kinds of peer ----------------------------------------------------------------


@dataclass(kw_only=True)
class Peer:
    """A library run in this thread."""

    key: str
    label: str
    nodes: int
    make: Callable[[str], Any] = field(repr=False, default=lambda r: r)
    acquire: Callable[[Any], Any] = field(repr=False, default=lambda h: None)
    release: Callable[[Any, Any], Any] = field(repr=False, default=lambda h, c: None)
    attempt: Callable[[Any], Any] | None = field(repr=False, default=None)
    handle_memory: bool = True  # does make() build a real per-lock object?
    reference: bool = False  # not a lock library: a floor for comparison
    kind = "sync"

    def uncontended(self, resource: str, *, cycles: int, warmup: int) -> dict[str, float]:
        return _measure.uncontended(self.make, self.acquire, self.release, resource,
                                    cycles=cycles, warmup=warmup)

    def contended(self, resource: str, *, workers: int, total: int,
                  deadline_s: float) -> dict[str, Any]:
        return _measure.contended(self.make, self.acquire, self.release, resource,
                                  workers=workers, total=total, deadline_s=deadline_s)

    def cycle_memory(self, prefix: str, *, cycles: int) -> dict[str, float]:
        return _measure.cycle_memory(self.make, self.acquire, self.release, cycles=cycles,
                                     prefix=prefix)

    def attempts(self, resource: str, limits: dict[str, Any]) -> dict[str, Any]:
        """_measure.attempts in a thread: a call stuck longer than ``hang_s`` (a library
        with no socket timeout, against a node that never answers) is given up on, and
        the thread is left behind, blocked (it is a daemon)."""
        tally = _measure.Tally()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = _measure.attempts(
                    self.make, self.attempt or self.acquire, self.release, resource,
                    tally=tally, **limits)
            except Exception as exc:  # make() itself failed
                box["result"] = {"error": f"{type(exc).__name__}: {exc}"}

        worker = threading.Thread(target=run, name=f"bench-{self.key}", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if worker.is_alive() and time.monotonic() - tally.cycle_started > limits["hang_s"]:
                tally.stopped = "hung"
                stuck_ns = int((time.monotonic() - tally.cycle_started) * 1e9)
                tally.fail(f"hung: no answer in {limits['hang_s']:g} s (thread left behind)",
                           stuck_ns)
                tally.ended = time.perf_counter_ns()
                return tally.result()
        result: dict[str, Any] = box["result"]
        return result


@dataclass(kw_only=True)
class AsyncPeer(Peer):
    """A library run on the benchmark's event loop (acquire/release are coroutines)."""

    loop: asyncio.AbstractEventLoop = field(repr=False)
    kind = "async"

    def uncontended(self, resource: str, *, cycles: int, warmup: int) -> dict[str, float]:
        return self.loop.run_until_complete(_measure.uncontended_async(
            self.make, self.acquire, self.release, resource, cycles=cycles, warmup=warmup))

    def contended(self, resource: str, *, workers: int, total: int,
                  deadline_s: float) -> dict[str, Any]:
        return self.loop.run_until_complete(_measure.contended_async(
            self.make, self.acquire, self.release, resource, workers=workers, total=total,
            deadline_s=deadline_s))

    def cycle_memory(self, prefix: str, *, cycles: int) -> dict[str, float]:
        return self.loop.run_until_complete(_measure.cycle_memory_async(
            self.make, self.acquire, self.release, cycles=cycles, prefix=prefix))

    def attempts(self, resource: str, limits: dict[str, Any]) -> dict[str, Any]:
        return self.loop.run_until_complete(_measure.attempts_async(
            self.make, self.attempt or self.acquire, self.release, resource, **limits))


@dataclass(kw_only=True)
class SubprocessPeer(Peer):
    """redlock-py or redlock-ng, run by benchmarks/_subprocess_worker.py with the same
    loops, from the library's own ``--target`` directory (benchmarks/_clashing.py)."""

    library: str
    target: Path
    urls: list[str]
    asynchronous: bool = False
    handle_memory: bool = False
    kind = "subprocess"

    def _run(self, mode: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, str(HERE / "_subprocess_worker.py"), mode,
             json.dumps({"library": self.library, "async": self.asynchronous,
                         "urls": self.urls, **options})],
            capture_output=True, text=True, env=_clashing.subprocess_env(self.target),
            cwd=str(HERE), check=False, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{self.library} worker failed: {done.stderr.strip()[-500:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["result"]
        return result

    def uncontended(self, resource: str, *, cycles: int, warmup: int) -> dict[str, float]:
        return self._run("uncontended", {"resource": resource, "cycles": cycles,
                                         "warmup": warmup}, timeout=180)

    def contended(self, resource: str, *, workers: int, total: int,
                  deadline_s: float) -> dict[str, Any]:
        return self._run("contended", {"resource": resource, "workers": workers,
                                       "total": total, "deadline_s": deadline_s},
                         timeout=deadline_s + 60)

    def cycle_memory(self, prefix: str, *, cycles: int) -> dict[str, float]:
        return self._run("memory", {"resource": prefix, "cycles": cycles}, timeout=180)

    def attempts(self, resource: str, limits: dict[str, Any]) -> dict[str, Any]:
        """A subprocess stuck past its budget (a library with no socket timeout, against
        a node that never answers) is killed: everything it measured is lost."""
        limit = limits["budget_s"] + limits["hang_s"] * (limits["max_failures"] + 1) + 10
        try:
            return self._run("attempts", {"resource": resource, "limits": limits},
                             timeout=limit)
        except subprocess.TimeoutExpired:
            return {**_measure.Tally().result(), "stopped": "hung",
                    "errors": [(f"hung: the worker was killed after {limit:g} s", 1)]}


def checked(acquire: Callable[[Any], Any], who: str) -> Callable[[Any], None]:
    """A blocking acquire that returned False is a failed measurement, not a result."""
    def call(handle: Any) -> None:
        if not acquire(handle):
            raise RuntimeError(f"{who} blocking acquire returned False")
    return call


class Peers:
    """The peers of one run, the event loop of the async ones, and what to close."""

    def __init__(self, new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
                 ) -> None:
        self.loop = new_loop()
        self.all: list[Peer] = []
        self.skipped: dict[str, str] = {}
        self.closers: list[Callable[[], Any]] = []

    def add(self, name: str, adapter: Callable[[], Peer]) -> None:
        """Add a third-party peer, or note why it is not measured."""
        try:
            self.all.append(adapter())
        except Exception as exc:  # an uninstalled or broken peer library: say so, go on
            self.skipped[name] = f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        for closer in reversed(self.closers):
            with contextlib.suppress(Exception):
                closer()
        self.loop.run_until_complete(asyncio.sleep(0.05))  # let transports close
        self.loop.close()


# -- the adapters, one per library ----------------------------------------------------------


def ours_sync(peers: Peers, urls: list[str], key: str, label: str) -> Peer:
    from redlock import Redlock

    dlm = Redlock(urls)
    peers.closers.append(dlm.close)
    return Peer(key=key, label=label, nodes=len(urls),
                make=lambda r: dlm.lock(r, ttl=TTL_S), acquire=checked(
                    lambda h: h.acquire(), "redlock-fenced"),
                release=lambda h, _c: h.release())


def ours_async(peers: Peers, urls: list[str]) -> Peer:
    from redlock import AsyncRedlock

    async def make_manager() -> AsyncRedlock:  # its pools belong to the benchmark's loop
        return AsyncRedlock(urls)

    dlm = peers.loop.run_until_complete(make_manager())
    peers.closers.append(lambda: peers.loop.run_until_complete(dlm.close()))

    async def acquire(handle: Any) -> None:
        if not await handle.acquire():
            raise RuntimeError("redlock-fenced blocking acquire returned False")

    async def release(handle: Any, _ctx: Any) -> None:
        await handle.release()

    return AsyncPeer(key="ours_async", label="ours asyncio", nodes=len(urls),
                     make=lambda r: dlm.lock(r, ttl=TTL_S), acquire=acquire, release=release,
                     loop=peers.loop)


def pottery(peers: Peers, urls: list[str]) -> Peer:
    """Redlock over N masters. A handle is single-owner (its uuid lives on the
    instance), so every worker gets its own; acquire() waits with random sleeps."""
    import redis
    from pottery import Redlock as PotteryRedlock

    masters = {redis.Redis.from_url(u) for u in urls}
    peers.closers += [m.close for m in masters]
    return Peer(key="pottery", label="pottery.Redlock", nodes=len(urls),
                make=lambda r: PotteryRedlock(key=r, masters=masters, auto_release_time=TTL_S),
                acquire=checked(lambda h: h.acquire(), "pottery"),
                release=lambda h, _c: h.release())


def aioredlock(peers: Peers, urls: list[str]) -> Peer:
    """No handle object; lock() returns a Lock or raises LockError after retry_count (3)
    attempts 0.1-0.3 s apart, so a blocking caller loops."""
    from aioredlock import Aioredlock, LockError

    async def make_manager() -> Any:
        manager = Aioredlock(list(urls))
        probe = await manager.lock("bench:aioredlock:probe", lock_timeout=TTL_S)
        await manager.unlock(probe)
        return manager

    manager = peers.loop.run_until_complete(make_manager())
    peers.closers.append(lambda: peers.loop.run_until_complete(manager.destroy()))

    async def acquire(resource: str) -> Any:
        while True:
            try:
                return await manager.lock(resource, lock_timeout=TTL_S)
            except LockError:
                continue

    async def attempt(resource: str) -> Any:
        return await manager.lock(resource, lock_timeout=TTL_S)

    async def release(_resource: str, held: Any) -> None:
        await manager.unlock(held)

    return AsyncPeer(key="aioredlock", label="aioredlock", nodes=len(urls), acquire=acquire,
                     release=release, attempt=attempt, handle_memory=False, loop=peers.loop)


def clashing(name: str, urls: list[str], target: Path, install: bool, *,
             asynchronous: bool = False) -> Peer:
    """redlock-py or redlock-ng, from its own ``pip install --target`` directory."""
    _clashing.ensure_installed(name, target, install)
    version = _clashing.LIBRARIES[name].version
    key = name.replace("-", "_") + ("_async" if asynchronous else "")
    label = f"{name} {version}{' asyncio' if asynchronous else ''} (subproc)"
    return SubprocessPeer(key=key, label=label, nodes=len(urls), library=name, target=target,
                          urls=urls, asynchronous=asynchronous)


def redis_py_lock(single: Any) -> Peer:
    import redis.lock

    return Peer(key="redispy", label="redis-py redis.lock.Lock", nodes=1,
                make=lambda r: redis.lock.Lock(single, r, timeout=TTL_S),
                acquire=checked(lambda h: h.acquire(), "redis-py Lock"),
                release=lambda h, _c: h.release())


def redis_py_lock_async(peers: Peers, url: str) -> Peer:
    """redis-py's asyncio ``Lock`` on one node: the asyncio client's N=1 reference."""
    import redis.asyncio
    import redis.asyncio.lock

    async def make_client() -> Any:  # its pool belongs to the benchmark's loop
        return redis.asyncio.Redis.from_url(url)

    client = peers.loop.run_until_complete(make_client())
    peers.closers.append(lambda: peers.loop.run_until_complete(client.aclose()))

    async def acquire(handle: Any) -> None:
        if not await handle.acquire():
            raise RuntimeError("redis-py asyncio Lock: a blocking acquire returned False")

    async def release(handle: Any, _ctx: Any) -> None:
        await handle.release()

    return AsyncPeer(key="redispy_async", label="redis-py redis.asyncio.lock.Lock", nodes=1,
                     make=lambda r: redis.asyncio.lock.Lock(client, r, timeout=TTL_S),
                     acquire=acquire, release=release, loop=peers.loop)


def python_redis_lock(single: Any) -> Peer:
    import redis_lock

    return Peer(key="prl", label="python-redis-lock", nodes=1,
                make=lambda r: redis_lock.Lock(single, r, expire=int(TTL_S)),
                acquire=checked(lambda h: h.acquire(), "python-redis-lock"),
                release=lambda h, _c: h.release())


def raw_floor(peers: Peers, urls: list[str]) -> Peer:
    floor = SyncFloor(urls, node_timeout=1.0, ttl_s=TTL_S)
    peers.closers.append(floor.close)
    return Peer(key="floor", label="(ref) raw 2x scatter/gather", nodes=len(urls),
                acquire=floor.acquire, release=floor.release, handle_memory=False,
                reference=True)


def raw_floor_async(peers: Peers, urls: list[str]) -> Peer:
    """No per-call timeout layer: the bare gather."""
    floor = AsyncFloor(urls, node_timeout=1.0, ttl_s=TTL_S)
    peers.loop.run_until_complete(floor.prepare())
    peers.closers.append(lambda: peers.loop.run_until_complete(floor.close()))
    acquire, release = floor.calls()
    return AsyncPeer(key="floor_async", label="(ref) raw asyncio 2x gather",
                     nodes=len(urls), acquire=acquire, release=release,
                     handle_memory=False, reference=True, loop=peers.loop)


def clashing_options(parser: argparse.ArgumentParser) -> None:
    """--install-redlock-py / --redlock-py-dir, and the same for redlock-ng."""
    for name, library in _clashing.LIBRARIES.items():
        parser.add_argument(f"--{name}-dir", default=str(library.default_dir),
                            help=f"where {name} is installed (its own --target dir)")
        parser.add_argument(library.option, action="store_true",
                            help=f"pip install {name}=={library.version} into --{name}-dir"
                                 " if it is not there (needs PyPI)")


def add_clashing(peers: Peers, urls: list[str], args: argparse.Namespace, *,
                 asynchronous_too: bool = False) -> None:
    """redlock-py and redlock-ng (and redlock-ng's asyncio client), each skipped with
    the reason when its directory is not there."""
    for name in _clashing.LIBRARIES:
        target = Path(getattr(args, f"{name.replace('-', '_')}_dir"))
        install = getattr(args, f"install_{name.replace('-', '_')}")
        peers.add(name, lambda n=name, t=target, i=install: clashing(n, urls, t, i))
        if asynchronous_too and name == "redlock-ng":
            peers.add(f"{name} asyncio", lambda n=name, t=target: clashing(
                n, urls, t, False, asynchronous=True))


def add_redlocks(peers: Peers, urls: list[str], args: argparse.Namespace) -> None:
    """The peers that take N nodes: ours (sync first: the baseline), the Redlock peers,
    the two floors."""
    peers.all.append(ours_sync(peers, urls, "ours", "ours sync"))
    peers.all.append(ours_async(peers, urls))
    peers.add("pottery", lambda: pottery(peers, urls))
    peers.add("aioredlock", lambda: aioredlock(peers, urls))
    add_clashing(peers, urls, args, asynchronous_too=True)
    peers.all.append(raw_floor(peers, urls))
    peers.all.append(raw_floor_async(peers, urls))


def add_all(peers: Peers, urls3: list[str], urls1: list[str],
            args: argparse.Namespace) -> None:
    """Every peer, in the order of the report: Redlock on N=3 first, then the
    single-node locks (with ours on N=1 as their baseline), then the floors."""
    import redis

    peers.all.append(ours_sync(peers, urls3, "ours", "ours sync"))  # the baseline
    peers.all.append(ours_async(peers, urls3))
    peers.add("pottery", lambda: pottery(peers, urls3))
    peers.add("aioredlock", lambda: aioredlock(peers, urls3))
    add_clashing(peers, urls3, args)
    peers.all.append(ours_sync(peers, urls1, "ours_n1", "ours sync N=1"))  # N=1 baseline
    single = redis.Redis.from_url(urls1[0])
    peers.closers.append(single.close)
    peers.all.append(redis_py_lock(single))
    peers.add("python-redis-lock", lambda: python_redis_lock(single))
    peers.all.append(raw_floor(peers, urls3))
    peers.all.append(raw_floor_async(peers, urls3))
