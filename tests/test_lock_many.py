"""Several resources at once (docs/design.md §11.2): all or nothing, a token per resource
that follows the quorum-commit rule of single locks, no deadlock and no overlap between
clients asking for overlapping sets. Real nodes, both clients."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from redlock import (
    AlreadyHeld,
    AsyncMultiLock,
    AsyncRedlock,
    LockLost,
    LockNotAcquired,
    MultiLock,
    Redlock,
)
from redlock.testing import RedisNodes
from tests.clients import run_threads
from tests.internals import KEYS, bucket
from tests.peek import fence_counters, lock_values, write_markers

NODE_TIMEOUT = 0.25  # a healthy node on a busy shared machine must not look dead


@pytest.fixture
def dlm(nodes3: RedisNodes) -> Iterator[Redlock]:
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as manager:
        yield manager


@pytest.fixture
async def adlm(nodes3: RedisNodes) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as manager:
        yield manager


def test_one_acquisition_over_a_set(dlm: Redlock, nodes3: RedisNodes) -> None:
    held = dlm.lock_many(["b", "a", "a"], ttl=5.0)
    assert isinstance(held, MultiLock)
    assert held.resources == ("a", "b")  # canonical: sorted, no duplicates
    with held:
        assert held.tokens == {"a": 1, "b": 1}
        assert held.locked() and 0 < held.validity <= 5.0
        owners = lock_values(nodes3, "a") + lock_values(nodes3, "b")
        assert None not in owners and len(set(owners)) == 1  # one lock value, everywhere
        held.extend(ttl=8.0)
        assert held.validity > 7.0
        with nodes3[0].client() as client:
            assert 7000 < client.pttl("redlock:{b}:lock") <= 8000
    assert lock_values(nodes3, "a") == lock_values(nodes3, "b") == [None, None, None]
    assert not held.locked()
    held.release()  # idempotent


def test_all_or_nothing(dlm: Redlock, nodes3: RedisNodes) -> None:
    with dlm.lock("y", ttl=10.0):
        many = dlm.lock_many(["x", "y", "z"], ttl=5.0)
        assert not many.acquire(blocking=False)
        # Nothing partial anywhere: x and z were not taken on any node.
        assert lock_values(nodes3, "x") == lock_values(nodes3, "z") == [None, None, None]
        with pytest.raises(LockNotAcquired) as failure, \
                dlm.lock_many(["x", "y", "z"], timeout=0.2):
            pass
        assert "held by another owner" in str(failure.value)
        # A free, disjoint set is not held up by it.
        with dlm.lock_many(["x", "z"], ttl=5.0) as other:
            assert set(other.tokens) == {"x", "z"}
    assert many.acquire(blocking=False)
    many.release()


def test_tokens_grow_per_resource_across_single_and_multi_locks(dlm: Redlock) -> None:
    # Every token comes from the nodes' one counter: a set takes one for all its members.
    with dlm.lock("t1") as one:
        assert one.token == 1
    with dlm.lock_many(["t1", "t2"]) as many:
        assert many.tokens == {"t1": 2, "t2": 2}
    with dlm.lock("t2") as two:
        assert two.token == 3
    with dlm.lock_many(["t2", "t3"]) as many:
        assert many.tokens == {"t2": 4, "t3": 4}


def test_diverged_counters_are_committed_per_resource(dlm: Redlock,
                                                      nodes3: RedisNodes) -> None:
    write_markers(nodes3)
    with nodes3[0].client() as client:
        client.hset(KEYS.counter, bucket("d1"), 10)  # node 0 is ahead on d1's bucket
        client.hset(KEYS.counter, bucket("d2"), 20)  # and further on d2's
    with dlm.lock_many(["d1", "d2"]) as many:
        assert many.tokens == {"d1": 21, "d2": 21}
        counters = fence_counters(nodes3, "d1")
        assert sum(c >= 21 for c in counters) >= 2  # written back on a quorum
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as fresh, fresh.lock("d1") as one:
        assert one.token == 22  # a manager without a floor still goes past it


def test_overlapping_sets_from_threads_exclude_and_never_deadlock(
        nodes3: RedisNodes) -> None:
    names = [f"ov{i}" for i in range(5)]
    managers = [Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) for _ in range(2)]
    inside: dict[str, int] = dict.fromkeys(names, 0)
    history: dict[str, list[int]] = {name: [] for name in names}
    overlaps: list[str] = []
    errors: list[BaseException] = []
    mutex = threading.Lock()

    def worker(index: int) -> None:
        rng = random.Random(index)
        try:
            for _ in range(8):
                wanted = rng.sample(names, rng.choice((2, 3)))
                with managers[index % 2].lock_many(wanted, ttl=10.0, timeout=60.0) as held:
                    tokens = held.tokens
                    with mutex:
                        for name in wanted:
                            inside[name] += 1
                            if inside[name] > 1:
                                overlaps.append(name)
                            history[name].append(tokens[name])
                    time.sleep(0.002)
                    with mutex:
                        for name in wanted:
                            inside[name] -= 1
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = run_threads(worker, 6, 120)
        assert not any(thread.is_alive() for thread in threads), "a worker is stuck"
    finally:
        for manager in managers:
            manager.close()
    assert errors == []
    assert overlaps == []
    assert sum(len(tokens) for tokens in history.values()) >= 6 * 8 * 2
    for name, tokens in history.items():
        # Holders of a resource never overlap, so entry order is hold order: tokens
        # strictly increase in it.
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), name


def test_extend_failure_loses_the_whole_set(dlm: Redlock, nodes3: RedisNodes) -> None:
    held = dlm.lock_many(["e1", "e2"], ttl=10.0)
    assert held.acquire()
    for node in nodes3[:2]:  # e2's key gone on a majority
        with node.client() as client:
            client.delete("redlock:{e2}:lock")
    with pytest.raises(LockLost, match="2 of 3 nodes answered that our key is gone"):
        held.extend()
    assert held.lost and not held.locked()
    assert lock_values(nodes3, "e1") == [None, None, None]  # the rest released at once
    with pytest.raises(LockLost):
        _ = held.tokens


def test_watchdog_keeps_the_set_and_reports_its_loss(dlm: Redlock,
                                                     nodes3: RedisNodes) -> None:
    reported = threading.Event()
    seen: list[MultiLock] = []

    def on_lost(handle: MultiLock) -> None:
        seen.append(handle)
        reported.set()

    held = dlm.lock_many(["w1", "w2"], ttl=1.5, auto_extend=True, on_lost=on_lost)
    assert held.acquire()
    time.sleep(2.5)  # past the TTL: renewed
    held.check()
    for node in nodes3:
        with node.client() as client:
            client.delete("redlock:{w1}:lock")
    assert reported.wait(10)
    assert seen == [held] and held.lost
    with pytest.raises(LockLost):
        held.release()  # nothing left to release, but the caller learns it was lost
    held.release()  # a second release is a no-op


def test_misuse(dlm: Redlock) -> None:
    with pytest.raises(ValueError):
        dlm.lock_many([])
    with pytest.raises(TypeError):
        dlm.lock_many("ab")
    with pytest.raises(ValueError):
        dlm.lock_many(["a", ""])
    with pytest.raises(ValueError):
        dlm.lock_many(["a"], ttl=0)
    held = dlm.lock_many(["m1", "m2"])
    with held, pytest.raises(AlreadyHeld):
        held.acquire()
    assert "m1" in repr(held) and "released" in repr(held)


def test_a_node_down_is_tolerated(dlm: Redlock, nodes3: RedisNodes) -> None:
    with dlm.lock_many(["n1", "n2"]):  # all three up: the new cluster is initialised
        pass
    nodes3[2].stop()
    with dlm.lock_many(["n1", "n2"], timeout=5.0) as held:
        assert held.tokens == {"n1": 2, "n2": 2}


async def test_asyncio_sets_exclude_between_tasks(adlm: AsyncRedlock,
                                                  nodes3: RedisNodes) -> None:
    names = [f"aov{i}" for i in range(4)]
    inside = dict.fromkeys(names, 0)
    history: dict[str, list[int]] = {name: [] for name in names}
    overlaps: list[str] = []

    async def worker(index: int) -> None:
        rng = random.Random(index)
        for _ in range(6):
            wanted = rng.sample(names, 2)
            held = adlm.lock_many(wanted, ttl=10.0, timeout=60.0)
            assert isinstance(held, AsyncMultiLock)
            async with held:
                for name in wanted:
                    inside[name] += 1
                    if inside[name] > 1:
                        overlaps.append(name)
                    history[name].append(held.tokens[name])
                await asyncio.sleep(0.002)
                for name in wanted:
                    inside[name] -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(5))), 120)
    assert overlaps == []
    for tokens in history.values():
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert lock_values(nodes3, "aov0") == [None, None, None]


async def test_asyncio_all_or_nothing_and_extend(adlm: AsyncRedlock,
                                                 nodes3: RedisNodes) -> None:
    async with adlm.lock("ab", ttl=10.0):
        many = adlm.lock_many(["aa", "ab"], ttl=5.0)
        assert not await many.acquire(blocking=False)
        assert lock_values(nodes3, "aa") == [None, None, None]
    async with adlm.lock_many(["aa", "ab"], ttl=5.0) as held:
        await held.extend(ttl=9.0)
        assert held.validity > 8.0
        assert held.tokens == {"aa": 2, "ab": 2}  # one token for the set
