"""Scenario 5: a holder process is paused (SIGSTOP) past its TTL while others take over;
when it resumes, its writes with the old token are rejected by the fencing store.

Three real worker processes (tests/faults/workers/paused_holder.py) loop on one lock
over N = 5 real nodes: acquire, work, write the token to a plain list and through
``fencing.RedisFencedStore``, release. The test freezes a process right after it
announced that it holds the lock, for longer than the TTL, then resumes it. The
merged history goes through the checker: no two acquisitions share a token, tokens
grow in real-time order, accepted fenced writes never go backwards. Hold intervals are
cut at each holder's validity, so even here they must not overlap (a paused holder
*believes* it holds past that point: that belief is what fencing makes harmless). The
plain list shows what the same writes do to an unprotected resource: the checker
finds them out of order. Finally a holder is killed -9 while holding, and the lock is
acquirable again within its TTL (plus a small bound).

Rerun: ``bash scripts/faults -k paused -s``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from typing import Any

import pytest

from redlock import Redlock
from redlock.testing import RedisNode, RedisNodes
from redlock.testing.history import ACCEPTED, REJECTED, History, Hold, Write
from tests.faults.fault_figures import scenario
from tests.faults.processes import EventProcess

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

WORKER = "tests.faults.workers.paused_holder"  # run as a module from the repository root
RESOURCE = "paused:r"
PLAIN_KEY = "paused:plain"
TTL = 0.6
WORKERS = 3
SECONDS = 10.0
PAUSES = 5


class Worker(EventProcess):
    """One worker process (tests/faults/workers/paused_holder.py) and its events."""

    def __init__(self, name: str, seconds: float, nodes: RedisNodes, store: RedisNode) -> None:
        super().__init__(WORKER, [name, str(seconds), str(TTL), store.url, *nodes.urls])
        self.name = name

    def wait_holding(self, after: int, timeout: float) -> dict[str, Any] | None:
        """The first "holding" event at index >= after, waiting up to timeout."""
        return self.wait_for(after, lambda e: e["event"] == "holding", timeout)

    def finish(self, timeout: float = 20.0) -> str:
        stderr = super().finish(timeout)
        assert self.process.returncode in (0, -signal.SIGKILL), stderr
        return stderr


def next_holder(workers: list[Worker], timeout: float) -> Worker | None:
    """The first worker to announce a new hold from now on (whoever wins the lock)."""
    marks = [len(worker.events) for worker in workers]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker, mark in zip(workers, marks, strict=True):
            if worker.wait_holding(mark, timeout=0) is not None:
                return worker
        time.sleep(0.005)
    return None


def merge(workers: list[Worker], history: History) -> None:
    """Per worker: each hold from the acquire's completion to the release's invocation,
    cut at the validity the holder was given."""
    for worker in workers:
        open_hold: dict[str, Any] | None = None
        for event in worker.events:
            if event["event"] == "holding":
                open_hold = event
            elif event["event"] == "write":
                history.wrote(Write(worker.name, RESOURCE, event["token"],
                                          event["invoked"], event["completed"],
                                          event["outcome"]))
            elif event["event"] == "released" and open_hold is not None:
                history.held(Hold(worker.name, RESOURCE, open_hold["token"],
                                  open_hold["completed"],
                                  min(event["at"], open_hold["valid_until"]),
                                  open_hold["invoked"]))
                open_hold = None
        if open_hold is not None:  # killed while holding
            history.held(Hold(worker.name, RESOURCE, open_hold["token"],
                              open_hold["completed"], open_hold["valid_until"],
                              open_hold["invoked"]))


def test_paused_holders_are_fenced_off_and_the_lock_recovers(
        nodes5: RedisNodes, store_node: RedisNode) -> None:
    seed = int(os.environ.get("REDLOCK_FAULT_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    with store_node.client() as client:
        client.delete(PLAIN_KEY)
    with scenario("paused-holder-sigstop") as figures:
        workers = [Worker(f"w{i}", SECONDS, nodes5, store_node) for i in range(WORKERS)]
        paused_for: list[float] = []
        try:
            time.sleep(0.5)
            stop_pausing = time.monotonic() + SECONDS - 2.0
            while len(paused_for) < PAUSES and time.monotonic() < stop_pausing:
                victim = next_holder(workers, timeout=3.0)
                if victim is None:
                    continue
                victim.signal(signal.SIGSTOP)
                pause = TTL + rng.uniform(0.3, 0.8)
                time.sleep(pause)
                victim.signal(signal.SIGCONT)
                paused_for.append(pause)
                time.sleep(0.3)
        finally:
            for worker in workers:
                worker.finish(timeout=SECONDS + 30)

        # Kill -9 a holder while it holds: the lock must come back within the TTL.
        killed = Worker("killed", 30.0, nodes5, store_node)
        try:
            assert killed.wait_holding(0, timeout=10.0) is not None
            killed.signal(signal.SIGKILL)
            killed_at = time.monotonic()
        finally:
            killed.finish(timeout=10)
        with Redlock(nodes5.urls, node_timeout=0.2, retry_delay_max=0.05) as dlm:
            lock = dlm.lock(RESOURCE, ttl=TTL)
            assert lock.acquire(timeout=TTL + 5.0)
            figures.recovery_s = time.monotonic() - killed_at
            lock.release()

        history = History()
        merge([*workers, killed], history)
        events = [e for w in workers for e in w.events]
        figures.attempted = sum(e["event"] in ("holding", "failed") for e in events)
        figures.succeeded = sum(e["event"] == "holding" for e in events)
        figures.failed_cleanly = sum(e["event"] == "failed" for e in events)
        problems = history.violations(exclusive=True)
        figures.violations = len(problems)

        # The unprotected copy: the same writes, in the order the list received them.
        with store_node.client() as client:
            plain = [int(t) for t in client.lrange(PLAIN_KEY, 0, -1)]
        backwards = sum(1 for a, b in itertools.pairwise(plain) if b < a)
        figures.extra.update(
            seed=seed, pauses=len(paused_for), pause_s=[round(p, 2) for p in paused_for],
            ttl_s=TTL, writes_tried=len(history.writes),
            writes_accepted=history.count(ACCEPTED), writes_rejected=history.count(REJECTED),
            overlaps_within_validity=len(history.overlaps()),
            unfenced_writes_out_of_order=backwards)

    assert not problems, problems
    assert len(paused_for) >= 3, "the workload never held the lock long enough to pause"
    # Paused holders came back with stale tokens and were turned away...
    assert history.count(REJECTED) >= 1
    # ...where an unprotected resource took their writes out of order.
    assert backwards >= 1
    assert figures.recovery_s is not None and figures.recovery_s < TTL + 1.0

