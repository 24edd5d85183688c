"""AsyncRedlock / AsyncLock against real redis-server processes.

Keys are inspected with plain redis-py clients straight on the nodes. Timing asserts are
generous bounds (the machine is shared), never tight figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio

from redlock import (
    AsyncLock,
    AsyncRedlock,
    LockLost,
    LockNotAcquired,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    RedlockError,
)
from redlock.testing import RedisNodes


def within(seconds: float) -> Any:
    """A hang guard that keeps the current task as the lock owner.

    (``asyncio.wait_for(lock.acquire(), ...)`` would not: before Python 3.12 it runs the
    coroutine in a new task, which then owns the acquisition.)
    """
    timeout = getattr(asyncio, "timeout", None)
    return timeout(seconds) if timeout is not None else contextlib.nullcontext()


def lock_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:lock"


def fence_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:fence"


def on_nodes(nodes: Sequence[Any], command: Callable[[redis.Redis], Any]) -> list[Any]:
    """Run ``command`` on each node with a plain client (the node must be running)."""
    results = []
    for node in nodes:
        with node.client() as client:
            results.append(command(client))
    return results


def keys_present(nodes: Sequence[Any], resource: str) -> list[int]:
    return on_nodes(nodes, lambda c: int(c.exists(lock_key(resource))))


def any_lock_keys(nodes: Sequence[Any]) -> list[list[bytes]]:
    return on_nodes(nodes, lambda c: sorted(c.scan_iter(match="redlock:*:lock")))


def counters(nodes: Sequence[Any], resource: str) -> list[int]:
    return on_nodes(nodes, lambda c: int(c.get(fence_key(resource)) or 0))


@pytest.fixture
async def dlm3(nodes3: RedisNodes) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(nodes3.urls) as dlm:
        yield dlm


@pytest.fixture
async def dlm5(nodes5: RedisNodes) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(nodes5.urls, node_timeout=0.1) as dlm:
        yield dlm


async def initialise(dlm: AsyncRedlock) -> int:
    """One acquire/release with every node up: writes the node markers, warms the pools."""
    lock = dlm.lock("warm-up", ttl=5.0)
    assert await lock.acquire(blocking=False)
    token = lock.token
    await lock.release()
    return token


# ---------------------------------------------------------------------------
# acquire / release / extend
# ---------------------------------------------------------------------------


async def test_acquire_extend_release(dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    lock = dlm3.lock("orders:42", ttl=5.0)
    assert not lock.locked()
    assert lock.validity == 0.0
    assert await lock.acquire(blocking=False) is True
    token = lock.token
    assert isinstance(token, int) and token >= 1
    assert 0 < lock.validity <= 5.0
    assert lock.locked() and not lock.lost
    lock.check()
    assert keys_present(nodes3, "orders:42") == [1, 1, 1]
    owners = on_nodes(nodes3, lambda c: c.get(lock_key("orders:42")))
    assert len(set(owners)) == 1 and len(owners[0]) >= 32  # one secret owner value, 128+ bits
    assert all(0 < pttl <= 5000 for pttl in on_nodes(nodes3, lambda c: c.pttl(
        lock_key("orders:42"))))

    await lock.extend(ttl=20.0)
    assert lock.validity > 5.0
    assert all(pttl > 5000 for pttl in on_nodes(nodes3, lambda c: c.pttl(lock_key("orders:42"))))
    assert lock.token == token  # extending keeps the token

    await lock.release()
    assert keys_present(nodes3, "orders:42") == [0, 0, 0]
    assert not lock.locked()
    assert lock.validity == 0.0
    with pytest.raises(NotHeld):
        _ = lock.token
    await lock.release()  # idempotent

    assert await lock.acquire(blocking=False)
    assert lock.token > token  # the next holder's token is larger
    await lock.release()


async def test_async_with_yields_the_held_lock_and_releases_on_error(
        dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    async with dlm3.lock("r", ttl=5.0, timeout=2.0) as held:
        assert isinstance(held, AsyncLock)
        assert held.token >= 1
        assert keys_present(nodes3, "r") == [1, 1, 1]
    assert keys_present(nodes3, "r") == [0, 0, 0]

    with pytest.raises(KeyError):
        async with dlm3.lock("r", ttl=5.0) as held:
            raise KeyError("boom")
    assert keys_present(nodes3, "r") == [0, 0, 0]


async def test_contention_nonblocking_false_and_with_block_raises_with_outcomes(
        dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    holder = dlm3.lock("r", ttl=5.0)
    assert await holder.acquire(blocking=False)
    async with AsyncRedlock(nodes3.urls) as other:
        rival = other.lock("r", ttl=5.0)
        started = time.monotonic()
        assert await rival.acquire(blocking=False) is False
        assert rival.last_failure is not None
        outcomes = rival.last_failure.outcomes
        assert [r.outcome for r in outcomes] == [Outcome.REFUSED] * 3
        assert all(r.pttl_ms is not None and 0 < r.pttl_ms <= 5000 for r in outcomes)

        with pytest.raises(LockNotAcquired) as caught:
            async with other.lock("r", ttl=5.0, timeout=0.3):
                raise AssertionError("entered while another holds the lock")
        assert not isinstance(caught.value, QuorumUnavailable)  # contention, not outage
        assert caught.value.resource == "r"
        assert len(caught.value.outcomes) == 3
        assert time.monotonic() - started < 10.0
    assert keys_present(nodes3, "r") == [1, 1, 1]  # the holder's keys were left alone
    await holder.release()


async def test_blocking_acquire_waits_for_the_holder(dlm3: AsyncRedlock) -> None:
    holder = dlm3.lock("r", ttl=5.0)
    assert await holder.acquire()
    first = holder.token
    waiter = dlm3.lock("r", ttl=5.0, timeout=10.0)

    async def wait_then_hold() -> int:
        async with waiter as held:
            return held.token

    task = asyncio.create_task(wait_then_hold())
    await asyncio.sleep(0.2)
    assert not task.done()  # blocked while the holder holds
    await holder.release()
    assert await asyncio.wait_for(task, 10.0) > first


async def test_blocking_acquire_gives_up_at_its_timeout(dlm3: AsyncRedlock) -> None:
    holder = dlm3.lock("r", ttl=5.0)
    assert await holder.acquire()
    started = time.monotonic()
    assert await dlm3.lock("r", ttl=5.0).acquire(timeout=0.4) is False
    assert 0.35 <= time.monotonic() - started < 5.0
    await holder.release()


async def test_expired_lock_reports_lost_and_frees_the_resource(dlm3: AsyncRedlock) -> None:
    lock = dlm3.lock("r", ttl=0.3)
    assert await lock.acquire()
    await asyncio.sleep(0.45)
    assert not lock.locked()
    with pytest.raises(LockLost, match="expired"):
        lock.check()
    with pytest.raises(LockLost):
        _ = lock.token
    other = dlm3.lock("r", ttl=5.0)
    assert await other.acquire(blocking=False)
    await other.release()
    with pytest.raises(LockLost, match="validity had run out"):
        await lock.release()  # our key is gone: nothing to delete, but the caller learns it
    await lock.release()  # a second release is a no-op


# ---------------------------------------------------------------------------
# mutual exclusion and tokens
# ---------------------------------------------------------------------------


@dataclass
class Shared:
    counter: int = 0
    inside: int = 0
    max_inside: int = 0
    tokens: list[int] = field(default_factory=list)


async def bump(shared: Shared) -> None:
    """Read, yield to the loop, write: loses updates unless serialised."""
    shared.inside += 1
    shared.max_inside = max(shared.max_inside, shared.inside)
    value = shared.counter
    await asyncio.sleep(0.002)
    shared.counter = value + 1
    shared.inside -= 1


async def test_many_tasks_over_several_managers_exclude_each_other(
        nodes3: RedisNodes) -> None:
    managers, tasks_per_manager, rounds = 4, 5, 5
    shared = Shared()
    dlms = [AsyncRedlock(nodes3.urls, retry_delay_max=0.05) for _ in range(managers)]
    try:
        async def worker(handle: AsyncLock) -> None:
            for _ in range(rounds):
                async with handle as held:
                    shared.tokens.append(held.token)
                    await bump(shared)

        # One handle per manager, shared by its tasks: each task gets its own acquisition.
        handles = [dlm.lock("counter", ttl=10.0, timeout=60.0) for dlm in dlms]
        await asyncio.wait_for(asyncio.gather(*(
            worker(handles[m]) for m in range(managers) for _ in range(tasks_per_manager))),
            120.0)
    finally:
        for dlm in dlms:
            await dlm.close()
    expected = managers * tasks_per_manager * rounds
    assert shared.counter == expected
    assert shared.max_inside == 1
    assert len(shared.tokens) == expected
    assert all(a < b for a, b in itertools.pairwise(shared.tokens))
    assert any_lock_keys(nodes3) == [[], [], []]


async def test_the_counter_race_is_real_without_the_lock() -> None:
    shared = Shared()
    await asyncio.gather(*(bump(shared) for _ in range(8)))
    assert shared.counter < 8  # so the exact count above is the lock's doing


async def test_tokens_strictly_increase_across_managers(nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls) as one, AsyncRedlock(nodes3.urls) as two:
        tokens = []
        for i in range(150):
            lock = (one if i % 2 else two).lock("seq", ttl=5.0)
            assert await lock.acquire(blocking=False)
            tokens.append(lock.token)
            await lock.release()
    assert all(a < b for a, b in itertools.pairwise(tokens))
    assert counters(nodes3, "seq") == [tokens[-1]] * 3


# ---------------------------------------------------------------------------
# quorum with hung nodes
# ---------------------------------------------------------------------------


async def test_two_of_five_paused_still_acquires(dlm5: AsyncRedlock, nodes5: RedisNodes) -> None:
    before = await initialise(dlm5)
    nodes5[3].pause()
    nodes5[4].pause()
    try:
        lock = dlm5.lock("r", ttl=5.0)
        async with within(10.0):
            assert await lock.acquire(blocking=False)
        assert lock.token == before == 1  # each resource has its own counter
        assert keys_present(nodes5[:3], "r") == [1, 1, 1]
        async with within(10.0):
            await lock.extend()  # 3 acks are a quorum
            await lock.release()
        assert keys_present(nodes5[:3], "r") == [0, 0, 0]
    finally:
        nodes5[3].resume()
        nodes5[4].resume()
    # The hung nodes ran our acquire when they came back, and our release right after it.
    await asyncio.sleep(0.3)
    assert any_lock_keys(nodes5) == [[]] * 5


async def test_three_of_five_paused_fails_fast_with_per_node_outcomes(
        dlm5: AsyncRedlock, nodes5: RedisNodes) -> None:
    await initialise(dlm5)
    paused = [nodes5[1], nodes5[3], nodes5[4]]
    for node in paused:
        node.pause()
    try:
        lock = dlm5.lock("r", ttl=5.0)
        started = time.monotonic()
        with pytest.raises(QuorumUnavailable) as caught:
            async with within(10.0):
                await lock.acquire(blocking=False)
        assert time.monotonic() - started < 3.0
        failure = caught.value
        assert isinstance(failure, LockNotAcquired) and isinstance(failure, RedlockError)
        by_node = {r.node: r for r in failure.outcomes}
        assert list(by_node) == list(dlm5.nodes)
        for node in nodes5:
            result = by_node[f"{node.host}:{node.port}"]
            assert result.outcome is (Outcome.ERROR if node in paused else Outcome.GRANTED)
            if node in paused:
                assert "Timeout" in result.detail or "within" in result.detail
        assert "2 of 5 nodes granted, need 3" in str(failure)
        # The failed attempt released the keys it did get.
        assert keys_present([nodes5[0], nodes5[2]], "r") == [0, 0]

        started = time.monotonic()
        with pytest.raises(QuorumUnavailable):
            async with within(10.0):
                await lock.acquire(timeout=0.5)
        assert 0.45 <= time.monotonic() - started < 5.0
    finally:
        for node in paused:
            node.resume()


# ---------------------------------------------------------------------------
# asyncio cancellation during acquire leaves no key behind
# ---------------------------------------------------------------------------


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
        assert dlm._lines.idle()  # cancelled waiters left the local line too
        assert counters(nodes3, "r") == [token] * 3  # no waiter was ever granted anywhere
        await holder.release()
        assert any_lock_keys(nodes3) == [[], [], []]
        fresh = dlm.lock("r", ttl=10.0)
        assert await fresh.acquire(blocking=False)  # nothing stale in the way
        await fresh.release()


BUSY_SCRIPT = """
local start = redis.call('TIME')
while true do
    local now = redis.call('TIME')
    if (now[1] - start[1]) * 1000000 + (now[2] - start[2]) >= tonumber(ARGV[1]) then
        return 1
    end
