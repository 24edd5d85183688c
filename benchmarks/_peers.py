"""The peers: one adapter per library measured, all behind the same three calls.

A peer is ``make(resource)`` -> handle, ``acquire(handle)`` -> context (blocking until
held) and ``release(handle, context)``; its kind says how the measuring loops of
benchmarks/_measure.py run it: in this thread (sync), on the benchmark's event loop
(async), or in a subprocess (redlock-py, whose module name clashes with ours).

Every peer runs with its library's default retry/back-off settings and the same TTL.
A library that cannot be imported is skipped, with the reason, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _measure
from _floors import AsyncFloor, SyncFloor

HERE = Path(__file__).resolve().parent
TTL_S = 10.0
REDLOCK_PY_VERSION = "1.0.8"
DEFAULT_REDLOCK_PY_DIR = Path(
    os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "redlock-bench" / "redlock-py"


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


@dataclass(kw_only=True)
class SubprocessPeer(Peer):
    """redlock-py, run by benchmarks/_redlock_py_worker.py with the same loops."""

    target: Path
    urls: list[str]
    handle_memory: bool = False
    kind = "subprocess"

    def _run(self, mode: str, options: dict[str, Any]) -> dict[str, Any]:
        env = {**os.environ, "PYTHONPATH": str(self.target), "REDLOCK_PY_DIR": str(self.target)}
        done = subprocess.run(
            [sys.executable, str(HERE / "_redlock_py_worker.py"), mode,
             json.dumps({"urls": self.urls, **options})],
            capture_output=True, text=True, env=env, cwd=str(HERE), check=False,
            timeout=options.get("deadline_s", 120) + 60)
        if done.returncode != 0:
            raise RuntimeError(f"redlock-py worker failed: {done.stderr.strip()[-500:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["result"]
        return result

    def uncontended(self, resource: str, *, cycles: int, warmup: int) -> dict[str, float]:
        return self._run("uncontended", {"resource": resource, "cycles": cycles,
                                         "warmup": warmup})

    def contended(self, resource: str, *, workers: int, total: int,
                  deadline_s: float) -> dict[str, Any]:
        return self._run("contended", {"resource": resource, "workers": workers,
                                       "total": total, "deadline_s": deadline_s})

    def cycle_memory(self, prefix: str, *, cycles: int) -> dict[str, float]:
        return self._run("memory", {"resource": prefix, "cycles": cycles})


def checked(acquire: Callable[[Any], Any], who: str) -> Callable[[Any], None]:
    """A blocking acquire that returned False is a failed measurement, not a result."""
    def call(handle: Any) -> None:
        if not acquire(handle):
            raise RuntimeError(f"{who} blocking acquire returned False")
    return call


class Peers:
    """The peers of one run, the event loop of the async ones, and what to close."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
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

    async def release(_resource: str, held: Any) -> None:
        await manager.unlock(held)

    return AsyncPeer(key="aioredlock", label="aioredlock", nodes=len(urls), acquire=acquire,
                     release=release, handle_memory=False, loop=peers.loop)


def redlock_py(urls: list[str], target: Path, install: bool) -> Peer:
    """The classic redlock-py, from a separate ``pip install --target`` directory."""
    if install and not (target / "redlock").is_dir():
        print(f"installing redlock-py {REDLOCK_PY_VERSION} into {target} ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", str(target), f"redlock-py=={REDLOCK_PY_VERSION}"],
                       check=True)
    if not (target / "redlock" / "__init__.py").is_file():
        raise LookupError(
            f"not installed in {target}: its module name 'redlock' clashes with ours, so it"
            " is only measured from a separate --target dir (run with --install-redlock-py)")
    return SubprocessPeer(key="redlock_py", label=f"redlock-py {REDLOCK_PY_VERSION} (subproc)",
                          nodes=len(urls), target=target, urls=urls)


def redis_py_lock(single: Any) -> Peer:
    import redis.lock

    return Peer(key="redispy", label="redis-py redis.lock.Lock", nodes=1,
                make=lambda r: redis.lock.Lock(single, r, timeout=TTL_S),
                acquire=checked(lambda h: h.acquire(), "redis-py Lock"),
                release=lambda h, _c: h.release())


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


def add_all(peers: Peers, urls3: list[str], urls1: list[str], *, redlock_py_dir: Path,
            install_redlock_py: bool) -> None:
    """Every peer, in the order of the report: Redlock on N=3 first, then the
    single-node locks (with ours on N=1 as their baseline), then the floors."""
    import redis

    peers.all.append(ours_sync(peers, urls3, "ours", "ours sync"))  # the baseline
    peers.all.append(ours_async(peers, urls3))
    peers.add("pottery", lambda: pottery(peers, urls3))
    peers.add("aioredlock", lambda: aioredlock(peers, urls3))
    peers.add("redlock-py", lambda: redlock_py(urls3, redlock_py_dir, install_redlock_py))
    peers.all.append(ours_sync(peers, urls1, "ours_n1", "ours sync N=1"))  # N=1 baseline
    single = redis.Redis.from_url(urls1[0])
    peers.closers.append(single.close)
    peers.all.append(redis_py_lock(single))
    peers.add("python-redis-lock", lambda: python_redis_lock(single))
    peers.all.append(raw_floor(peers, urls3))
    peers.all.append(raw_floor_async(peers, urls3))
