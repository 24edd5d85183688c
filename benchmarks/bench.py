"""Benchmark redlock-fenced against other Python Redis lock libraries, in one run.

    .venv/bin/python benchmarks/bench.py            # full run (a few minutes)
    .venv/bin/python benchmarks/bench.py --quick    # smoke run (well under a minute)

Starts its own redis-server processes (RedisNodes(3) and RedisNodes(1) on loopback),
measures every library in the same process and the same rounds (interleaved, rotated
order), and prints medians over rounds with their spread, plus ratios against our
synchronous client measured in this very run. See BENCHMARKS.md for methodology.

The classic ``redlock-py`` package (module name ``redlock``, which clashes with ours) is
measured in a subprocess from a separate ``pip install --target`` directory, only if that
directory exists (``--install-redlock-py`` creates it; it needs PyPI access).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib.metadata
import io
import json
import logging
import os
import platform
import pstats
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _measure
import structlog

HERE = Path(__file__).resolve().parent
DEFAULT_REDLOCK_PY_DIR = Path(
    os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "redlock-bench" / "redlock-py"
REDLOCK_PY_VERSION = "1.0.8"
TTL_S = 10.0


def configure_logging() -> None:
    """The library logs through structlog and never configures it: keep it to WARNING."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING)


# ---------------------------------------------------------------------------------------
# Machine description and load
# ---------------------------------------------------------------------------------------


