"""What the nodes spend on one acquire+release: server time per cycle on one node, ours
against the commands of redis-py's ``Lock``, by ``INFO commandstats``.

    .venv/bin/python benchmarks/script_cost.py [--rounds 3] [--cycles 20000]

Server time is what a node spends running a command (``usec`` of ``INFO
commandstats``): for a script, its whole run, the commands it calls included. It is not
on the client's clock, but at N >= 3 on a machine with fewer cores than nodes the nodes
compete with the client for the CPU, so it shows in the client's p50 there (BENCHMARKS.md,
"the scripts' usual case").

Cases, each on the same node, rounds interleaved:

* ours: ACQUIRE and RELEASE exactly as our client sends them (a blocking acquire's first
  attempt on a free lock with nobody in line, then the holder's release; every key and
  argument, the membership record and epoch included: ``_floors.client_commands``);
* redis-py Lock: its commands for the same (``SET key token NX PX ttl``, then its
  release script by EVALSHA);
* empty script: a script that only returns, called with our acquire's and release's
  keys and arguments: what EVALSHA itself costs with that many.

Two ways of sending: pipelined (500 commands per write: the node's own cost, warm) and
one command at a time from this process (closer to a client's cycle: the node sleeps
between commands, and its caches cool).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
from typing import Any

import _floors
import redis
from redis.lock import Lock

from redlock.testing import RedisNodes

TTL_S = 10.0
RESOURCE = "bench:script-cost"


def _cases(client: redis.Redis) -> dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Per case, the acquire and release commands of one cycle (one owner throughout:
    each cycle sets and deletes the same key, as a client's would)."""
    owner = secrets.token_hex(16)
    acquire_source, release_source = _floors.script_sources()
    client.script_load(acquire_source)
    client.script_load(release_source)
    ours = _floors.client_commands(RESOURCE, owner, TTL_S)
    empty = client.script_load("return 1")
    redispy_release = client.script_load(Lock.LUA_RELEASE_SCRIPT)
    key = "bench:redispy-lock"
    return {
        "ours": ours,
        "redis-py Lock": (("SET", key, owner, "NX", "PX", int(TTL_S * 1000)),
                          ("EVALSHA", redispy_release, 1, key, owner)),
        "empty script": (("EVALSHA", empty, *ours[0][2:]), ("EVALSHA", empty, *ours[1][2:])),
    }


def _server_usec(client: redis.Redis) -> float:
    stats = client.info("commandstats")
    return sum(float(v["usec"]) for k, v in stats.items()
               if k in ("cmdstat_evalsha", "cmdstat_set"))


def _measure(client: redis.Redis, commands: tuple[tuple[Any, ...], tuple[Any, ...]],
             cycles: int, pipelined: bool) -> float:
    """Server µs per cycle (the cycles' commands only: the counters are reset first)."""
    acquire, release = commands
    assert client.execute_command(*acquire) not in (None, 0), "the acquire was refused"
    client.execute_command(*release)
    client.config_resetstat()
    if pipelined:
        pipe = client.pipeline(transaction=False)
        for i in range(cycles):
            pipe.execute_command(*acquire)
            pipe.execute_command(*release)
            if i % 250 == 249:
                pipe.execute()
        pipe.execute()
    else:
        for _ in range(cycles):
            client.execute_command(*acquire)
            client.execute_command(*release)
    return _server_usec(client) / cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=20000)
    options = parser.parse_args()
    with RedisNodes(1) as nodes:
        _floors.initialise(nodes.urls)
        client = nodes[0].client()
        cases = _cases(client)
        figures: dict[tuple[str, bool], list[float]] = {}
        for _ in range(options.rounds):
            for pipelined in (True, False):
                cycles = options.cycles if pipelined else options.cycles // 4
                for name, commands in cases.items():
                    figures.setdefault((name, pipelined), []).append(
                        _measure(client, commands, cycles, pipelined))
        client.close()
    print(f"server µs per acquire+release on one node (median of {options.rounds} rounds"
          " [min-max])")
    for pipelined in (True, False):
        print("  pipelined" if pipelined else "  one command at a time")
        for name in cases:
            values = figures[(name, pipelined)]
            print(f"    {name:15s} {statistics.median(values):6.2f} "
                  f"[{min(values):.2f}-{max(values):.2f}]")
        ours = statistics.median(figures[("ours", pipelined)])
        peer = statistics.median(figures[("redis-py Lock", pipelined)])
        print(f"    ours / redis-py Lock: {ours / peer:.2f}")


if __name__ == "__main__":
    main()
