"""``@dlm.locked(...)`` (docs/design.md §11.1): each call runs holding the lock, a lock
that cannot be had raises LockNotAcquired and the function does not run, the wrong kind
of function is refused when decorating. Real nodes, both clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from redlock import AsyncLock, AsyncRedlock, Lock, LockNotAcquired, Redlock
from redlock.testing import RedisNodes
from tests.clients import run_threads


def _lock_key(resource: str) -> str:
    return f"redlock:{{{resource}}}:lock"


def _held_on(nodes: RedisNodes, resource: str) -> int:
    count = 0
    for node in nodes:
        with node.client() as client:
            count += int(client.exists(_lock_key(resource)))
    return count


@pytest.fixture
def dlm(nodes3: RedisNodes) -> Iterator[Redlock]:
    with Redlock(nodes3.urls, node_timeout=0.25) as manager:
        yield manager


@pytest.fixture
async def adlm(nodes3: RedisNodes) -> AsyncIterator[AsyncRedlock]:
    async with AsyncRedlock(nodes3.urls, node_timeout=0.25) as manager:
        yield manager


# -- sync --------------------------------------------------------------------------


def test_runs_holding_the_lock_and_keeps_the_function_identity(
        dlm: Redlock, nodes3: RedisNodes) -> None:
    seen: list[int] = []

    @dlm.locked("dec:a", ttl=5.0)
    def work(x: int, *, y: int = 1) -> int:
        """Adds."""
        seen.append(_held_on(nodes3, "dec:a"))
        return x + y

    assert work(2, y=3) == 5
    assert seen == [3]  # held on every node while it ran
    assert _held_on(nodes3, "dec:a") == 0  # released afterwards
    assert work.__name__ == "work" and work.__doc__ == "Adds."
    assert work.__wrapped__ is not None  # type: ignore[attr-defined]


def test_releases_when_the_function_raises(dlm: Redlock, nodes3: RedisNodes) -> None:
    @dlm.locked("dec:b")
    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fail()
    assert _held_on(nodes3, "dec:b") == 0


def test_a_lock_held_elsewhere_raises_and_the_function_does_not_run(dlm: Redlock) -> None:
    calls: list[str] = []

    @dlm.locked("dec:c", timeout=0.2)
    def work() -> None:
        calls.append("ran")

    with dlm.lock("dec:c", ttl=5.0):
        done = threading.Event()
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                work()
            except BaseException as exc:
                errors.append(exc)
            done.set()

        threading.Thread(target=other_thread).start()
        assert done.wait(30)
    assert calls == []
    assert len(errors) == 1 and isinstance(errors[0], LockNotAcquired)
    assert errors[0].resource == "dec:c"
    work()  # free again
    assert calls == ["ran"]


def test_pass_lock_hands_the_held_lock_to_the_function(dlm: Redlock) -> None:
    @dlm.locked("dec:d", pass_lock="held")
    def work(label: str, *, held: Lock | None = None) -> tuple[str, int]:
        assert held is not None and held.locked()
        held.extend()
        return label, held.token

    assert work("x") == ("x", 1)
    assert work("y") == ("y", 2)  # tokens grow with each acquisition
    with pytest.raises(TypeError, match="passed by @locked"):
        work("z", held=None)


def test_resource_from_the_arguments(dlm: Redlock) -> None:
    inside: dict[str, int] = {}
    overlap: list[str] = []
    mutex = threading.Lock()

    @dlm.locked(lambda order, **_: f"order:{order}", ttl=5.0, timeout=20.0,
                pass_lock="held")
    def process(order: int, *, held: Lock | None = None) -> str:
        assert held is not None
        with mutex:
            inside[held.resource] = inside.get(held.resource, 0) + 1
            if inside[held.resource] > 1:
                overlap.append(held.resource)
        time.sleep(0.02)
        with mutex:
            inside[held.resource] -= 1
        return held.resource

    threads = [threading.Thread(target=process, args=(i % 2,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert overlap == []  # one holder per order at a time...
    assert process(7) == "order:7"  # ...and the name comes from the argument


def test_excludes_across_threads_and_managers(nodes3: RedisNodes) -> None:
    counter = redis.Redis.from_url(nodes3.urls[0])
    managers = [Redlock(nodes3.urls, node_timeout=0.25) for _ in range(2)]
    increments = []
    for manager in managers:
        @manager.locked("dec:count", ttl=5.0, timeout=30.0)
        def increment() -> None:
            value = int(counter.get("dec:count:value") or 0)
            time.sleep(0.002)  # racy read-modify-write: only the lock keeps it exact
            counter.set("dec:count:value", value + 1)

        increments.append(increment)

    def worker(index: int) -> None:
        for _ in range(10):
            increments[index % 2]()

    try:
        run_threads(worker, 4, 120)
        assert int(counter.get("dec:count:value") or 0) == 40
    finally:
        counter.close()
        for manager in managers:
            manager.close()


def test_recursion_needs_reentrant(dlm: Redlock) -> None:
    @dlm.locked("dec:rec", reentrant=True, pass_lock="held")
    def countdown(n: int, *, held: Lock | None = None) -> list[int]:
        assert held is not None
        return [held.token] if n == 0 else [held.token, *countdown(n - 1)]

    tokens = countdown(3)
    assert len(tokens) == 4 and len(set(tokens)) == 1  # one acquisition, nested


def test_auto_extend_keeps_a_long_call_covered(dlm: Redlock) -> None:
    @dlm.locked("dec:long", ttl=1.5, auto_extend=True, pass_lock="held")
    def long_call(*, held: Lock | None = None) -> int:
        assert held is not None
        time.sleep(2.5)  # longer than the TTL: the watchdog renews it
        held.check()
        return held.token

    assert long_call() == 1


def test_wrong_kinds_of_function_are_refused_when_decorating(dlm: Redlock) -> None:
    async def coroutine_function() -> None:
        pass

    def generator() -> Iterator[int]:
        yield 1

    with pytest.raises(TypeError, match=r"AsyncRedlock\.locked"):
        dlm.locked("dec:x")(coroutine_function)
    with pytest.raises(TypeError, match="generator"):
        dlm.locked("dec:x")(generator)
    with pytest.raises(TypeError, match="no keyword parameter 'held'"):
        dlm.locked("dec:x", pass_lock="held")(lambda: None)
    with pytest.raises(ValueError, match="ttl"):
        dlm.locked("dec:x", ttl=-1)
    with pytest.raises(ValueError):
        dlm.locked("")
    with pytest.raises(TypeError):
        dlm.locked("dec:x", pass_lock="not a name")

    @dlm.locked("dec:x", pass_lock="held")
    def takes_kwargs(**kwargs: Any) -> bool:
        return isinstance(kwargs["held"], Lock)

    assert takes_kwargs()


# -- asyncio -----------------------------------------------------------------------


async def test_async_runs_holding_the_lock(adlm: AsyncRedlock, nodes3: RedisNodes) -> None:
    @adlm.locked("adec:a", ttl=5.0, pass_lock="held")
    async def work(x: int, *, held: AsyncLock | None = None) -> tuple[int, int]:
        assert held is not None
        await held.extend()
        return x * 2, _held_on(nodes3, "adec:a")

    assert await work(4) == (8, 3)
    assert _held_on(nodes3, "adec:a") == 0
    assert work.__name__ == "work"


async def test_async_excludes_between_tasks_and_raises_when_held(
        adlm: AsyncRedlock) -> None:
    inside = 0
    most = 0

    @adlm.locked("adec:b", ttl=5.0, timeout=30.0)
    async def critical() -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.01)
        inside -= 1

    await asyncio.gather(*(critical() for _ in range(8)))
    assert most == 1

    ran: list[int] = []

    @adlm.locked("adec:b", blocking=False)
    async def impatient() -> None:
        ran.append(1)

    async with adlm.lock("adec:b", ttl=5.0):
        with pytest.raises(LockNotAcquired):
            await asyncio.create_task(impatient())
    assert ran == []


async def test_async_releases_when_cancelled(adlm: AsyncRedlock, nodes3: RedisNodes) -> None:
    started = asyncio.Event()

    @adlm.locked("adec:c", ttl=5.0)
    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(slow())
    await started.wait()
    assert _held_on(nodes3, "adec:c") == 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _held_on(nodes3, "adec:c") == 0


async def test_async_refuses_plain_functions(adlm: AsyncRedlock) -> None:
    def plain() -> None:
        pass

    async def agen() -> AsyncIterator[int]:
        yield 1

    with pytest.raises(TypeError, match=r"use Redlock\.locked"):
        adlm.locked("adec:x")(plain)
    with pytest.raises(TypeError, match="generator"):
        adlm.locked("adec:x")(agen)
