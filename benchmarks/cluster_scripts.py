"""What a Redis Cluster node's master spends on one acquire+release, against a standalone
node: server time per cycle by ``INFO commandstats`` (docs/proposals/cluster.md P3.1a).

    PYTHONPATH=. .venv/bin/python benchmarks/cluster_scripts.py [--rounds 7] [--cycles 3000]

Cases, rounds interleaved, each over 200 names (their hash slots initialised first):

* standalone: ACQUIRE and RELEASE as the client sends them to a standalone node (the
  node's keys ``ns:node:*``);
* cluster, run passed: the same on the master of a one-master cluster, with the keys of
  each resource's hash slot (``Keys.beside``), the epoch followed by the server's run as a
  known connection sends it (``wire.with_run``): the scripts compare the hash slot's stamp
  with it;
* cluster, first write: the same without the run, as on a connection's first write: the
  scripts ask ``INFO server`` for it.

One command at a time (EVALSHA) from this process. Server time is the scripts' whole run
(``cmdstat_evalsha``), the commands they call included.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import redis

from redlock._core.kinds import MUTEX, AcquireArgs
from redlock._core.settings import Keys
from redlock._io.wire import with_run
from redlock._scripts import lock as scripts
from redlock._scripts import node as node_scripts
from redlock.testing import RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes

KEYS = Keys("redlock")
NAMES = [f"orders:{i}" for i in range(200)]


def server_time(client: redis.Redis, keys_of: Callable[[str], Keys], run: str | None,
                cycles: int) -> float:
    """µs of server time per acquire+release over ``cycles`` (``run``: passed with the
    epoch, as a known connection does)."""
    for name in NAMES:
        keys = keys_of(name)
        client.evalsha(node_scripts.INIT_MARKER.sha, 2, keys.marker, keys.episode,
                       "initialised by cluster_scripts.py")
    client.config_resetstat()
    for i in range(cycles):
        name = NAMES[i % len(NAMES)]
        keys = keys_of(name)
        value = f"{i:032x}00000001"
        [acquire], _ = MUTEX.acquire_request(keys, (0,), (name,),
                                             AcquireArgs(value, 10_000, 0, "", 5000), 0)
        if run is not None:
            [acquire] = with_run((acquire,), run)
        granted = client.evalsha(acquire.script.sha, len(acquire.keys), *acquire.keys,
                                 *acquire.args)
        assert granted[0] == 1, granted
        [release], _ = MUTEX.release_request(keys, (0,), (name,), (value, "1"))
        client.evalsha(release.script.sha, len(release.keys), *release.keys, *release.args)
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec"]) / cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=3000)
    options = parser.parse_args()
    found: dict[str, list[float]] = {"standalone": [], "cluster, run passed": [],
                                     "cluster, first write": []}
    with RedisNodes(1) as nodes, RedisClusterNodes(masters=1, replicas=0) as cluster, \
            nodes[0].client() as standalone, cluster.masters()[0].client() as master:
        for client in (standalone, master):
            for script in (scripts.ACQUIRE, scripts.RELEASE, node_scripts.INIT_MARKER):
                client.script_load(script.source)
        run = str(master.info("server")["run_id"])
        for _ in range(options.rounds):
            found["standalone"].append(
                server_time(standalone, lambda _: KEYS, None, options.cycles))
            found["cluster, run passed"].append(
                server_time(master, KEYS.beside, run, options.cycles))
            found["cluster, first write"].append(
                server_time(master, KEYS.beside, None, options.cycles))
    base = statistics.median(found["standalone"])
    print(f"server µs per acquire+release ({options.rounds} rounds x {options.cycles}"
          " cycles, EVALSHA one at a time; median, ratio to standalone, spread)")
    for case, values in found.items():
        median = statistics.median(values)
        print(f"  {case:<22} {median:6.1f}  {median / base:4.2f}x"
              f"  [{min(values):.1f} .. {max(values):.1f}]")


if __name__ == "__main__":
    main()
