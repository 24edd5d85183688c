"""A Redis Cluster as a node through the public API (docs/design.md §11.4, docs/operations.md
"Redis Cluster"), for both clients: alone (N=1, ``?cluster=yes``) and beside two standalone
nodes (N=3): a lock extended and released, a waiter in the nodes' line handed the lock, a
lock held past its TTL by auto-extend, a semaphore, a read-write lock and an election.
A real local cluster (3 masters, each with a replica)."""

from __future__ import annotations

import asyncio

import pytest

from redlock import Redlock
from redlock.testing import RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes
from tests.clients import Flavour


@pytest.fixture(params=["alone", "beside-two"])
def urls(request: pytest.FixtureRequest, redlock_redis_cluster: RedisClusterNodes,
         nodes3: RedisNodes) -> list[str]:
    cluster = redlock_redis_cluster.node_url
    urls = [cluster] if request.param == "alone" else [*nodes3.urls[:2], cluster]
    # The first acquire on the emptied nodes initialises them (16,384 hash slots' markers,
    # about half a second here): done first, so that the tests' non-blocking acquires
    # meet initialised nodes.
    with Redlock(urls) as dlm, dlm.lock("cl:warm-up", ttl=1.0, timeout=10.0):
        pass
    return urls


async def test_a_lock_is_extended_released_and_handed_to_a_waiter(
        flavour: Flavour, urls: list[str]) -> None:
    dlm = flavour.manager(urls)
    holder = flavour.actor("holder").on(dlm.lock("cl:orders", ttl=2.0))
    assert await holder.acquire(blocking=False)
    first = await holder.token()
    await holder.extend(5.0)
    assert await holder.validity() > 3.0
    waiter = flavour.actor("waiter").on(dlm.lock("cl:orders", ttl=2.0))
    pending = asyncio.ensure_future(waiter.acquire(timeout=5.0))
    await asyncio.sleep(0.3)
    assert not pending.done()  # in the nodes' line
    await holder.release()
    assert await asyncio.wait_for(pending, 5.0) is True
    assert await waiter.token() > first
    await waiter.release()


async def test_auto_extend_holds_a_lock_past_its_ttl(flavour: Flavour, urls: list[str]) -> None:
    dlm = flavour.manager(urls)
    me = flavour.actor("me")
    async with me.holding(dlm.lock("cl:renewed", ttl=1.0, auto_extend=True)) as held:
        await asyncio.sleep(2.0)
        await held.check()  # LockLost if a renewal failed
        rival = flavour.actor("rival").on(dlm.lock("cl:renewed", ttl=1.0))
        assert await rival.acquire(blocking=False) is False


async def test_the_family_on_a_cluster_node(flavour: Flavour, urls: list[str]) -> None:
    dlm = flavour.manager(urls)
    permits = [flavour.actor(f"p{i}").on(dlm.semaphore("cl:jobs", permits=2, ttl=5.0))
               for i in range(3)]
    assert [await p.acquire(blocking=False) for p in permits] == [True, True, False]
    await permits[0].release()
    assert await permits[2].acquire(blocking=False)
    for p in permits[1:]:
        await p.release()
    rw = dlm.rwlock("cl:doc", ttl=5.0)
    readers = [flavour.actor(f"r{i}").on(rw.read()) for i in range(2)]
    assert all([await r.acquire(blocking=False) for r in readers])
    writer = flavour.actor("w").on(rw.write())
    assert await writer.acquire(blocking=False) is False
    for r in readers:
        await r.release()
    assert await writer.acquire(blocking=False)
    await writer.release()
    a, b = (dlm.election("cl:cron", ttl=2.0, identity=name) for name in "ab")
    async with flavour.actor("a").holding(a.campaign(timeout=3.0)) as lead_a:
        term_a = await lead_a.token()
    async with flavour.actor("b").holding(b.campaign(timeout=3.0)) as lead_b:
        assert await lead_b.token() > term_a
