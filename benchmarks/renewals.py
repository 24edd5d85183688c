"""What auto-extend costs (docs/design.md §5.2): 1000 auto-extended locks held 20 s over
three local nodes, renewed by the renewer process, and by the renewal loop in the
holder's own process (the design before the renewer, still the fallback), in the same
run.

    .venv/bin/python benchmarks/renewals.py [--locks 1000] [--seconds 20] [--ttl 5]

Each case runs in a fresh process (``renewals.py child MODE HOST ...``): it makes a
manager, takes and releases one lock (connections open, renewer started), then acquires
the locks, holds them, and measures over the hold: the CPU time of the holder and of its
renewer (``/proc/<pid>/stat``), both processes' RSS, threads and processes per manager,
and how many renewals went out (the scripts one node ran meanwhile). CPU per renewal is both
processes' CPU over the renewals; an idle manager's CPU is measured the same way
(no lock held) and shown beside it.

MODE: ``process`` (the default: the renewer) or ``thread`` (a clock that is not
``time.monotonic`` keeps the loop in the holder: the in-process host). HOST: ``sync`` or
``asyncio``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        found += [int(c) for c in children]
    return found


def _scripts_run(url: str) -> int:
    """How many scripts a node ran so far (EVAL and EVALSHA calls): one per renewal of a
    lock on each node, during a hold."""
    import redis

    with redis.Redis.from_url(url) as node:
        stats = node.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0))
               for name in ("cmdstat_evalsha", "cmdstat_eval"))


def child(mode: str, host: str, urls: list[str], locks: int, seconds: float, ttl: float) -> None:
    from redlock.testing import manager

    # Another clock than time.monotonic itself: the renewals run in this process.
    clock = (lambda: time.monotonic()) if mode == "thread" else None

    def measure(idle: float) -> dict[str, Any]:
        renewers = _children(os.getpid())
        before = _cpu(os.getpid()), sum(_cpu(p) for p in renewers), _scripts_run(urls[0])
        time.sleep(idle)
        after = _cpu(os.getpid()), sum(_cpu(p) for p in renewers), _scripts_run(urls[0])
        return {"holder_cpu_s": round(after[0] - before[0], 3),
                "renewer_cpu_s": round(after[1] - before[1], 3),
                "renewals": after[2] - before[2],
                "holder_rss_kib": _rss_kib(os.getpid()),
                "renewer_rss_kib": sum(_rss_kib(p) for p in renewers),
                "processes_per_manager": len(renewers),
                "threads": threading.active_count()}

    result: dict[str, Any] = {"mode": mode, "host": host}
    if host == "sync":
        with manager(urls, clock=clock) as dlm:
            with dlm.lock("warm", ttl=ttl, auto_extend=True):
                time.sleep(0.5)  # the renewer is up
            result["idle"] = measure(5.0)
            held = [dlm.lock(f"held:{i}", ttl=ttl, auto_extend=True) for i in range(locks)]
            for lock in held:
                assert lock.acquire(timeout=10)
            result["held"] = measure(seconds)
            result["lost"] = sum(1 for lock in held if not lock.locked())
            for lock in held:
                if lock.locked():
                    lock.release()
    else:
        async def run() -> None:
            async with manager(urls, clock=clock, asynchronous=True) as dlm:
                async with dlm.lock("warm", ttl=ttl, auto_extend=True):
                    await asyncio.sleep(0.5)
                result["idle"] = await asyncio.to_thread(measure, 5.0)
                held = [dlm.lock(f"held:{i}", ttl=ttl, auto_extend=True)
                        for i in range(locks)]
                for lock in held:
                    assert await lock.acquire(timeout=10)
                result["held"] = await asyncio.to_thread(measure, seconds)
                result["lost"] = sum(1 for lock in held if not lock.locked())
                for lock in held:
                    if lock.locked():
                        await lock.release()
        asyncio.run(run())
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locks", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--ttl", type=float, default=5.0)
    args = parser.parse_args()
    from redlock.testing import RedisNodes

    rows = []
    with RedisNodes(3) as nodes:
        for mode in ("process", "thread"):
            for host in ("sync", "asyncio"):
                out = subprocess.run(
                    [sys.executable, __file__, "child", mode, host, str(args.locks),
                     str(args.seconds), str(args.ttl), *nodes.urls],
                    capture_output=True, text=True, check=True, timeout=args.seconds + 120)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.locks} auto-extended locks, TTL {args.ttl:g} s, held {args.seconds:g} s,"
          " 3 local nodes")
    print("| renewals in | client | renewals/s | CPU per renewal (holder + renewer) |"
          " idle CPU (holder + renewer, %) | holder RSS | renewer RSS | processes |"
          " threads | lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        held, idle = row["held"], row["idle"]
        cpu = held["holder_cpu_s"] + held["renewer_cpu_s"]
        per = cpu / held["renewals"] * 1e6 if held["renewals"] else float("nan")
        idle_pct = (idle["holder_cpu_s"] + idle["renewer_cpu_s"]) / 5.0 * 100
        print(f"| {'renewer process' if row['mode'] == 'process' else 'holder thread'} |"
              f" {row['host']} | {held['renewals'] / args.seconds:.0f} |"
              f" {per:.0f} µs ({held['holder_cpu_s']:.2f} + {held['renewer_cpu_s']:.2f} s) |"
              f" {idle_pct:.2f} | {held['holder_rss_kib'] / 1024:.1f} MiB |"
              f" {held['renewer_rss_kib'] / 1024:.1f} MiB | {held['processes_per_manager']} |"
              f" {held['threads']} | {row['lost']} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _, _, mode, host, count, seconds, ttl, *urls = sys.argv
        child(mode, host, urls, int(count), float(seconds), float(ttl))
    else:
        main()