def cpu_model() -> str:
    """'model name' from /proc/cpuinfo, with family/model/MHz (the name can be vague)."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    if not info:
        return platform.processor() or "unknown"
    text = (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}, {float(info.get('cpu MHz', 'nan')):.0f} MHz")
    if "hypervisor" in info.get("flags", "").split():
        text += ", virtual machine"
    return text + ")"


def redis_server_version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_lines() -> list[str]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    mem = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    peers = ", ".join(f"{d} {version_of(d)}" for d in (
        "redis", "hiredis", "structlog", "tenacity", "pottery", "python-redis-lock",
        "aioredlock", "aioredis"))
    return [
        f"cpus: nproc={os.cpu_count()} (usable by this process: {affinity}), {cpu_model()}",
        f"memory: {mem}; kernel {platform.release()}",
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"redis-server {redis_server_version()}",
        f"packages: {peers}",
        f"loadavg at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


class LoadMonitor:
    """Machine CPU use during a section, split into: this benchmark (process + waited-for
    children), our redis-server processes, and everything else on the machine."""

    def __init__(self, redis_pids: Callable[[], list[int]]) -> None:
        self._redis_pids = redis_pids
        self._tick = os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _machine() -> tuple[int, int]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in fields]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values[:8]) - idle, sum(values[:8])

    @staticmethod
    def _proc(pid: int | str, children: bool) -> int:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0
        fields = text.rsplit(")", 1)[1].split()
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        return utime + stime + ((cutime + cstime) if children else 0)

    def snapshot(self) -> tuple[float, int, int, int]:
        busy, _ = self._machine()
        redis = sum(self._proc(pid, False) for pid in self._redis_pids())
        return time.monotonic(), busy, self._proc("self", True), redis

    def since(self, start: tuple[float, int, int, int]) -> dict[str, float]:
        end = self.snapshot()
        wall = max(end[0] - start[0], 1e-9)
        cores = [(end[i] - start[i]) / self._tick / wall for i in (1, 2, 3)]
        busy, ours, redis = cores
        return {"wall_s": wall, "machine_cores": busy, "bench_cores": ours,
                "redis_cores": redis, "other_cores": max(0.0, busy - ours - redis),
                "loadavg1": os.getloadavg()[0]}


def load_text(load: dict[str, float]) -> str:
    return (f"{load['wall_s']:.0f} s wall; CPU busy {load['machine_cores']:.2f} cores = "
            f"bench {load['bench_cores']:.2f} + redis-servers {load['redis_cores']:.2f} + "
            f"other processes {load['other_cores']:.2f}; loadavg(1m) {load['loadavg1']:.2f}")


# ---------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------


@dataclass
class Peer:
    key: str
    label: str
    nodes: int
    kind: str  # "sync", "async" or "subprocess"
    make: Callable[[str], Any] = field(repr=False, default=lambda r: r)
    acquire: Callable[[Any], Any] = field(repr=False, default=lambda h: None)
    release: Callable[[Any, Any], Any] = field(repr=False, default=lambda h, c: None)
    handle_memory: bool = True  # does make() build a real per-lock object?
    reference: bool = False  # not a lock library: a floor for comparison


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = asyncio.new_event_loop()
        self.peers: list[Peer] = []
        self.skipped: dict[str, str] = {}
        self.closers: list[Callable[[], Any]] = []
        self.redlock_py_dir: Path | None = None

    # -- setup ---------------------------------------------------------------------------

    def setup(self, urls3: list[str], urls1: list[str]) -> None:
        import redis
        import redis.lock

        from redlock import AsyncRedlock, Redlock

        run = self.loop.run_until_complete

        ours3 = Redlock(urls3)
        ours1 = Redlock(urls1)
        self.closers += [ours3.close, ours1.close]

        def ours_peer(key: str, label: str, dlm: Redlock, nodes: int) -> Peer:
            def acquire(handle: Any) -> None:
                if not handle.acquire():
                    raise RuntimeError("blocking acquire returned False")

            return Peer(key, label, nodes, "sync",
                        make=lambda r: dlm.lock(r, ttl=TTL_S),
                        acquire=acquire,
                        release=lambda h, _c: h.release())

        self.peers.append(ours_peer("ours", "ours sync", ours3, 3))

        async def make_async() -> AsyncRedlock:
            return AsyncRedlock(urls3)

        adlm = run(make_async())
        self.closers.append(lambda: run(adlm.close()))

        async def a_acquire(handle: Any) -> None:
            if not await handle.acquire():
                raise RuntimeError("blocking acquire returned False")

        async def a_release(handle: Any, _ctx: Any) -> None:
            await handle.release()

        self.peers.append(Peer("ours_async", "ours asyncio", 3, "async",
                               make=lambda r: adlm.lock(r, ttl=TTL_S),
                               acquire=a_acquire, release=a_release))

        # pottery: Redlock over N masters. A handle is single-owner (its uuid lives on the
        # instance), so every worker gets its own; acquire() waits with random sleeps.
        try:
            from pottery import Redlock as PotteryRedlock

            masters = {redis.Redis.from_url(u) for u in urls3}
            self.closers += [m.close for m in masters]

            def p_acquire(handle: Any) -> None:
                if not handle.acquire():
                    raise RuntimeError("pottery acquire returned False")

            self.peers.append(Peer(
                "pottery", "pottery.Redlock", 3, "sync",
                make=lambda r: PotteryRedlock(key=r, masters=masters, auto_release_time=TTL_S),
                acquire=p_acquire, release=lambda h, _c: h.release()))
        except Exception as exc:
            self.skipped["pottery"] = f"{type(exc).__name__}: {exc}"

        # aioredlock: no handle object; lock() returns a Lock or raises LockError after
        # retry_count (3) attempts 0.1-0.3 s apart. A blocking caller loops.
        try:
            from aioredlock import Aioredlock, LockError

            async def make_aio() -> Any:
                manager = Aioredlock(list(urls3))
                probe = await manager.lock("bench:aioredlock:probe", lock_timeout=TTL_S)
                await manager.unlock(probe)
                return manager

            aio = run(make_aio())
            self.closers.append(lambda: run(aio.destroy()))

            async def aio_acquire(resource: str) -> Any:
                while True:
                    try:
                        return await aio.lock(resource, lock_timeout=TTL_S)
                    except LockError:
                        continue

            async def aio_release(_resource: str, held: Any) -> None:
                await aio.unlock(held)

            self.peers.append(Peer("aioredlock", "aioredlock", 3, "async",
                                   make=lambda r: r, acquire=aio_acquire,
                                   release=aio_release, handle_memory=False))
        except Exception as exc:
            self.skipped["aioredlock"] = f"{type(exc).__name__}: {exc}"

        self.redlock_py_dir = self._find_redlock_py()
        if self.redlock_py_dir is not None:
            self.peers.append(Peer("redlock_py", f"redlock-py {REDLOCK_PY_VERSION} (subproc)",
                                   3, "subprocess", handle_memory=False))

        # -- single-node baselines -------------------------------------------------------
        self.peers.append(ours_peer("ours_n1", "ours sync N=1", ours1, 1))

        single = redis.Redis.from_url(urls1[0])
        self.closers.append(single.close)

        def rp_acquire(handle: Any) -> None:
            if not handle.acquire():
                raise RuntimeError("redis-py Lock.acquire returned False")

        self.peers.append(Peer("redispy", "redis-py redis.lock.Lock", 1, "sync",
                               make=lambda r: redis.lock.Lock(single, r, timeout=TTL_S),
                               acquire=rp_acquire, release=lambda h, _c: h.release()))
        try:
            import redis_lock

            def prl_acquire(handle: Any) -> None:
                if not handle.acquire():
                    raise RuntimeError("python-redis-lock acquire returned False")

            self.peers.append(Peer(
                "prl", "python-redis-lock", 1, "sync",
                make=lambda r: redis_lock.Lock(single, r, expire=int(TTL_S)),
                acquire=prl_acquire, release=lambda h, _c: h.release()))
        except Exception as exc:
            self.skipped["python-redis-lock"] = f"{type(exc).__name__}: {exc}"

        # -- reference floors: the same two Lua calls as ours, no client logic ---------
        self.peers.append(self._raw_floor(urls3))
        self.peers.append(self._raw_floor_async(urls3))

    def _raw_floor(self, urls3: list[str]) -> Peer:
        """Scatter EVALSHA acquire to all nodes, gather; the same for release. No quorum
        logic, validity, retries, logging or bookkeeping: what the I/O alone costs."""
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        from redlock import _scripts as scripts
        from redlock._node_config import pool_overrides

        # The same connection settings our client uses (no retries, raw replies).
        overrides = pool_overrides(1.0, Retry(NoBackoff(), 0))
        pools = [redis.ConnectionPool.from_url(u, **overrides) for u in urls3]
        self.closers += [p.disconnect for p in pools]
        for pool in pools:
            with redis.Redis(connection_pool=pool) as client:
                client.set("redlock:node-marker", "bench", nx=True)
                client.script_load(scripts.ACQUIRE.source)
                client.script_load(scripts.RELEASE.source)

        def scatter(*command: Any) -> list[Any]:
            conns = [p.get_connection() for p in pools]
            try:
                for conn in conns:
                    conn.send_command(*command)
                return [conn.read_response() for conn in conns]
            finally:
                for pool, conn in zip(pools, conns, strict=True):
                    pool.release(conn)

        def acquire(resource: str) -> str:
            owner = secrets.token_hex(16)
            lock, fence = f"redlock:{{{resource}}}:lock", f"redlock:{{{resource}}}:fence"
            replies = scatter("EVALSHA", scripts.ACQUIRE.sha, 3, lock, fence,
                              "redlock:node-marker", owner, int(TTL_S * 1000), 0)
            if sum(1 for r in replies if int(r[0]) == 1) < 2:
                raise RuntimeError(f"floor acquire failed: {replies}")
            return owner

        def release(resource: str, owner: str) -> None:
            scatter("EVALSHA", scripts.RELEASE.sha, 2, f"redlock:{{{resource}}}:lock",
                    f"redlock:{{{resource}}}:released", owner)

        return Peer("floor", "(ref) raw 2x scatter/gather", 3, "sync", make=lambda r: r,
                    acquire=acquire, release=release, handle_memory=False, reference=True)

    def _raw_floor_async(self, urls3: list[str]) -> Peer:
        """The asyncio floor: asyncio.gather of one send+read per node on redis.asyncio
        connections (what ours asyncio builds on), twice per cycle; no per-call timeout."""
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        from redlock import _scripts as scripts
        from redlock._node_config import pool_overrides

        overrides = pool_overrides(1.0, Retry(NoBackoff(), 0))
        pools = [redis.asyncio.ConnectionPool.from_url(u, **overrides) for u in urls3]
        self.closers += [lambda p=p: self.loop.run_until_complete(p.disconnect())
                         for p in pools]

        async def one(pool: Any, command: tuple[Any, ...]) -> Any:
            conn = await pool.get_connection()
            try:
                await conn.send_command(*command, check_health=False)
                return await conn.read_response()
            finally:
                await pool.release(conn)

        async def acquire(resource: str) -> str:
            owner = secrets.token_hex(16)
            command = ("EVALSHA", scripts.ACQUIRE.sha, 3, f"redlock:{{{resource}}}:lock",
                       f"redlock:{{{resource}}}:fence", "redlock:node-marker", owner,
                       int(TTL_S * 1000), 0)
            replies = await asyncio.gather(*(one(p, command) for p in pools))
            if sum(1 for r in replies if int(r[0]) == 1) < 2:
                raise RuntimeError(f"floor acquire failed: {replies}")
            return owner

        async def release(resource: str, owner: str) -> None:
            command = ("EVALSHA", scripts.RELEASE.sha, 2, f"redlock:{{{resource}}}:lock",
                       f"redlock:{{{resource}}}:released", owner)
            await asyncio.gather(*(one(p, command) for p in pools))

        return Peer("floor_async", "(ref) raw asyncio 2x gather", 3, "async",
                    make=lambda r: r, acquire=acquire, release=release, handle_memory=False,
                    reference=True)

    def _find_redlock_py(self) -> Path | None:
        target = Path(self.args.redlock_py_dir)
        if self.args.install_redlock_py and not (target / "redlock").is_dir():
            print(f"installing redlock-py {REDLOCK_PY_VERSION} into {target} ...", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--target", str(target), f"redlock-py=={REDLOCK_PY_VERSION}"],
                           check=True)
        if not (target / "redlock" / "__init__.py").is_file():
            self.skipped["redlock-py"] = (
                f"not installed in {target}: its module name 'redlock' clashes with ours, so it"
                " is only measured from a separate --target dir (run with"
                " --install-redlock-py)")
            return None
        return target

    def close(self) -> None:
        for closer in reversed(self.closers):
            with contextlib.suppress(Exception):
                closer()
        self.loop.run_until_complete(asyncio.sleep(0.05))  # let transports close
        self.loop.close()

    # -- running one measurement -----------------------------------------------------------

    def _subprocess(self, mode: str, options: dict[str, Any]) -> dict[str, Any]:
        assert self.redlock_py_dir is not None
        env = {**os.environ, "PYTHONPATH": str(self.redlock_py_dir),
               "REDLOCK_PY_DIR": str(self.redlock_py_dir)}
        done = subprocess.run(
            [sys.executable, str(HERE / "_redlock_py_worker.py"), mode, json.dumps(options)],
            capture_output=True, text=True, env=env, cwd=str(HERE), check=False,
            timeout=options.get("deadline_s", 120) + 60)
        if done.returncode != 0:
            raise RuntimeError(f"redlock-py worker failed: {done.stderr.strip()[-500:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])["result"]
        return result

    def uncontended(self, peer: Peer, urls3: list[str], round_no: int) -> dict[str, float]:
        resource = f"bench:{peer.key}:u{round_no}"
        cycles, warmup = self.args.cycles, self.args.warmup
        if peer.kind == "sync":
            return _measure.uncontended(peer.make, peer.acquire, peer.release, resource,
                                        cycles=cycles, warmup=warmup)
        if peer.kind == "async":
            return self.loop.run_until_complete(_measure.uncontended_async(
                peer.make, peer.acquire, peer.release, resource, cycles=cycles, warmup=warmup))
        return self._subprocess("uncontended", {"urls": urls3, "resource": resource,
                                                "cycles": cycles, "warmup": warmup})

    def contended(self, peer: Peer, urls3: list[str], round_no: int) -> dict[str, Any]:
        resource = f"bench:{peer.key}:c{round_no}"
        options = {"workers": self.args.workers, "total": self.args.total,
                   "deadline_s": self.args.deadline}
        if peer.kind == "sync":
            return _measure.contended(peer.make, peer.acquire, peer.release, resource,
                                      **options)
        if peer.kind == "async":
            return self.loop.run_until_complete(_measure.contended_async(
                peer.make, peer.acquire, peer.release, resource, **options))
        return self._subprocess("contended", {"urls": urls3, "resource": resource, **options})

    def cycle_memory(self, peer: Peer, urls3: list[str]) -> dict[str, float]:
        prefix = f"bench:{peer.key}:m"
        if peer.kind == "sync":
            return _measure.cycle_memory(peer.make, peer.acquire, peer.release,
                                         cycles=self.args.mem_cycles, prefix=prefix)
        if peer.kind == "async":
            return self.loop.run_until_complete(_measure.cycle_memory_async(
                peer.make, peer.acquire, peer.release, cycles=self.args.mem_cycles,
                prefix=prefix))
        return self._subprocess("memory", {"urls": urls3, "resource": prefix,
                                           "cycles": self.args.mem_cycles})


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(out)


def ratio_text(ours: float, theirs: float, *, higher_is_better: bool) -> str:
    """'3.1x slower' / '1.4x faster' for the peer, relative to ours."""
    if not ours or not theirs or ours != ours or theirs != theirs:
        return "n/a"
    slower = ours / theirs if higher_is_better else theirs / ours
    if 0.97 <= slower <= 1.03:
        return "same (±3%)"
    if slower >= 1:
        return f"{slower:.2f}x slower" if slower < 10 else f"{slower:.0f}x slower"
    faster = 1 / slower
    return f"{faster:.2f}x faster" if faster < 10 else f"{faster:.0f}x faster"


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


@contextlib.contextmanager
def section(title: str, monitor: LoadMonitor, loads: dict[str, dict[str, float]]
            ) -> Iterator[None]:
    print(f"\n== {title} ==", flush=True)
    start = monitor.snapshot()
    yield
    loads[title] = monitor.since(start)
    print(f"   load during this section: {load_text(loads[title])}", flush=True)


def rotated(peers: list[Peer], shift: int) -> list[Peer]:
    shift %= len(peers)
    return peers[shift:] + peers[:shift]


def run(args: argparse.Namespace) -> int:
    configure_logging()
    from redlock.testing.redis_nodes import RedisNodes

    print("redlock-fenced benchmark" + (" (--quick)" if args.quick else ""))
    for line in machine_lines():
        print("  " + line)
    print(f"  settings: rounds={args.rounds} cycles/round={args.cycles} warmup={args.warmup}"
          f" | contended: workers={args.workers} total={args.total}"
          f" rounds={args.contended_rounds} | memory: handles={args.handles}"
          f" cycles={args.mem_cycles} | ttl={TTL_S:g}s")

    results: dict[str, Any] = {"machine": machine_lines(), "args": vars(args)}
    loads: dict[str, dict[str, float]] = {}
    with RedisNodes(3) as nodes3, RedisNodes(1) as nodes1:
        urls3, urls1 = nodes3.urls, nodes1.urls
        monitor = LoadMonitor(lambda: [n.pid for n in [*nodes3, *nodes1] if n.pid])
        overall = monitor.snapshot()
        bench = Bench(args)
        try:
            bench.setup(urls3, urls1)
            peers = [p for p in bench.peers if not args.only or p.key in args.only]
            if args.profile:
                profile_ours(bench, args)
                return 0
            results["uncontended"] = uncontended_section(bench, peers, urls3, monitor, loads)
            results["contended"] = contended_section(bench, peers, urls3, monitor, loads)
            results["memory"] = memory_section(bench, peers, urls3, monitor, loads)
        finally:
            bench.close()
        loads["overall"] = monitor.since(overall)
    print(f"\nwhole run: {load_text(loads['overall'])}")
    print(f"loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if bench.skipped:
        print("\nnot measured:")
        for name, why in bench.skipped.items():
            print(f"  {name}: {why}")
    results["loads"] = loads
    results["skipped"] = bench.skipped
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        print(f"\nraw results written to {args.json}")
    return 0


def uncontended_section(bench: Bench, peers: list[Peer], urls3: list[str],
                        monitor: LoadMonitor, loads: dict[str, dict[str, float]]
                        ) -> dict[str, list[dict[str, float]]]:
    args = bench.args
    runs: dict[str, list[dict[str, float]]] = {p.key: [] for p in peers}
    title = (f"Uncontended acquire+release, one caller, {args.cycles} cycles x "
             f"{args.rounds} rounds")
    with section(title, monitor, loads):
        for round_no in range(args.rounds):
            for peer in rotated(peers, round_no):
                runs[peer.key].append(bench.uncontended(peer, urls3, round_no))
            print(f"   round {round_no + 1}/{args.rounds} done", flush=True)
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("p50_us", "p99_us", "ops_s")}
               for k, v in runs.items() if v}
        base = med.get("ours")
        base1 = med.get("ours_n1")
        rows = []
        for peer in peers:
            r, m = runs[peer.key], med[peer.key]
            vs3 = ("(baseline)" if peer.key == "ours" else
                   ratio_text(base["p50_us"], m["p50_us"], higher_is_better=False)
                   if base else "n/a")
            vs1 = ""
            if peer.nodes == 1:
                vs1 = ("(baseline)" if peer.key == "ours_n1" else
                       ratio_text(base1["p50_us"], m["p50_us"], higher_is_better=False)
                       if base1 else "n/a")
            rows.append([peer.label, str(peer.nodes),
                         spread([x["p50_us"] for x in r]),
                         spread([x["p99_us"] for x in r]),
                         spread([x["ops_s"] for x in r]),
                         vs3, vs1])
        print(table(["library", "N", "p50 us [min-max]", "p99 us [min-max]",
                     "ops/s [min-max]", "p50 vs ours sync N=3", "p50 vs ours N=1"], rows))
        for ours, floor in (("ours", "floor"), ("ours_async", "floor_async")):
            if ours in med and floor in med:
                extra = med[ours]["p50_us"] - med[floor]["p50_us"]
                print(f"   {ours}: p50 {extra:+.0f} us ({extra / med[floor]['p50_us']:+.0%}) "
                      f"against its raw floor ({floor}: same Lua and connection settings)")
    return runs


def contended_section(bench: Bench, peers: list[Peer], urls3: list[str],
                      monitor: LoadMonitor, loads: dict[str, dict[str, float]]
                      ) -> dict[str, list[dict[str, Any]]]:
    args = bench.args
    runs: dict[str, list[dict[str, Any]]] = {}
    contenders = [p for p in peers if not p.reference]
    title = (f"Contended: {args.workers} threads (asyncio: tasks) x one lock, {args.total} "
             f"acquisitions in total, {args.contended_rounds} round(s)")
    with section(title, monitor, loads):
        for round_no in range(args.contended_rounds):
            for peer in rotated(contenders, round_no):
                try:
                    result = bench.contended(peer, urls3, round_no)
                except Exception as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                runs.setdefault(peer.key, []).append(result)
            print(f"   round {round_no + 1}/{args.contended_rounds} done", flush=True)
        ok = {k: [r for r in v if "error" not in r] for k, v in runs.items()}
        base = statistics.median(r["acq_s"] for r in ok["ours"]) if ok.get("ours") else None
        rows = []
        for peer in contenders:
            good = ok[peer.key]
            if not good:
                rows.append([peer.label, str(peer.nodes), "error", "", "", "", "",
                             runs[peer.key][0]["error"][:60]])
                continue
            acq = [r["acq_s"] for r in good]
            notes = []
            if any(r["timed_out"] for r in good):
                notes.append(f"hit the {args.deadline:g}s deadline")
            if not all(r["counter_ok"] for r in good) or any(r["violations"] for r in good):
                notes.append(f"MUTUAL EXCLUSION BROKEN ({sum(r['violations'] for r in good)}"
                             " overlaps)")
            rows.append([
                peer.label + (" [tasks]" if peer.kind == "async" else ""), str(peer.nodes),
                spread([r["total_s"] for r in good], "{:.2f}"),
                spread(acq),
                "/".join(str(r["min_per_worker"]) for r in good),
                "/".join(str(r["max_per_worker"]) for r in good),
                "(baseline)" if peer.key == "ours" else
                ratio_text(base, statistics.median(acq), higher_is_better=True)
                if base else "n/a",
                "; ".join(notes) or "ok",
            ])
        fair = args.total / args.workers
        print(table(["library", "N", "total s [min-max]", "acq/s [min-max]",
                     "min/worker per round", "max/worker per round", "acq/s vs ours sync",
                     "exclusion"], rows))
        print(f"   (perfectly fair share: {fair:.0f} per worker)")
    return runs


def memory_section(bench: Bench, peers: list[Peer], urls3: list[str],
                   monitor: LoadMonitor, loads: dict[str, dict[str, float]]
                   ) -> dict[str, dict[str, Any]]:
    args = bench.args
    out: dict[str, dict[str, Any]] = {}
    title = (f"Memory (tracemalloc): {args.handles} lock handles kept alive; "
             f"{args.mem_cycles} acquire/release cycles on distinct resources")
    with section(title, monitor, loads):
        for peer in peers:
            if peer.reference:
                continue
            entry: dict[str, Any] = {}
            if peer.handle_memory:
                entry["handles"] = _measure.handle_memory(peer.make, args.handles)
            try:
                entry["cycles"] = bench.cycle_memory(peer, urls3)
            except Exception as exc:
                entry["cycles_error"] = f"{type(exc).__name__}: {exc}"
            out[peer.key] = entry
        base = out.get("ours", {}).get("handles")
        rows = []
        for peer in peers:
            if peer.key not in out:
                continue
            entry = out[peer.key]
            handles, cycles = entry.get("handles"), entry.get("cycles")
            rows.append([
                peer.label, str(peer.nodes),
                f"{handles['bytes_per_handle']:.0f}" if handles else "n/a (no handle)",
                f"{handles['peak_kib']:.0f}" if handles else "",
                f"{handles['create_us']:.2f}" if handles else "",
                ("(baseline)" if peer.key == "ours" else ratio_text(
                    base["bytes_per_handle"], handles["bytes_per_handle"],
                    higher_is_better=False).replace("slower", "larger").replace(
                    "faster", "smaller")) if handles and base else "",
                f"{cycles['peak_kib']:.0f}" if cycles else entry.get("cycles_error", "")[:40],
                f"{cycles['retained_kib']:.0f}" if cycles else "",
                f"{cycles['retained_b_per_cycle']:.0f}" if cycles else "",
            ])
        print(table(["library", "N", "B/handle", "peak KiB", "create us/handle",
                     "handle size vs ours", "cycles: peak KiB", "retained KiB",
                     "retained B/cycle"], rows))
    return out


def profile_ours(bench: Bench, args: argparse.Namespace) -> None:
    """cProfile our sync client on N=3, uncontended (compare with the raw floor row)."""
    peer = next(p for p in bench.peers if p.key == "ours")
    handle = peer.make("bench:profile")
    for _ in range(200):
        peer.release(handle, peer.acquire(handle))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.cycles):
        peer.release(handle, peer.acquire(handle))
    profiler.disable()
    for sort in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(35)
        print(f"\n== cProfile of ours sync N=3, {args.cycles} cycles, by {sort} ==")
        print(text.getvalue())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, help="uncontended rounds (default 5; quick 3)")
    parser.add_argument("--cycles", type=int, help="cycles per round (2000; quick 300)")
    parser.add_argument("--warmup", type=int, help="warm-up cycles (200; quick 30)")
    parser.add_argument("--workers", type=int, default=8, help="contending threads/tasks")
    parser.add_argument("--total", type=int, help="contended acquisitions (1000; quick 200)")
    parser.add_argument("--contended-rounds", type=int, help="(3; quick 1)")
    parser.add_argument("--deadline", type=float, default=90.0,
                        help="give up a contended run after this many seconds")
    parser.add_argument("--handles", type=int, help="handles for memory (10000; quick 2000)")
    parser.add_argument("--mem-cycles", type=int, help="cycles for memory (1000; quick 200)")
    parser.add_argument("--only", nargs="*", help="peer keys to run (ours is the baseline)")
    parser.add_argument("--profile", action="store_true",
                        help="only cProfile our sync client and print the hot spots")
    parser.add_argument("--redlock-py-dir", default=str(DEFAULT_REDLOCK_PY_DIR))
    parser.add_argument("--install-redlock-py", action="store_true",
                        help=f"pip install redlock-py=={REDLOCK_PY_VERSION} into"
                             " --redlock-py-dir if it is not there")
    parser.add_argument("--json", help="also write raw results to this file")
    args = parser.parse_args(argv)
    full = {"rounds": 5, "cycles": 2000, "warmup": 200, "total": 1000, "contended_rounds": 3,
            "handles": 10_000, "mem_cycles": 1000}
    quick = {"rounds": 3, "cycles": 300, "warmup": 30, "total": 200, "contended_rounds": 1,
             "handles": 2000, "mem_cycles": 200}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.only:
        args.only = sorted({"ours", "ours_n1", *args.only})
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args()))