end
"""


def keep_busy(nodes: Sequence[Any], seconds: float) -> list[threading.Thread]:
    """Each node runs a script for ``seconds``: a slow node, which still reads its socket
    afterwards (unlike CLIENT PAUSE, which drops a blocked client's command on close)."""
    def run(node: Any) -> None:
        with node.client(socket_timeout=30) as client:
            client.eval(BUSY_SCRIPT, 0, int(seconds * 1_000_000))

    threads = [threading.Thread(target=run, args=(node,), daemon=True) for node in nodes]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.parametrize("how", ["task.cancel", "wait_for"])
async def test_cancelling_mid_flight_on_slow_nodes_leaves_no_key(nodes3: RedisNodes,
                                                                 how: str) -> None:
    """The acquire script reaches every node and runs there after the cancellation."""
    async with AsyncRedlock(nodes3.urls, node_timeout=5.0) as dlm:
        await initialise(dlm)
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
    assert counters(nodes3, "r") == [1, 1, 1]
    assert any_lock_keys(nodes3) == [[], [], []]


async def test_cancelling_mid_flight_with_paused_nodes_leaves_no_key(
        nodes5: RedisNodes) -> None:
    """Two of five nodes are SIGSTOPped while the acquire is in flight, then come back.

    Their sockets hold our acquire script, which they run when resumed, long after the
    cancellation: the cleanup must still make sure no key of ours survives there.
    """
    async with AsyncRedlock(nodes5.urls, node_timeout=0.3) as dlm:
        await initialise(dlm)
        nodes5[3].pause()
        nodes5[4].pause()
        try:
            lock = dlm.lock("r", ttl=10.0)
            task = asyncio.create_task(lock.acquire(blocking=False))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)
            assert keys_present(nodes5[:3], "r") == [0, 0, 0]
        finally:
            nodes5[3].resume()
            nodes5[4].resume()
        await asyncio.sleep(0.3)  # let the resumed nodes work through their sockets
    assert any_lock_keys(nodes5) == [[], [], [], [], []]


