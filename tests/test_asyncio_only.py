"""What only the asyncio client has: cancellation (a cancelled acquire leaves no key
anywhere, even on nodes that run it late) and per-task ownership under
``asyncio.wait_for``. Real nodes; keys inspected straight on them."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio
import redis.connection

from redlock import AsyncRedlock, LockLost
from redlock.testing import RedisNodes
from tests.internals import turns_idle
from tests.peek import (
    any_lock_keys,
    delete_lock_keys,
    fence_counters,
    keep_busy,
    lock_keys,
    lock_pttls,
    lock_values,
)


async def initialise(dlm: AsyncRedlock) -> None:
    """One acquire/release with every node up: writes the node markers, warms the pools."""
    lock = dlm.lock("warm-up", ttl=5.0)
    assert await lock.acquire(blocking=False)
    await lock.release()


async def test_cancelling_tasks_blocked_on_a_held_lock_leaves_no_key(
        nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls, retry_delay_max=0.02) as dlm:
        holder = dlm.lock("r", ttl=10.0)
        assert await holder.acquire()
        token = holder.token
        waiter = dlm.lock("r", ttl=10.0)  # no deadline: only cancellation stops them
        tasks = [asyncio.create_task(waiter.acquire()) for _ in range(12)]
        rng = random.Random(7)
        for task in tasks:
            await asyncio.sleep(rng.uniform(0.0, 0.04))
            task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10.0)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        assert turns_idle(dlm)  # cancelled waiters left the local turns too
        # No waiter ever had a quorum: the holder's token is the highest committed one.
        # (A late node may have granted a waiter's attempt before the holder's own
        # acquire reached it, the holder having returned at its quorum: that waiter
        # failed and released; the node's counter only went up.)
        counters = fence_counters(nodes3, "r")
        assert counters.count(token) >= 2 and min(counters) == token, counters
        assert lock_values(nodes3, "r").count(lock_values(nodes3, "r")[0]) >= 2
        await holder.release()
        assert any_lock_keys(nodes3) == [[], [], []]
        fresh = dlm.lock("r", ttl=10.0)
        assert await fresh.acquire(blocking=False)  # nothing stale in the way
        await fresh.release()


@pytest.mark.parametrize("how", ["task.cancel", "wait_for"])
async def test_cancelling_mid_flight_on_slow_nodes_leaves_no_key(nodes3: RedisNodes,
                                                                 how: str) -> None:
    """The acquire script reaches every node and runs there after the cancellation."""
    async with AsyncRedlock(nodes3.urls, node_timeout=5.0) as dlm:
        await initialise(dlm)
        before = fence_counters(nodes3, "r")  # the initialising acquire took one
        busy = keep_busy(nodes3, 0.6)
        await asyncio.sleep(0.15)  # the scripts are running: the nodes read nothing now
        lock = dlm.lock("r", ttl=10.0)
        task = asyncio.create_task(lock.acquire(blocking=False))
        if how == "task.cancel":
            await asyncio.sleep(0.15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)
        else:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(task, 0.15)
        for thread in busy:
            thread.join(10.0)
    # Every node ran our acquire (its counter moved) and then our release.
    assert fence_counters(nodes3, "r") == [c + 1 for c in before]
    assert any_lock_keys(nodes3) == [[], [], []]


async def test_cancelling_mid_flight_with_paused_nodes_leaves_no_key(
        nodes5: RedisNodes) -> None:
    """Three of five nodes are SIGSTOPped while the acquire is in flight (it waits for a
    quorum), then come back.

    Their sockets hold our acquire script, which they run when resumed, long after the
    cancellation: the cleanup must still make sure no key of ours survives there.
    """
    async with AsyncRedlock(nodes5.urls, node_timeout=0.3) as dlm:
        await initialise(dlm)
        paused = nodes5[2:]
        for node in paused:
            node.pause()
        try:
            lock = dlm.lock("r", ttl=10.0)
            task = asyncio.create_task(lock.acquire(blocking=False))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)
            assert lock_keys(nodes5[:2], "r") == [False] * 2
        finally:
            for node in paused:
                node.resume()
        await asyncio.sleep(0.3)  # let the resumed nodes work through their sockets
    assert any_lock_keys(nodes5) == [[]] * 5


@pytest.mark.xfail(sys.version_info < (3, 12), strict=True, reason=(
    "ownership is per asyncio task and asyncio.wait_for() before Python 3.12 runs the"
    " coroutine in a new task: that task owns the acquisition, so the caller then gets"
    " NotHeld from token/release() and the lock stays until its TTL (with auto_extend,"
    " until the process exits). Use asyncio.timeout() (3.11+) around acquire() instead."))
async def test_acquire_under_wait_for_belongs_to_the_caller(nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls) as dlm:
        lock = dlm.lock("r", ttl=2.0)
        try:
            assert await asyncio.wait_for(lock.acquire(), 5.0)
            assert lock.token >= 1
            await lock.release()
            assert lock_keys(nodes3, "r") == [False] * 3
        finally:
            delete_lock_keys(nodes3, "r")


# -- renewals run in a thread of their own (redlock/_client/renewal_thread.py) -----------


def _renewal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "redlock-renewals"]


async def test_an_auto_extended_lock_outlives_a_blocked_event_loop(nodes3: RedisNodes) -> None:
    """The holder's event loop is blocked for three TTLs (CPU work, a sync call): a
    renewal task could not run, and the healthy lock would be lost. The renewal thread
    renews it meanwhile, so the lock is still held, its key is on every node with a
    fresh TTL, and it releases cleanly."""
    async with AsyncRedlock(nodes3.urls) as dlm:
        lock = dlm.lock("blocked-loop", ttl=0.5, auto_extend=True)
        assert await lock.acquire()
        token = lock.token
        time.sleep(1.5)  # blocks the loop: no task runs for 1.5 s
        lock.check()  # not lost
        assert lock.token == token
        assert lock_keys(nodes3, "blocked-loop") == [True, True, True]
        pttls = lock_pttls(nodes3, "blocked-loop")
        assert all(0 < pttl <= 500 for pttl in pttls), pttls
        await lock.release()
        assert any_lock_keys(nodes3) == [[], [], []]
    assert not _renewal_threads()  # close() waited for it


async def test_renewals_of_a_manager_over_asyncio_clients_use_their_settings(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    """Nodes given as ``redis.asyncio`` clients (here with a password the URLs do not
    carry): the renewal thread's blocking connections log in with the clients' settings,
    and a loss is told on the loop (``on_lost`` runs as a task of it)."""
    nodes = fresh_nodes(3, password="s3cret")
    clients = [redis.asyncio.Redis(host=n.host, port=n.port, password="s3cret")
               for n in nodes]
    lost_on: list[asyncio.AbstractEventLoop] = []
    try:
        async with AsyncRedlock(clients) as dlm:
            lock = dlm.lock("clients", ttl=0.4, auto_extend=True,
                            on_lost=lambda _: lost_on.append(asyncio.get_running_loop()))
            assert await lock.acquire()
            assert _renewal_threads()
            await asyncio.sleep(1.2)  # three renewals by the thread
            lock.check()
            delete_lock_keys(nodes, "clients")  # the next renewal finds it gone
            for _ in range(200):
                if lost_on:
                    break
                await asyncio.sleep(0.01)
            assert lost_on == [asyncio.get_running_loop()]
            with pytest.raises(LockLost):
                lock.check()
    finally:
        for client in clients:
            await client.aclose()
