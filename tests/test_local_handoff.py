"""Handoff between waiters of one manager: a release wakes the longest local waiter at
once (no waiting out its backoff), and local acquire attempts on one resource take
turns instead of splitting the nodes between them. Real nodes, both clients."""

from __future__ import annotations

import asyncio
import threading
import time

from redlock import AsyncRedlock, Redlock
from redlock.testing import RedisNodes
from tests.internals import lines_idle

SLOW_BACKOFF = {"retry_delay_min": 1.5, "retry_delay_max": 3.0}


def test_sync_release_wakes_a_local_waiter_before_its_backoff_ends(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, node_timeout=0.5, **SLOW_BACKOFF) as dlm:
        holder = dlm.lock("handoff", ttl=10.0)
        assert holder.acquire(blocking=False)
        acquired_at: list[float] = []

        def wait() -> None:
            lock = dlm.lock("handoff", ttl=10.0)
            assert lock.acquire(timeout=10.0)
            acquired_at.append(time.monotonic())
            lock.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the waiter failed its first attempt and sleeps >= 1.5 s
        released_at = time.monotonic()
        holder.release()
        waiter.join(15)
        assert acquired_at
        # Woken by the release, not by its backoff (which had at least 1.2 s to go).
        assert acquired_at[0] - released_at < 1.0
        assert lines_idle(dlm)


async def test_async_release_wakes_a_local_waiter_before_its_backoff_ends(
        nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls, node_timeout=0.5, **SLOW_BACKOFF) as dlm:
        holder = dlm.lock("handoff", ttl=10.0)
        assert await holder.acquire(blocking=False)

        async def wait() -> float:
            lock = dlm.lock("handoff", ttl=10.0)
            assert await lock.acquire(timeout=10.0)
            at = time.monotonic()
            await lock.release()
            return at

        waiter = asyncio.ensure_future(wait())
        await asyncio.sleep(0.3)
        released_at = time.monotonic()
        await holder.release()
        acquired_at = await asyncio.wait_for(waiter, 15)
        assert acquired_at - released_at < 1.0
        assert lines_idle(dlm)


def test_sync_contending_threads_all_get_turns(nodes3: RedisNodes) -> None:
    """Eight threads, one lock, 160 acquisitions: every thread gets some (before local
    turns and wake-ups, one thread could get 1 of 125 while another got 200+)."""
    counts = [0] * 8
    remaining = [160]
    mutex = threading.Lock()
    with Redlock(nodes3.urls, node_timeout=0.5) as dlm:
        # Initialise the new cluster first: a thread that races another's initialisation
        # looks again one node timeout later (core._handle_amnesia), which is not
        # what this test measures.
        with dlm.lock("turns", ttl=10.0):
            pass

        def work(index: int) -> None:
            lock = dlm.lock("turns", ttl=10.0)
            while True:
                with mutex:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                assert lock.acquire(timeout=30.0)
                counts[index] += 1
                lock.release()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads)
        assert sum(counts) == 160
        assert min(counts) >= 5, counts
        assert lines_idle(dlm)


async def test_async_contending_tasks_all_get_turns(nodes3: RedisNodes) -> None:
    """The asyncio twin: eight tasks on one loop, one lock, 160 acquisitions."""
    counts = [0] * 8
    remaining = [160]
    async with AsyncRedlock(nodes3.urls, node_timeout=0.5) as dlm:
        async with dlm.lock("turns", ttl=10.0):  # initialise the new cluster first
            pass

        async def work(index: int) -> None:
            lock = dlm.lock("turns", ttl=10.0)
            while remaining[0] > 0:
                remaining[0] -= 1
                assert await lock.acquire(timeout=30.0)
                counts[index] += 1
                await lock.release()

        await asyncio.wait_for(asyncio.gather(*(work(i) for i in range(8))), 60)
        assert sum(counts) == 160
        assert min(counts) >= 5, counts
        assert lines_idle(dlm)


def test_sync_waiters_that_time_out_leave_the_line(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, node_timeout=0.5) as dlm:
        holder = dlm.lock("gone", ttl=10.0)
        assert holder.acquire(blocking=False)
        failed: list[bool] = []

        def wait() -> None:
            failed.append(not dlm.lock("gone", ttl=10.0).acquire(timeout=0.3))

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert failed == [True, True, True]
        assert lines_idle(dlm)
        holder.release()  # nobody waits: the notice is a no-op
        assert lines_idle(dlm)
        assert dlm.lock("gone", ttl=10.0).acquire(blocking=False)
