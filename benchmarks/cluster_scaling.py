"""A Redis Cluster as the lock node: acquire+release throughput over many names with 1, 3
and 6 shards, against one standalone node (issue 42, "Scale").

    PYTHONPATH=. .venv/bin/python benchmarks/cluster_scaling.py [--rounds 3] [--duration 4]

N=1 in every case (the node is a standalone redis-server, or a cluster of 1, 3 or 6
masters without replicas, given as ``redis://...?cluster=yes``). ``--processes`` client
processes (4), each one ``Redlock`` and one thread, cycle ``lock(name)``, ``acquire()``,
``release()`` over their own share of ``--names`` (10,000) distinct names, every name
locked once before the rounds (the cluster's hash slots initialised, the scripts loaded).
The cases alternate, ``--duration`` seconds each, for ``--rounds`` rounds (order rotated).

Per case: cycles per second (all processes); per cycle, the servers' CPU (the sum of
``used_cpu_sys`` + ``used_cpu_user`` deltas over every server of the node, ``INFO cpu``,
less what the same servers spend idle over as long, measured just before) and the
clients' CPU (``resource.getrusage`` of each process); and the capacity the node would
have if each of its servers had a core of its own: the rate divided by the busiest
server's share of a core. On this machine clients and servers share 2 cores, so the
throughput itself cannot grow with the shards. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PROCESSES = 4


def child(options: dict[str, Any]) -> None:
    """A client process: ready, go, cycles for the duration, one JSON line."""
    from redlock import Redlock

    names = options["names"]
    with Redlock([options["url"]], node_timeout=0.5) as dlm:
        print("ready", flush=True)
        sys.stdin.readline()
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        until, cycles = started + options["duration"], 0
        while time.monotonic() < until:
            lock = dlm.lock(names[cycles % len(names)], ttl=10.0)
            if lock.acquire(blocking=True, timeout=2.0):
                lock.release()
                cycles += 1
        elapsed = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"cycles": cycles, "elapsed": elapsed,
                          "cpu": after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime}),
              flush=True)


def server_cpu(clients: list[Any]) -> list[float]:
    """Each server's CPU seconds so far."""
    found = []
    for client in clients:
        info = client.info("cpu")
        found.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
    return found


def spent(before: list[float], after: list[float]) -> list[float]:
    return [b - a for a, b in zip(before, after, strict=True)]


def warm(url: str, names: list[str]) -> None:
    from redlock import Redlock

    with Redlock([url], node_timeout=0.5) as dlm:
        for name in names:
            with dlm.lock(name, ttl=10.0, timeout=5.0):
                pass


def main() -> None:
    from _children import go, results, started

    from redlock.testing import RedisNodes
    from redlock.testing.redis_cluster import RedisClusterNodes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=PROCESSES)
    options = parser.parse_args()
    names = [f"orders:{i}" for i in range(options.names)]
    shares = [names[i::options.processes] for i in range(options.processes)]
    found: dict[str, list[dict[str, float]]] = {}
    with RedisNodes(1) as standalone, RedisClusterNodes(masters=1, replicas=0) as one, \
            RedisClusterNodes(masters=3, replicas=0) as three, \
            RedisClusterNodes(masters=6, replicas=0) as six:
        cases: dict[str, tuple[str, list[Any]]] = {"standalone": (standalone.urls[0],
                                                                  [standalone[0]])}
        for label, cluster in (("cluster, 1 shard", one), ("cluster, 3 shards", three),
                               ("cluster, 6 shards", six)):
            seed = cluster.masters()[0]
            cases[label] = (f"redis://{seed.host}:{seed.port}?cluster=yes", cluster.masters())
        for url, _ in cases.values():
            warm(url, names)
        order = list(cases)
        script = Path(__file__).resolve()
        env = {**os.environ, "PYTHONPATH": str(script.parent.parent)}
        for round_ in range(options.rounds):
            for label in order[round_ % len(order):] + order[:round_ % len(order)]:
                url, servers = cases[label]
                clients = [server.client() for server in servers]
                try:
                    with started(script, [{"url": url, "names": share,
                                           "duration": options.duration}
                                          for share in shares], env, "client") as procs:
                        idle = server_cpu(clients)
                        time.sleep(options.duration)
                        before = server_cpu(clients)
                        idle = spent(idle, before)
                        go(procs)
                        outs = results(procs, options.duration + 60, "client")
                        busy = spent(before, server_cpu(clients))
                finally:
                    for client in clients:
                        client.close()
                cycles = sum(o["cycles"] for o in outs)
                elapsed = max(o["elapsed"] for o in outs)
                work = [b - i for b, i in zip(busy, idle, strict=True)]
                found.setdefault(label, []).append({
                    "rate": cycles / elapsed, "server_us": sum(work) / cycles * 1e6,
                    "client_us": sum(o["cpu"] for o in outs) / cycles * 1e6,
                    "capacity": cycles / max(busy), "shards": len(servers)})
                print(f"round {round_ + 1} {label}: {cycles / elapsed:,.0f}/s", flush=True)
    base = statistics.median(r["rate"] for r in found["standalone"])
    base_server = statistics.median(r["server_us"] for r in found["standalone"])
    print()
    print("| node | cycles/s | to standalone | server CPU µs/cycle (idle less) | client CPU"
          " µs/cycle | capacity with a core per server | to standalone |")
    print("|---|---|---|---|---|---|---|")
    base_capacity = statistics.median(r["capacity"] for r in found["standalone"])
    for label, runs in found.items():
        rate = statistics.median(r["rate"] for r in runs)
        server_us = statistics.median(r["server_us"] for r in runs)
        client_us = statistics.median(r["client_us"] for r in runs)
        capacity = statistics.median(r["capacity"] for r in runs)
        print(f"| {label} | {rate:,.0f} | {rate / base:.2f}x | {server_us:.1f}"
              f" ({server_us / base_server:.2f}x) | {client_us:.0f} | {capacity:,.0f}"
              f" | {capacity / base_capacity:.2f}x |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(json.loads(sys.argv[2]))
    else:
        main()
