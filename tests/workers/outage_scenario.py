"""One node of a cluster killed while threads lock and release, under plain
``logging.basicConfig()``, for tests/test_logging.py (and the figures of the aggregation).

    python outage_scenario.py [--nodes 5] [--threads 4] [--down-s 2.0] [--after-s 3.0]
                              [--cycles 0] [--level INFO]

Starts its own durable redis-server nodes (appendonly, appendfsync always: the killed
node comes back with its data), warms the cluster up, kills node 0, lets the threads
lock and release (a resource each) for ``--down-s`` seconds, or until they made
``--cycles`` cycles between them, restarts the node, goes on for ``--after-s`` seconds
and stops everything. stdout: one JSON line (the killed node's host:port, cycles while
it was down and in all); stderr: what logging printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from redlock import Redlock, RedlockError
from redlock.testing import RedisNodes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--down-s", type=float, default=2.0)
    parser.add_argument("--after-s", type=float, default=3.0)
    parser.add_argument("--cycles", type=int, default=0, help="stop the outage after so many")
    parser.add_argument("--level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=getattr(logging, args.level))
    with RedisNodes(args.nodes, appendonly=True) as nodes, Redlock(nodes.urls) as dlm:
        victim = nodes[0]
        with dlm.lock("outage:warm-up", ttl=5.0):  # a new cluster: initialised by one
            pass
        stop = threading.Event()
        cycles = [0] * args.threads

        def work(index: int) -> None:
            while not stop.is_set():
                lock = dlm.lock(f"outage:{index}", ttl=5.0)
                try:  # an overloaded host may time every node out: try again
                    if lock.acquire(blocking=True, timeout=2.0):
                        lock.release()
                        cycles[index] += 1
                except RedlockError:
                    pass

        threads = [threading.Thread(target=work, args=(i,)) for i in range(args.threads)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.3)
            victim.kill()
            before = sum(cycles)
            deadline = time.monotonic() + args.down_s
            while time.monotonic() < deadline and not (
                    args.cycles and sum(cycles) - before >= args.cycles):
                time.sleep(0.01)
            while_down = sum(cycles) - before
            victim.start()
            time.sleep(args.after_s)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        print(json.dumps({"node": f"{victim.host}:{victim.port}", "cycles_while_down": while_down,
                          "cycles": sum(cycles)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
