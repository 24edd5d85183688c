"""A new cluster meets a busy application: its first acquires come from 32 threads at
once (a service's first deployment, or nodes replaced by new empty ones).

Found while writing tests/apps/test_log_lines.py: the new cluster is initialised by the
first acquire that finds every node without its marker (docs/design.md §4.2), and other
threads' acquires that run meanwhile see some nodes marked and others not yet. They must
take that for an initialisation in flight; taking it for lost data benches healthy
nodes for ``max_ttl`` (an hour by default), and with a majority benched every acquire
raises ``ClusterAmnesiaError`` until an operator intervenes.

Real durable redis-server nodes (AOF, fsync always: the recommended setup, whose slower
writes widen the window), one ``Redlock`` shared by 32 threads that lock and release
their own resources for one second; five fresh clusters in a row.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from redlock import Redlock, RedlockError
from redlock.admin import Admin
from redlock.testing import RedisNodes

THREADS = 32
ROUNDS = 5
RUN_FOR = 1.0  # s


def one_round(urls: list[str]) -> str | None:
    """32 threads lock and release on a new cluster for a second; what went wrong."""
    with Redlock(urls) as dlm:
        ops = [0] * THREADS
        errors: Counter[str] = Counter()
        examples: list[str] = []
        until = time.monotonic() + RUN_FOR

        def work(index: int) -> None:
            while time.monotonic() < until:
                try:
                    with dlm.lock(f"startup:{index}", ttl=2.0, timeout=3.0):
                        ops[index] += 1
                except RedlockError as error:
                    errors[type(error).__name__] += 1
                    if len(examples) < 2:
                        examples.append(f"{type(error).__name__}: {error}"[:400])

        threads = [threading.Thread(target=work, args=(i,), name=f"app-{i}", daemon=True)
                   for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(RUN_FOR + 15.0)
        hung = [t.name for t in threads if t.is_alive()]
        status = Admin(dlm).inspect("startup:0")
    unhealthy = [f"{n.node} (marker={n.marker}, benched={n.benched})" for n in status.nodes
                 if not n.marker or n.benched]
    if errors or unhealthy or hung:
        return (f"{sum(ops)} locks, errors {dict(errors)}, nodes without marker or benched: "
                f"{unhealthy}, hung threads: {hung}; first errors: {examples}")
    return None


def test_new_cluster_initialised_by_many_threads_at_once() -> None:
    """On five fresh 5-node clusters, 32 threads start locking at once: every lock
    attempt must succeed, and afterwards every node must carry its marker and none may
    be benched (``inspect()``), so the cluster is fully usable."""
    problems: list[str] = []
    for round_ in range(ROUNDS):
        with RedisNodes(5, appendonly=True) as nodes:
            problem = one_round(nodes.urls)
        if problem:
            problems.append(f"round {round_}: {problem}")
    assert not problems, "\n".join(problems)
