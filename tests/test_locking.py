"""Acquire, release, contention, waiting, reentrancy and mutual exclusion, on real nodes.

Every test with ``flavour`` runs on both clients (tests/clients.py); a lock's calls run
through an actor (``me`` and others), the owner of its acquisitions. Keys are inspected
straight on the nodes. Timing asserts are generous bounds (the machine is shared):
what is asserted exactly is the outcome: exact counters, strictly increasing tokens,
keys present or gone on each node, the exception type and its per-node outcomes.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from redlock import LockLost, LockNotAcquired, NotHeld, Outcome, QuorumUnavailable, RedlockError
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, Handle, Stopwatch
from tests.internals import KEYS
from tests.peek import (
    any_lock_keys,
    decided_as,
    fence_counters,
    get,
    lock_keys,
    lock_pttls,
    lock_values,
    strictly_increasing,
)

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# acquire / release / with-block
# ---------------------------------------------------------------------------


async def test_acquire_extend_release(flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    lock = me.on(flavour.manager(nodes3).lock("orders:42", ttl=5.0))
    assert not await lock.locked()
    assert await lock.validity() == 0.0
    assert await lock.acquire(blocking=False) is True
    token = await lock.token()
    assert isinstance(token, int) and token >= 1
    assert 0 < await lock.validity() <= 5.0
    assert await lock.locked() and not await lock.lost()
    await lock.check()
    assert lock_keys(nodes3, "orders:42") == [True] * 3
    owners = lock_values(nodes3, "orders:42")
    assert len(set(owners)) == 1 and len(owners[0] or b"") >= 32  # one secret owner, 128+ bits
    assert all(0 < pttl <= 5000 for pttl in lock_pttls(nodes3, "orders:42"))

    await lock.extend(20.0)
    assert await lock.validity() > 5.0
    assert all(pttl > 5000 for pttl in lock_pttls(nodes3, "orders:42"))
    assert await lock.token() == token  # extending keeps the token

    await lock.release()
    assert lock_keys(nodes3, "orders:42") == [False] * 3
    assert not await lock.locked()
    assert await lock.validity() == 0.0
    with pytest.raises(NotHeld):
        await lock.token()
    await lock.release()  # idempotent

    assert await lock.acquire(blocking=False)
    assert await lock.token() > token  # the next holder's token is larger
    await lock.release()


async def test_with_block_yields_the_held_lock_and_releases_on_error(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    handle = dlm.lock("r", ttl=5.0, timeout=2.0)
    async with me.holding(handle) as held:
        assert held.handle is handle and isinstance(handle, flavour.lock_class)
        assert await held.token() >= 1
        assert lock_keys(nodes3, "r") == [True] * 3
    assert lock_keys(nodes3, "r") == [False] * 3

    with pytest.raises(KeyError):
        async with me.holding(dlm.lock("r", ttl=5.0)):
            raise KeyError("boom")
    assert lock_keys(nodes3, "r") == [False] * 3


async def test_release_is_idempotent_and_needs_a_holder(flavour: Flavour, me: Actor,
                                                        nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    with pytest.raises(NotHeld):
        await me.on(dlm.lock("rel:x")).release()
    lock = me.on(dlm.lock("rel:x"))
    assert await lock.acquire(blocking=False)
    await lock.release()
    await lock.release()
    assert lock_keys(nodes3, "rel:x") == [False] * 3
    with pytest.raises(NotHeld):
        await lock.check()
    assert await lock.acquire(blocking=False)  # the handle can be used again
    await lock.release()


async def test_release_never_deletes_another_owners_key(flavour: Flavour, me: Actor,
                                                        nodes3: RedisNodes) -> None:
    resource = "rel:other"
    mine = me.on(flavour.manager(nodes3).lock(resource, ttl=10.0))
    assert await mine.acquire(blocking=False)
    # Someone else's key replaces ours on every node (as after an expiry and re-acquire).
    for node in nodes3:
        with node.client() as client:
            client.set(KEYS.lock(resource), "someone-else", px=10_000)
    with pytest.raises(LockLost, match="3 of 3 nodes no longer held our key"):
        await mine.release()  # ours was taken: the caller learns it
    assert lock_values(nodes3, resource) == [b"someone-else"] * 3


async def test_namespace_changes_key_names(flavour: Flavour, me: Actor,
                                           nodes3: RedisNodes) -> None:
    mine = me.on(flavour.manager(nodes3, namespace="billing").lock("invoice:7"))
    assert await mine.acquire(blocking=False)
    for node in nodes3:
        with node.client() as client:
            keys = sorted(k.decode() for k in client.keys("*"))
        assert keys == ["billing:node:fence", "billing:node:horizon", "billing:node:marker",
                        "billing:{invoice:7}:lock"]
    # Another namespace is another set of locks: no contention.
    theirs = me.on(flavour.manager(nodes3).lock("invoice:7"))
    assert await theirs.acquire(blocking=False)
    assert lock_keys(nodes3, "invoice:7") == [True] * 3  # redlock:{invoice:7}:lock
    await theirs.release()
    await mine.release()


# ---------------------------------------------------------------------------
# contention and waiting
# ---------------------------------------------------------------------------


async def test_contention_is_refused_with_reasons_not_reported_as_an_outage(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    resource = "cfg:busy"
    holder = me.on(flavour.manager(cluster).lock(resource, ttl=5.0))
    assert await holder.acquire(blocking=False)
    other, them = flavour.manager(cluster), flavour.actor("them")
    rival = them.on(other.lock(resource, ttl=5.0))
    overall = Stopwatch()
    assert await rival.acquire(blocking=False) is False
    assert rival.last_failure is not None
    outcomes = rival.last_failure.outcomes
    assert decided_as(outcomes, [Outcome.REFUSED] * len(cluster), other.quorum), outcomes
    assert all(r.pttl_ms is not None and 0 < r.pttl_ms <= 5000
               for r in outcomes if r.outcome is Outcome.REFUSED)

    took = Stopwatch()
    with pytest.raises(LockNotAcquired) as caught:
        async with them.holding(other.lock(resource, ttl=5.0, timeout=0.3)):
            pytest.fail("entered a held lock")
    assert took() < 3.0
    error = caught.value
    assert not isinstance(error, QuorumUnavailable)  # contention, not an outage
    assert error.resource == resource
    assert decided_as(error.outcomes, [Outcome.REFUSED] * len(cluster),
                      other.quorum), error.outcomes
    assert "held by another owner" in str(error)
    assert all(r.pttl_ms is not None and r.pttl_ms > 0
               for r in error.outcomes if r.outcome is Outcome.REFUSED)
    assert overall() < 10.0
    assert lock_keys(cluster, resource) == [True] * len(cluster)  # the holder's keys stay
    await holder.release()


async def test_blocking_acquire_waits_for_the_holder(flavour: Flavour, me: Actor,
                                                     nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    holder = me.on(dlm.lock("r", ttl=5.0))
    assert await holder.acquire()
    first = await holder.token()
    waiter = flavour.actor("waiter")
    task = asyncio.create_task(waiter.cycle(dlm.lock("r", ttl=5.0, timeout=10.0)))
    await asyncio.sleep(0.2)
    assert not task.done()  # blocked while the holder holds
    await holder.release()
    assert await asyncio.wait_for(task, 10.0) > first


async def test_blocking_acquire_gives_up_at_its_timeout(flavour: Flavour, me: Actor,
                                                        nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    holder = me.on(dlm.lock("r", ttl=5.0))
    assert await holder.acquire()
    took = Stopwatch()
    assert await flavour.actor().on(dlm.lock("r", ttl=5.0)).acquire(timeout=0.4) is False
    assert 0.35 <= took() < 5.0
    await holder.release()


async def test_one_handle_shared_by_owners_gives_each_its_own_acquisition(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    handle = flavour.manager(nodes3).lock("r", ttl=5.0, timeout=10.0)
    first, second = flavour.actor("first").on(handle), flavour.actor("second").on(handle)
    assert await first.acquire()
    first_token = await first.token()
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.2)
    assert not waiting.done()
    with pytest.raises(NotHeld):  # this owner holds nothing through the handle
        await me.on(handle).token()
    await first.release()
    assert await asyncio.wait_for(waiting, 10.0)
    assert first_token < await second.token()
    await second.release()


# ---------------------------------------------------------------------------
# reentrancy
# ---------------------------------------------------------------------------


async def test_reentrant_lock_is_reentered_per_owner_with_the_same_token(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    resource = "re:entrant"
    dlm = flavour.manager(nodes3)
    outer = me.on(dlm.lock(resource, ttl=5.0, reentrant=True))
    inner = me.on(dlm.lock(resource, ttl=5.0, reentrant=True))  # another handle, same owner
    assert await outer.acquire(blocking=False)
    token = await outer.token()
    assert await outer.acquire(blocking=False) and await outer.token() == token
    assert await inner.acquire(blocking=False) and await inner.token() == token
    async with me.holding(outer.handle) as held:
        assert await held.token() == token
    # Reentrancy is per owner (thread or task), never global.
    assert await flavour.actor().on(outer.handle).acquire(blocking=False) is False

    await inner.release()
    await outer.release()
    assert lock_keys(nodes3, resource) == [True] * 3  # still one level deep
    assert await outer.locked()
    await outer.check()
    await outer.release()
    assert lock_keys(nodes3, resource) == [False] * 3
    assert fence_counters(nodes3, resource) == [token] * 3  # re-entries took no new token
    assert await me.cycle(dlm.lock(resource, timeout=5.0)) > token


async def test_non_reentrant_lock_refuses_to_nest(flavour: Flavour, me: Actor,
                                                  nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    lock = me.on(dlm.lock("re:plain"))
    assert await lock.acquire(blocking=False)
    with pytest.raises(RedlockError, match="reentrant"):
        await lock.acquire(blocking=False)
    # A second handle of the same owner is another acquisition: it is simply refused.
    assert not await me.on(dlm.lock("re:plain")).acquire(blocking=False)
    await lock.release()


# ---------------------------------------------------------------------------
# mutual exclusion
# ---------------------------------------------------------------------------


@dataclass
class Shared:
    """A counter that loses updates unless its users are serialised, and the holds."""

    counter: int = 0
    inside: int = 0
    max_inside: int = 0
    holds: list[tuple[float, float, int]] = field(default_factory=list)

    async def bump(self) -> None:
        """Read, yield, write: deliberately racy."""
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        value = self.counter
        await asyncio.sleep(0.002)
        self.counter = value + 1
        self.inside -= 1

    async def hold(self, actor: Actor, handle: Handle, rounds: int) -> None:
        for _ in range(rounds):
            async with actor.holding(handle) as held:
                entered, token = time.monotonic(), await held.token()
                await self.bump()
                left = time.monotonic()
            self.holds.append((entered, left, token))

    def assert_exclusive(self, expected: int) -> None:
        assert self.counter == expected
        assert self.max_inside == 1
        assert len(self.holds) == expected
        holds = sorted(self.holds)
        assert strictly_increasing([token for _, _, token in holds])
        for (_, left, _), (entered, _, _) in itertools.pairwise(holds):
            assert left <= entered, "two holders overlapped"


async def test_the_counter_race_is_real_without_the_lock() -> None:
    shared = Shared()
    await asyncio.gather(*(shared.bump() for _ in range(8)))
    assert shared.counter < 8  # so the exact counts below are the lock's doing


async def test_owners_exclude_each_other_exact_counter_and_increasing_tokens(
        flavour: Flavour, cluster: RedisNodes) -> None:
    """Eight owners on two managers: on each manager two owners share one handle (each
    gets its own acquisition through it), two have handles of their own."""
    owners, rounds = 8, 8
    managers = [flavour.manager(cluster) for _ in range(2)]
    shared_handles = [dlm.lock("mx", ttl=10.0, timeout=30.0) for dlm in managers]
    shared = Shared()
    await asyncio.gather(*(
        shared.hold(flavour.actor(f"owner-{i}", limit=90.0),
                    shared_handles[i % 2] if i < 4
                    else managers[i % 2].lock("mx", ttl=10.0, timeout=30.0), rounds)
        for i in range(owners)))
    shared.assert_exclusive(owners * rounds)
    # Every lock key is gone once everybody released.
    assert any_lock_keys(cluster) == [[]] * len(cluster)


@pytest.mark.parametrize("nodes_fixture", ["nodes3", "nodes5"])
async def test_owners_exclude_each_other_with_a_hung_node(
        request: pytest.FixtureRequest, flavour: Flavour, me: Actor, nodes_fixture: str) -> None:
    """Every acquire and release round also waits out a SIGSTOPped node (and reconnects
    to it): the failure path runs concurrently in every owner."""
    nodes: RedisNodes = request.getfixturevalue(nodes_fixture)
    dlm = flavour.manager(nodes, node_timeout=0.05)
    await me.cycle(dlm.lock("mx:hung", timeout=5.0))
    nodes[1].pause()
    owners, rounds = 4, 5
    shared = Shared()
    await asyncio.gather(*(
        shared.hold(flavour.actor(f"owner-{i}", limit=90.0),
                    dlm.lock("mx:hung", ttl=10.0, timeout=45.0), rounds)
        for i in range(owners)))
    shared.assert_exclusive(owners * rounds)


# -- processes (sync client only: each worker process runs its own Redlock) ----


def test_processes_mutual_exclusion_exact_counter(cluster: RedisNodes) -> None:
    processes, rounds = 3, 20
    counter_node = cluster[0]
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests.workers.counter_worker", counter_node.url,
                          str(rounds), *cluster.urls],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    outputs = []
    try:
        for proc in workers:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            outputs.append([int(line) for line in out.split()])
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert int(get(counter_node, "mx:count") or 0) == processes * rounds
    every = [token for tokens in outputs for token in tokens]
    assert len(every) == processes * rounds
    assert len(set(every)) == len(every), "two holders got the same token"
    for tokens in outputs:  # each process saw its own tokens strictly increase
        assert strictly_increasing(tokens), tokens


# A holder that reports when it held the lock: CLOCK_MONOTONIC is system-wide on Linux,
# so hold intervals of different processes can be ordered.
TIMED_WORKER = """
import sys, time, redis
from redlock import Redlock
counter_url, processes, rounds, *urls = sys.argv[1:]
counter = redis.Redis.from_url(counter_url)
with Redlock(urls, node_timeout=0.25, retry_delay_max=0.05) as dlm:
    counter.incr("mx:ready")  # start together, so that the processes really contend
    while int(counter.get("mx:ready")) < int(processes):
        time.sleep(0.005)
    for _ in range(int(rounds)):
        with dlm.lock("mx:timed", ttl=10.0, timeout=60.0) as held:
            entered = time.monotonic()
            token = held.token
            value = int(counter.get("mx:timed-count") or 0)
            time.sleep(0.003)
            counter.set("mx:timed-count", value + 1)
            left = time.monotonic()
        print(entered, left, token, flush=True)
        time.sleep(0.01)  # give the others a chance: waiters poll, they are not woken
