"""The test seam (issue 41): ``redlock.testing.manager()`` builds a Redlock or an
AsyncRedlock with a test's clock and sleep, which the public constructors no longer take.
The clock drives validity and deadlines, the sleep every wait between attempts, and a
manager with a clock of its own renews in this process (the renewer keeps
``time.monotonic``)."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from redlock import AsyncRedlock, LockLost, Redlock
from redlock.testing import RedisNodes, capture_events, manager
from tests.internals import renewed_by_a_renewer


class FakeClock:
    """Monotonic seconds that move only when told to (or when slept)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)


def test_the_constructors_take_no_clock_or_sleep() -> None:
    for cls in (Redlock, AsyncRedlock):
        assert not {"clock", "sleep"} & set(inspect.signature(cls).parameters)
        with pytest.raises(TypeError, match="clock"):
            cls(["redis://127.0.0.1:1"], clock=time.monotonic)  # type: ignore[call-arg]


def test_the_seam_builds_either_manager_with_the_constructors_options() -> None:
    url = "redis://127.0.0.1:1"  # constructing sends nothing
    with manager([url], namespace="seam", max_ttl=5.0) as dlm:
        assert type(dlm) is Redlock and dlm.nodes == ("127.0.0.1:1",)
        with pytest.raises(ValueError, match="max_ttl"):
            dlm.lock("r", ttl=6.0)
    adlm = manager([url], asynchronous=True)
    assert type(adlm) is AsyncRedlock
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        manager([url], bogus=1)
    asyncio.run(adlm.close())


def test_the_clock_decides_validity(nodes3: RedisNodes) -> None:
    clock = FakeClock()
    with manager(nodes3.urls, clock=clock, node_timeout=0.5) as dlm:
        lock = dlm.lock("seam:validity", ttl=5.0)
        assert lock.acquire(blocking=False)
        assert 4.5 < lock.validity <= 5.0  # the fake clock stood still while it acquired
        clock.now += 10.0  # the holder "paused" past its TTL, by this manager's clock
        assert lock.validity == 0 and not lock.locked()
        with pytest.raises(LockLost):
            lock.check()
        with pytest.raises(LockLost):
            lock.release()


def test_the_sleep_takes_every_wait_between_attempts(nodes3: RedisNodes) -> None:
    clock = FakeClock()
    with Redlock(nodes3.urls) as holder_dlm, manager(
            nodes3.urls, clock=clock, sleep=clock.sleep, node_timeout=0.5) as dlm:
        with holder_dlm.lock("seam:sleep", ttl=30.0):
            started = time.monotonic()
            # 20 s of deadline on the fake clock, spent in the fake sleep: no real wait.
            assert not dlm.lock("seam:sleep", ttl=5.0).acquire(timeout=20.0)
            assert time.monotonic() - started < 10.0
        assert clock.slept and sum(clock.slept) >= 19.0


def test_the_asyncio_manager_awaits_its_sleep(nodes3: RedisNodes) -> None:
    clock = FakeClock()

    async def main() -> None:
        async with AsyncRedlock(nodes3.urls) as holder_dlm, manager(
                nodes3.urls, clock=clock, sleep=clock.asleep, asynchronous=True,
                node_timeout=0.5) as dlm, holder_dlm.lock("seam:asleep", ttl=30.0):
            assert not await dlm.lock("seam:asleep", ttl=5.0).acquire(timeout=20.0)

    asyncio.run(main())
    assert clock.slept and sum(clock.slept) >= 19.0


def test_a_clock_of_its_own_renews_in_this_process(nodes3: RedisNodes) -> None:
    """The renewer process keeps time.monotonic: a test's clock must not be paired with
    it (redlock/_client/renewer.py, ``unavailable()``)."""
    with manager(nodes3.urls, clock=time.monotonic) as same, \
            manager(nodes3.urls, clock=lambda: time.monotonic()) as own:
        assert renewed_by_a_renewer(same)  # time.monotonic itself: as Redlock(...) does
        assert not renewed_by_a_renewer(own)
        with capture_events() as events, own.lock("seam:renew", ttl=1.0, auto_extend=True):
            time.sleep(1.2)  # renewed past its TTL, in this process
        [told] = [e for e in events if e["event"] == "redlock.renewals_in_process"]
        assert "a test's clock" in told["reason"]
