"""What ``replica_acks`` costs (docs/design.md §11.3): uncontended acquire+release on
primaries that each have a replica, with and without waiting for the replica (WAIT 1
behind every grant), against redis-py's ``Lock`` followed by ``WAIT 1`` by hand (what a
redis-py user who wants the same assurance writes), in the same rounds, interleaved.

    PYTHONPATH=. .venv/bin/python benchmarks/replica_acks.py [--ns 1 3] [--rounds 5]
        [--cycles 1000]

Loopback: the primary-to-replica round trip is the smallest it can be here; across
zones expect 0.5-2 ms more per grant. Each ratio is the median over rounds of the ratio
of the two p50s of one round, with its [min-max]."""

from __future__ import annotations

import argparse
import statistics

import _measure
import redis
from _environment import loadavg_text, machine_lines

from redlock import Redlock
from redlock.testing import RedisNodes


def redis_py_waited(client: redis.Redis):  # type: ignore[no-untyped-def]
    """redis-py's Lock, then WAIT 1 on the same client (its pool's connection)."""
    def acquire(lock: redis.lock.Lock) -> None:
        lock.acquire()
        if client.execute_command("WAIT", 1, 1000) < 1:
            raise RuntimeError("not replicated")
    return (lambda r: client.lock(r, timeout=10.0), acquire, lambda h, _c: h.release())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ns", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1000)
    args = parser.parse_args()
    for line in machine_lines():
        print(line)
    most = max(args.ns)
    with RedisNodes(2 * most) as nodes:
        primaries, replicas = list(nodes)[:most], list(nodes)[most:]
        for primary, replica in zip(primaries, replicas, strict=True):
            replica.replicate(primary)
        for n in args.ns:
            urls = [p.url for p in primaries[:n]]
            namespace = f"bench-n{n}"  # (each N a new cluster: nodes of a smaller N have markers)
            with Redlock(urls, namespace=namespace) as plain, \
                    Redlock(urls, namespace=namespace, replica_acks=1) as acked:
                peers = {"acks=0": plain, "acks=1": acked}
                client = redis.Redis.from_url(urls[0]) if n == 1 else None

                def ours(dlm: Redlock):  # type: ignore[no-untyped-def]
                    return (lambda r: dlm.lock(r, ttl=10.0), lambda h: h.acquire(),
                            lambda h, _c: h.release())

                runs = {name: ours(dlm) for name, dlm in peers.items()}
                if client is not None:
                    runs["redis-py Lock + WAIT 1"] = redis_py_waited(client)
                p50s: dict[str, list[float]] = {name: [] for name in runs}
                for round_ in range(args.rounds):
                    order = list(runs)[round_ % len(runs):] + list(runs)[:round_ % len(runs)]
                    for name in order:
                        make, acquire, release = runs[name]
                        result = _measure.uncontended(make, acquire, release,
                                                      f"bench:{name}:{round_}",
                                                      cycles=args.cycles, warmup=100)
                        p50s[name].append(result["p50_us"])
                print(f"\nN={n} primaries, each with one replica; {args.rounds} rounds of"
                      f" {args.cycles} cycles; load {loadavg_text()}")
                for name, values in p50s.items():
                    print(f"  {name:24s} p50 {statistics.median(values):7.1f} µs")
                ratios = [a / b for a, b in zip(p50s["acks=1"], p50s["acks=0"], strict=True)]
                print(f"  acks=1 / acks=0: {statistics.median(ratios):.2f}x"
                      f" [{min(ratios):.2f}-{max(ratios):.2f}], +"
                      f"{statistics.median(p50s['acks=1']) - statistics.median(p50s['acks=0']):.1f}"
                      " µs per cycle")
                if client is not None:
                    theirs = p50s["redis-py Lock + WAIT 1"]
                    ratios = [a / b for a, b in zip(p50s["acks=1"], theirs, strict=True)]
                    print(f"  acks=1 / redis-py Lock + WAIT 1: {statistics.median(ratios):.2f}x"
                          f" [{min(ratios):.2f}-{max(ratios):.2f}]")
                    client.close()


if __name__ == "__main__":
    main()
