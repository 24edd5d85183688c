"""The public API against three real redis-server nodes, in a few seconds: what must work
on every Python, redis-py (with and without hiredis) and Redis server the package
supports. scripts/matrix runs this file alone on each combination it builds (the
installed package, ``$REDIS_SERVER`` naming the server); the main suite runs it too.

It imports only the package (``redlock``, ``redlock.admin``, ``fencing``,
``redlock.testing``), redis-py and pytest: nothing else of tests/, which scripts/matrix
does not copy.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio

from fencing import AsyncRedisFencedStore, RedisFencedStore, StaleTokenError
from redlock import AsyncRedlock, Redlock
from redlock.admin import Admin, AsyncAdmin
from redlock.testing import RedisNodes

pytestmark = pytest.mark.timeout(60)


def fresh(what: str) -> str:
    """A resource name no other test of the session uses (the nodes are shared)."""
    return f"smoke:{uuid.uuid4().hex[:8]}:{what}"


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    with RedisNodes(3) as nodes:  # $REDIS_SERVER, else redis-server on PATH
        yield nodes.urls


@pytest.fixture
def dlm(urls: list[str]) -> Iterator[Redlock]:
    with Redlock(urls) as manager:
        yield manager


@pytest.fixture
def other(urls: list[str]) -> Iterator[Redlock]:
    """A second manager: another client of the same nodes (as another process would be)."""
    with Redlock(urls) as manager:
        yield manager


@pytest.fixture
async def adlm(urls: list[str]) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(urls) as manager:
        yield manager


@pytest.fixture
async def aother(urls: list[str]) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(urls) as manager:
        yield manager


# -- sync ------------------------------------------------------------------------------


def test_acquire_release_tokens_increase(dlm: Redlock, other: Redlock) -> None:
    name = fresh("orders")
    tokens = []
    for _ in range(3):
        lock = dlm.lock(name, ttl=5.0)
        assert lock.acquire(blocking=False)
        assert lock.locked() and Admin(dlm).is_locked(name)
        assert not other.lock(name, ttl=5.0).acquire(blocking=False)
        tokens.append(lock.token)
        lock.release()
        assert not lock.locked()
    with dlm.lock(name, ttl=5.0, timeout=5.0) as held:
        tokens.append(held.token)
    assert not Admin(dlm).is_locked(name)
    assert tokens == sorted(set(tokens)), tokens


def test_extend(dlm: Redlock) -> None:
    lock = dlm.lock(fresh("extend"), ttl=1.0)
    assert lock.acquire(blocking=False)
    token = lock.token
    lock.extend(ttl=10.0)
    assert lock.validity > 5.0
    assert lock.token == token
    lock.release()


def test_auto_extend(dlm: Redlock, other: Redlock) -> None:
    name = fresh("renewed")
    with dlm.lock(name, ttl=1.0, auto_extend=True) as held:
        time.sleep(1.5)  # past the TTL: only renewals keep it
        held.check()
        assert held.validity > 0
        assert not other.lock(name, ttl=1.0).acquire(blocking=False)
    assert not Admin(dlm).is_locked(name)


def test_blocking_acquire_waits_for_release(dlm: Redlock, other: Redlock) -> None:
    name = fresh("queue")
    holder = dlm.lock(name, ttl=10.0)
    assert holder.acquire(blocking=False)
    first = holder.token
    got: dict[str, float] = {}

    def wait() -> None:
        with other.lock(name, ttl=10.0, timeout=10.0) as waiter:
            got["token"] = waiter.token
            got["at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive() and not got  # still waiting
    released = time.monotonic()
    holder.release()
    thread.join(10.0)
    assert not thread.is_alive()
    assert got["token"] > first
    assert got["at"] - released < 2.0  # woken by the release, not by polling out a TTL


def test_lock_many(dlm: Redlock, other: Redlock) -> None:
    a, b = fresh("account-1"), fresh("account-2")
    with dlm.lock_many([a, b], ttl=5.0, timeout=5.0) as held:
        tokens = held.tokens
        assert set(tokens) == {a, b}
        assert not other.lock(b, ttl=5.0).acquire(blocking=False)
    with other.lock(b, ttl=5.0, blocking=False) as single:
        assert single.token > tokens[b]


def test_semaphore(dlm: Redlock, other: Redlock, urls: list[str]) -> None:
    name = fresh("exports")
    with Redlock(urls) as third:
        permits = [m.semaphore(name, permits=2, ttl=5.0) for m in (dlm, other, third)]
        assert permits[0].acquire(blocking=False)
        assert permits[1].acquire(blocking=False)
        assert {permits[0].slot_name, permits[1].slot_name} == {
            f"{name}:permit:0", f"{name}:permit:1"}
        assert not permits[2].acquire(blocking=False)  # both slots taken
        status = permits[2].status()
        assert status.permits == 2 and all(slot is not None for slot in status.slots)
        permits[0].release()
        assert permits[2].acquire(blocking=False)
        permits[1].release()
        permits[2].release()


def test_rwlock(dlm: Redlock, other: Redlock) -> None:
    name = fresh("catalog")
    with dlm.rwlock(name, ttl=5.0).write(timeout=5.0) as writing:
        written = writing.token
    readers = [dlm.rwlock(name, ttl=5.0).read(), other.rwlock(name, ttl=5.0).read()]
    assert all(r.acquire(blocking=False) for r in readers)  # readers share
    assert readers[0].token == written  # the last write the read saw
    assert len(dlm.rwlock(name).status().readers) == 2
    writer = other.rwlock(name, ttl=5.0).write()
    assert not writer.acquire(blocking=False)
    for reader in readers:
        reader.release()
    assert writer.acquire(blocking=False)
    assert writer.token > written
    writer.release()


def test_election(dlm: Redlock, other: Redlock) -> None:
    name = fresh("leader")
    with dlm.election(name, ttl=2.0, identity="host-a").campaign(timeout=5.0) as leadership:
        term = leadership.token
        leader = other.election(name, ttl=2.0, identity="host-b").leader()
        assert leader is not None and (leader.identity, leader.token) == ("host-a", term)
    assert other.election(name, ttl=2.0).leader() is None
    with other.election(name, ttl=2.0, identity="host-b").campaign(timeout=5.0) as second:
        assert second.token > term


def test_fenced_write(dlm: Redlock, urls: list[str]) -> None:
    name = fresh("stock")
    client = redis.Redis.from_url(urls[0])  # the data's Redis (here one of the nodes)
    try:
        store = RedisFencedStore(client)
        with dlm.lock(name, ttl=5.0) as first:
            stale = first.token
            store.write(name, stale, b"one")
        with dlm.lock(name, ttl=5.0) as second:
            newer = second.token
            store.write(name, newer, b"two")
        with pytest.raises(StaleTokenError):
            store.write(name, stale, b"stale")  # the paused holder, back too late
        assert store.read(name) == b"two"
        assert store.highest(name) == newer
    finally:
        client.close()


# -- asyncio ---------------------------------------------------------------------------


async def test_async_acquire_release_tokens_increase(adlm: AsyncRedlock,
                                                     aother: AsyncRedlock) -> None:
    name = fresh("orders")
    tokens = []
    for _ in range(3):
        lock = adlm.lock(name, ttl=5.0)
        assert await lock.acquire(blocking=False)
        assert lock.locked() and await AsyncAdmin(adlm).is_locked(name)
        assert not await aother.lock(name, ttl=5.0).acquire(blocking=False)
        tokens.append(lock.token)
        await lock.release()
    async with adlm.lock(name, ttl=5.0, timeout=5.0) as held:
        tokens.append(held.token)
    assert not await AsyncAdmin(adlm).is_locked(name)
    assert tokens == sorted(set(tokens)), tokens


async def test_async_extend_and_auto_extend(adlm: AsyncRedlock, aother: AsyncRedlock) -> None:
    lock = adlm.lock(fresh("extend"), ttl=1.0)
    assert await lock.acquire(blocking=False)
    await lock.extend(ttl=10.0)
    assert lock.validity > 5.0
    await lock.release()

    name = fresh("renewed")
    async with adlm.lock(name, ttl=1.0, auto_extend=True) as held:
        await asyncio.sleep(1.5)
        held.check()
        assert not await aother.lock(name, ttl=1.0).acquire(blocking=False)
    assert not await AsyncAdmin(adlm).is_locked(name)


async def test_async_blocking_acquire_waits_for_release(adlm: AsyncRedlock,
                                                        aother: AsyncRedlock) -> None:
    name = fresh("queue")
    holder = adlm.lock(name, ttl=10.0)
    assert await holder.acquire(blocking=False)
    first = holder.token

    async def wait() -> tuple[int, float]:
        async with aother.lock(name, ttl=10.0, timeout=10.0) as waiter:
            return waiter.token, time.monotonic()

    waiting = asyncio.create_task(wait())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    released = time.monotonic()
    await holder.release()
    token, at = await asyncio.wait_for(waiting, 10.0)
    assert token > first and at - released < 2.0


async def test_async_lock_many_and_family(adlm: AsyncRedlock, aother: AsyncRedlock) -> None:
    a, b = fresh("account-1"), fresh("account-2")
    async with adlm.lock_many([a, b], ttl=5.0, timeout=5.0) as held:
        assert set(held.tokens) == {a, b}
        assert not await aother.lock(a, ttl=5.0).acquire(blocking=False)

    name = fresh("exports")
    permit, rival = (m.semaphore(name, permits=1, ttl=5.0) for m in (adlm, aother))
    assert await permit.acquire(blocking=False)
    assert not await rival.acquire(blocking=False)
    await permit.release()
    assert await rival.acquire(blocking=False)
    await rival.release()

    name = fresh("catalog")
    async with adlm.rwlock(name, ttl=5.0).write(timeout=5.0) as writing:
        written = writing.token
    async with adlm.rwlock(name, ttl=5.0).read(timeout=5.0) as reading:
        assert reading.token == written
        assert not await aother.rwlock(name, ttl=5.0).write().acquire(blocking=False)

    name = fresh("leader")
    election = adlm.election(name, ttl=2.0, identity="task-a")
    async with election.campaign(timeout=5.0) as leadership:
        leader = await aother.election(name, ttl=2.0).leader()
        assert leader is not None and leader.identity == "task-a"
        assert leader.token == leadership.token
    assert await election.leader() is None


async def test_async_fenced_write(adlm: AsyncRedlock, urls: list[str]) -> None:
    name = fresh("stock")
    client = redis.asyncio.Redis.from_url(urls[0])
    try:
        store = AsyncRedisFencedStore(client)
        async with adlm.lock(name, ttl=5.0) as first:
            stale = first.token
            await store.write(name, stale, b"one")
        async with adlm.lock(name, ttl=5.0) as second:
            await store.write(name, second.token, b"two")
        with pytest.raises(StaleTokenError):
            await store.write(name, stale, b"stale")
        assert await store.read(name) == b"two"
    finally:
        # (aclose() came with redis-py 5.0.1; the oldest redis-py we claim has close())
        await (client.aclose() if hasattr(client, "aclose") else client.close())
