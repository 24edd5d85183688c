"""The local turns of one manager: a release wakes the longest local waiter at
once (no waiting out its backoff), and local acquire attempts on one resource take
turns instead of splitting the nodes between them. Real nodes, both clients
(tests/clients.py): the owners are threads (sync) or tasks (async)."""

from __future__ import annotations

import asyncio
import time

from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour
from tests.internals import turns_idle

SLOW_BACKOFF = {"retry_delay_min": 1.5, "retry_delay_max": 3.0}


async def test_release_wakes_a_local_waiter_before_its_backoff_ends(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    dlm = flavour.bare_manager(nodes3, node_timeout=0.5, **SLOW_BACKOFF)
    holder = me.on(dlm.lock("handoff", ttl=10.0))
    assert await holder.acquire(blocking=False)
    lock = dlm.lock("handoff", ttl=10.0)
    waiter = asyncio.create_task(flavour.actor("waiter").call_all(
        lambda: lock.acquire(timeout=10.0), time.monotonic, lock.release))
    await asyncio.sleep(0.3)  # the waiter failed its first attempt and sleeps >= 1.5 s
    released_at = time.monotonic()
    await holder.release()
    acquired, acquired_at, _ = await asyncio.wait_for(waiter, 15)
    assert acquired
    # Woken by the release, not by its backoff (which had at least 1.2 s to go).
    assert acquired_at - released_at < 1.0
    assert turns_idle(dlm)


async def test_contending_owners_all_get_turns(flavour: Flavour, me: Actor,
                                               nodes3: RedisNodes) -> None:
    """Eight owners, one lock, 160 acquisitions: every owner gets some (before local
    turns and wake-ups, one thread could get 1 of 125 while another got 200+)."""
    counts = [0] * 8
    remaining = [160]
    dlm = flavour.bare_manager(nodes3, node_timeout=0.5)
    # Initialise the new cluster first: an owner that races another's initialisation
    # looks again one node timeout later (the amnesia check), which is not what this
    # test measures.
    await me.cycle(dlm.lock("turns", ttl=10.0))

    async def work(index: int) -> None:
        lock = flavour.actor(f"owner-{index}").on(dlm.lock("turns", ttl=10.0))
        while remaining[0] > 0:
            remaining[0] -= 1
            assert await lock.acquire(timeout=30.0)
            counts[index] += 1
            await lock.release()

    await asyncio.wait_for(asyncio.gather(*(work(i) for i in range(8))), 60)
    assert sum(counts) == 160
    assert min(counts) >= 5, counts
    assert turns_idle(dlm)


async def test_waiters_that_time_out_leave_the_line(flavour: Flavour, me: Actor,
                                                    nodes3: RedisNodes) -> None:
    dlm = flavour.bare_manager(nodes3, node_timeout=0.5)
    holder = me.on(dlm.lock("gone", ttl=10.0))
    assert await holder.acquire(blocking=False)
    acquired = await asyncio.gather(*(
        flavour.actor().on(dlm.lock("gone", ttl=10.0)).acquire(timeout=0.3)
        for _ in range(3)))
    assert acquired == [False, False, False]
    assert turns_idle(dlm)
    await holder.release()  # nobody waits: the notice is a no-op
    assert turns_idle(dlm)
    assert await me.on(dlm.lock("gone", ttl=10.0)).acquire(blocking=False)