"""


@pytest.mark.parametrize("nodes_fixture", ["nodes3", "nodes5"])
def test_processes_tokens_increase_in_hold_order(
    request: pytest.FixtureRequest, nodes_fixture: str,
) -> None:
    nodes: RedisNodes = request.getfixturevalue(nodes_fixture)
    processes, rounds = 3, 8
    workers = [
        subprocess.Popen([sys.executable, "-c", TIMED_WORKER, nodes[0].url, str(processes),
                          str(rounds), *nodes.urls],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    holds: list[tuple[float, float, int, int]] = []
    try:
        for proc in workers:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            for line in out.splitlines():
                entered, left, token = line.split()
                holds.append((float(entered), float(left), int(token), proc.pid))
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(holds) == processes * rounds
    assert int(get(nodes[0], "mx:timed-count") or 0) == processes * rounds
    holds.sort()
    assert strictly_increasing([token for _, _, token, _ in holds])
    for (_, left, _, _), (entered, _, _, _) in itertools.pairwise(holds):
        assert left <= entered, "holders in two processes overlapped"
    # The lock really changed hands between processes (not three runs one after another).
    handovers = sum(1 for a, b in itertools.pairwise(holds) if a[3] != b[3])
    print(f"\n{handovers} handovers between processes in {len(holds)} holds")
    assert handovers >= processes