# ---------------------------------------------------------------------------
# auto-extend and lost locks
# ---------------------------------------------------------------------------


async def test_auto_extend_keeps_the_lock_past_its_ttl(dlm3: AsyncRedlock,
                                                       nodes3: RedisNodes) -> None:
    lost: list[AsyncLock] = []
    lock = dlm3.lock("r", ttl=0.6, auto_extend=True, on_lost=lost.append)
    assert await lock.acquire()
    token = lock.token
    await asyncio.sleep(1.5)  # 2.5 ttls
    assert lock.locked() and not lock.lost and not lost
    assert lock.token == token
    assert keys_present(nodes3, "r") == [1, 1, 1]
    await lock.release()
    assert keys_present(nodes3, "r") == [0, 0, 0]
    await asyncio.sleep(0.5)  # a stopped watchdog does not bring the key back
    assert keys_present(nodes3, "r") == [0, 0, 0]
    assert not lost


async def test_watchdog_on_lost_sync_callback_when_a_majority_drops_the_key(
        dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    fired = asyncio.Event()
    seen: list[AsyncLock] = []

    def on_lost(handle: AsyncLock) -> None:
        seen.append(handle)
        fired.set()

    lock = dlm3.lock("r", ttl=1.0, auto_extend=True, on_lost=on_lost)
    assert await lock.acquire()
    on_nodes(nodes3[1:], lambda c: c.delete(lock_key("r")))  # someone broke our lock
    await asyncio.wait_for(fired.wait(), 5.0)
    assert seen == [lock]
    assert lock.lost and not lock.locked()
    with pytest.raises(LockLost, match="majority") as caught:
        lock.check()
    assert [r.outcome for r in caught.value.outcomes].count(Outcome.REFUSED) == 2
    with pytest.raises(LockLost):
        _ = lock.token
    with pytest.raises(LockLost):
        await lock.extend()
    with pytest.raises(LockLost):
        await lock.release()  # a lost lock: release says so
    assert keys_present(nodes3, "r") == [0, 0, 0]  # the watchdog dropped what was left


async def test_watchdog_on_lost_async_callback_when_a_majority_hangs(
        nodes3: RedisNodes) -> None:
    fired = asyncio.Event()

    async def on_lost(handle: AsyncLock) -> None:
        await asyncio.sleep(0)  # a real coroutine: it must be awaited, not dropped
        assert handle.lost
        fired.set()

    async with AsyncRedlock(nodes3.urls, node_timeout=0.05) as dlm:
        lock = dlm.lock("r", ttl=1.0, auto_extend=True, on_lost=on_lost)
        assert await lock.acquire()
        acquired = time.monotonic()
        nodes3[1].pause()
        nodes3[2].pause()
        try:
            await asyncio.wait_for(fired.wait(), 8.0)
            # Renewal kept failing until the validity (about one ttl) ran out.
            assert time.monotonic() - acquired >= 0.8
            with pytest.raises(LockLost):
                lock.check()
            with pytest.raises(LockLost):
                await lock.extend()
        finally:
            nodes3[1].resume()
            nodes3[2].resume()
        with pytest.raises(LockLost):
            await lock.release()


async def test_explicit_extend_fails_with_lock_lost_and_outcomes(
        dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    lock = dlm3.lock("r", ttl=5.0)
    assert await lock.acquire()
    on_nodes(nodes3[:2], lambda c: c.delete(lock_key("r")))
    with pytest.raises(LockLost) as caught:
        await lock.extend()
    assert [r.outcome for r in caught.value.outcomes] == [Outcome.REFUSED, Outcome.REFUSED,
                                                          Outcome.GRANTED]
    assert caught.value.resource == "r"
    assert lock.lost
    with pytest.raises(LockLost):
        lock.check()
    assert keys_present(nodes3, "r") == [0, 0, 0]


# ---------------------------------------------------------------------------
# reentrancy and sharing a handle across tasks
# ---------------------------------------------------------------------------


async def test_reentrant_per_task(dlm3: AsyncRedlock, nodes3: RedisNodes) -> None:
    lock = dlm3.lock("r", ttl=5.0, reentrant=True)
    assert await lock.acquire()
    token = lock.token
    assert await lock.acquire(blocking=False)  # same task: re-entered, same token
    assert lock.token == token
    async with lock as held:
        assert held.token == token

    async def other_task() -> bool:
        return await lock.acquire(blocking=False)

    assert await asyncio.create_task(other_task()) is False  # another task: no re-entry
    await lock.release()
    assert keys_present(nodes3, "r") == [1, 1, 1]  # depth 2 -> 1: still held
    assert lock.locked()
    await lock.release()
    assert keys_present(nodes3, "r") == [0, 0, 0]
    assert counters(nodes3, "r") == [token] * 3  # re-entries took no new token


async def test_non_reentrant_second_acquire_by_the_same_task_is_an_error(
        dlm3: AsyncRedlock) -> None:
    lock = dlm3.lock("r", ttl=5.0)
    assert await lock.acquire()
    with pytest.raises(RedlockError, match="reentrant"):
        await lock.acquire(blocking=False)
    await lock.release()


async def test_one_handle_shared_by_tasks_gives_each_its_own_acquisition(
        dlm3: AsyncRedlock) -> None:
    lock = dlm3.lock("r", ttl=5.0, timeout=10.0)
    order: list[tuple[str, int]] = []
    release_first = asyncio.Event()

    async def first() -> None:
        await lock.acquire()
        order.append(("first", lock.token))
        await release_first.wait()
        await lock.release()

    async def second() -> None:
        await lock.acquire()
        order.append(("second", lock.token))
        await lock.release()

    one = asyncio.create_task(first())
    await asyncio.sleep(0.1)
    two = asyncio.create_task(second())
    await asyncio.sleep(0.2)
    assert [name for name, _ in order] == ["first"]
    with pytest.raises(NotHeld):  # this (test) task holds nothing through the handle
        _ = lock.token
    release_first.set()
    await asyncio.wait_for(asyncio.gather(one, two), 10.0)
    assert [name for name, _ in order] == ["first", "second"]
    assert order[0][1] < order[1][1]


@pytest.mark.xfail(sys.version_info < (3, 12), strict=True, reason=(
    "ownership is per asyncio task and asyncio.wait_for() before Python 3.12 runs the"
    " coroutine in a new task: that task owns the acquisition, so the caller then gets"
    " NotHeld from token/release() and the lock stays until its TTL (with auto_extend,"
    " until the process exits). Use asyncio.timeout() (3.11+) around acquire() instead."))
async def test_acquire_under_wait_for_belongs_to_the_caller(dlm3: AsyncRedlock,
                                                           nodes3: RedisNodes) -> None:
    lock = dlm3.lock("r", ttl=2.0)
    try:
        assert await asyncio.wait_for(lock.acquire(), 5.0)
        assert lock.token >= 1
        await lock.release()
        assert keys_present(nodes3, "r") == [0, 0, 0]
    finally:
        on_nodes(nodes3, lambda c: c.delete(lock_key("r")))


# ---------------------------------------------------------------------------
# nodes given as redis.asyncio.Redis clients
# ---------------------------------------------------------------------------


async def test_nodes_as_async_clients_and_mixed_with_urls(nodes3: RedisNodes) -> None:
    clients = [redis.asyncio.Redis(host=n.host, port=n.port, socket_timeout=5) for n in nodes3]
    try:
        async with AsyncRedlock(clients) as dlm:
            assert dlm.nodes == tuple(f"{n.host}:{n.port}" for n in nodes3)
            async with dlm.lock("r", ttl=5.0) as held:
                first = held.token
                assert keys_present(nodes3, "r") == [1, 1, 1]
        mixed = AsyncRedlock([clients[0], nodes3.urls[1], clients[2]])
        async with mixed, mixed.lock("r", ttl=5.0) as held:
            assert held.token > first
        # Closing the manager left the caller's clients open and usable.
        for client in clients:
            assert await client.ping()
    finally:
        for client in clients:
            await client.aclose()
    assert any_lock_keys(nodes3) == [[], [], []]


async def test_async_clients_with_credentials(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3, password="s3cret")
    clients = [redis.asyncio.Redis(host=n.host, port=n.port, password="s3cret") for n in nodes]
    try:
        dlm = AsyncRedlock(clients)
        async with dlm, dlm.lock("r", ttl=5.0) as held:
            assert held.token == 1
    finally:
        for client in clients:
            await client.aclose()


# ---------------------------------------------------------------------------
# Parity: the same two cases through the sync client (DESIGN.md section 7: a fix that
# lands in one shell only is the classic way the twins drift apart)
# ---------------------------------------------------------------------------


def test_sync_client_leaves_no_key_on_a_node_that_hung_during_the_acquire(
        nodes5: RedisNodes) -> None:
    from redlock import Redlock

    with Redlock(nodes5.urls, node_timeout=0.2) as dlm:
        warm = dlm.lock("warm-up", ttl=5.0)
        assert warm.acquire(blocking=False)
        warm.release()
        nodes5[3].pause()
        nodes5[4].pause()
        try:
            lock = dlm.lock("r", ttl=10.0)
            assert lock.acquire(blocking=False)
            lock.release()
        finally:
            nodes5[3].resume()
            nodes5[4].resume()
        time.sleep(0.3)
    assert any_lock_keys(nodes5) == [[]] * 5


def test_sync_on_lost_sees_the_lost_acquisition_through_the_handle(
        nodes3: RedisNodes) -> None:
    from redlock import Lock, Redlock

    seen: list[bool] = []
    fired = threading.Event()

    def on_lost(handle: Lock) -> None:
        seen.append(handle.lost)
        fired.set()

    with Redlock(nodes3.urls) as dlm:
        lock = dlm.lock("r", ttl=1.0, auto_extend=True, on_lost=on_lost)
        assert lock.acquire()
        on_nodes(nodes3[1:], lambda c: c.delete(lock_key("r")))
        assert fired.wait(5.0)
        with pytest.raises(LockLost):
            lock.release()
    assert seen == [True]
