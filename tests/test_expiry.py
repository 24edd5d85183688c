"""Expiry, extend and auto-extend (the watchdog), on both clients (tests/clients.py).

A lock whose validity ran out is lost (``check()``, ``token`` and ``extend()`` raise
LockLost) and its release never touches the next holder's keys; extend renews on
every node or, without a quorum, loses the lock and drops what is left of it; the
watchdog keeps a lock past its TTL and calls ``on_lost`` when renewal fails.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from redlock import LockLost, Outcome
from redlock.testing import RedisNodes, capture_events
from tests.clients import Actor, Flavour, Held, Stopwatch, eventually
from tests.peek import decided_as, delete_lock_keys, lock_keys, lock_pttls, lock_values


async def _token_of_an_acquire_at_once(lock: Held) -> Any:
    """``lock`` acquired without blocking (it must be free); its token."""
    assert await lock.acquire(blocking=False)
    return await lock.token()


async def _until_or_why(predicate: Callable[[], object], timeout: float) -> str | None:
    """None once ``predicate()`` holds (polled for ``timeout`` seconds); else what a
    report of the failure needs: the longest pause between two polls (a stall of the
    whole process shows as one) and where each of the library's threads is. (Seen once
    in CI: on_lost of test_auto_extend_signals_loss_when_a_majority_hangs never came
    within 8 s, after one failed renewal round; no call on the renewal thread was
    found that could block that long.)"""
    deadline = last = time.monotonic()
    deadline += timeout
    longest = 0.0
    while time.monotonic() < deadline:
        if predicate():
            return None
        await asyncio.sleep(0.02)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    if predicate():
        return None
    frames = sys._current_frames()
    stacks = "".join(f"\n--- {thread.name}:\n" + "".join(traceback.format_stack(
        frames[thread.ident])) for thread in threading.enumerate()
        if thread.name.startswith("redlock") and thread.ident in frames)
    return f"longest pause between polls {longest:.2f} s; threads:{stacks or ' none'}"


async def _each_raises_lock_lost(*calls: Callable[[], Awaitable[object]]) -> None:
    """Each of these calls on a lost lock raises LockLost."""
    for call in calls:
        with pytest.raises(LockLost):
            await call()


async def test_expiry_frees_the_lock_for_another_owner(flavour: Flavour, me: Actor,
                                                      cluster: RedisNodes) -> None:
    resource = "ttl:expiry"
    first = me.on(flavour.manager(cluster).lock(resource, ttl=0.5))
    first_token = await _token_of_an_acquire_at_once(first)
    dlm = flavour.manager(cluster)
    second = flavour.actor("second").on(dlm.lock(resource, ttl=10.0))
    assert not await second.acquire(blocking=False)
    assert await second.acquire(timeout=5.0)  # after the first holder's keys expired
    assert await second.token() > first_token
    assert not await first.locked() and await first.validity() == 0.0
    with pytest.raises(LockLost, match="expired"):
        await first.check()
    await _each_raises_lock_lost(first.token, first.extend)
    # The second holder has its key on at least a quorum (a node where the first key
    # outlived the others may have refused it). The expired holder's release must not
    # delete any of them; it tells its caller the lock had expired.
    before = lock_values(cluster, resource)
    assert sum(1 for value in before if value is not None) >= dlm.quorum
    with pytest.raises(LockLost, match="validity had run out") as caught:
        await first.release()
    assert caught.value.resource == resource
    assert lock_values(cluster, resource) == before
    await first.release()  # a second release is a no-op
    await second.extend()
    await second.release()
    assert lock_keys(cluster, resource) == [False] * len(cluster)


async def test_extend_renews_on_every_node(flavour: Flavour, me: Actor,
                                           cluster: RedisNodes) -> None:
    resource = "ttl:extend"
    lock = me.on(flavour.manager(cluster).lock(resource, ttl=1.0))
    token = await _token_of_an_acquire_at_once(lock)
    await asyncio.sleep(0.5)
    await lock.extend(3.0)
    assert await lock.validity() > 2.5
    assert all(pttl > 2500 for pttl in lock_pttls(cluster, resource))
    await asyncio.sleep(0.7)  # past the original 1 s TTL
    await lock.check()
    assert await lock.token() == token
    rival = flavour.actor("rival").on(flavour.manager(cluster).lock(resource))
    assert not await rival.acquire(blocking=False)
    await lock.release()


async def test_extend_after_a_majority_lost_the_key_raises_lock_lost(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    resource = "ttl:deleted"
    dlm = flavour.manager(cluster)
    lock = me.on(dlm.lock(resource, ttl=10.0))
    assert await lock.acquire(blocking=False)
    delete_lock_keys(list(cluster)[: dlm.quorum], resource)
    with pytest.raises(LockLost) as caught:
        await lock.extend()
    assert decided_as(caught.value.outcomes, [Outcome.REFUSED] * dlm.quorum
                      + [Outcome.GRANTED] * (len(cluster) - dlm.quorum),
                      dlm.quorum), caught.value.outcomes
    assert caught.value.resource == resource
    assert "quorum" in str(caught.value)
    assert await lock.lost() and not await lock.locked()
    await _each_raises_lock_lost(lock.check, lock.extend)
    # The lost holder dropped its remaining keys: the next owner need not wait 10 s.
    assert lock_keys(cluster, resource) == [False] * len(cluster)
    assert await flavour.actor().on(flavour.manager(cluster).lock(resource)).acquire(
        blocking=False)
    before = lock_values(cluster, resource)
    with pytest.raises(LockLost):  # release says so, and does not touch the new owner's key
        await lock.release()
    assert lock_values(cluster, resource) == before


async def test_auto_extend_keeps_the_lock_past_its_ttl(flavour: Flavour, me: Actor,
                                                       cluster: RedisNodes) -> None:
    resource = "ttl:auto"
    lost: list[Any] = []
    lock = me.on(flavour.manager(cluster).lock(resource, ttl=0.6, auto_extend=True,
                                               on_lost=lost.append))
    other = flavour.actor("other").on(flavour.manager(cluster).lock(resource, ttl=5.0))
    token = await _token_of_an_acquire_at_once(lock)
    held = Stopwatch()
    while held() < 1.5:  # 2.5 TTLs
        await lock.check()
        await asyncio.sleep(0.1)
    assert await lock.token() == token and await lock.validity() > 0
    assert await lock.locked() and not await lock.lost() and not lost
    assert lock_keys(cluster, resource) == [True] * len(cluster)
    assert not await other.acquire(blocking=False)
    await lock.release()
    assert lock_keys(cluster, resource) == [False] * len(cluster)
    await asyncio.sleep(0.5)  # a stopped watchdog neither brings the key back...
    assert lock_keys(cluster, resource) == [False] * len(cluster)
    assert not lost and not await lock.lost()  # ...nor reports the released lock lost
    assert await other.acquire(blocking=False)
    assert await other.token() > token
    await other.release()


async def test_auto_extend_signals_loss_when_a_majority_drops_the_key(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    """on_lost (a plain function, for both clients) sees the lost acquisition through
    the handle, although it runs in the watchdog's thread or task."""
    resource = "ttl:auto-deleted"
    dlm = flavour.manager(cluster)
    seen: list[tuple[Any, bool]] = []
    lock = me.on(dlm.lock(resource, ttl=1.0, auto_extend=True,
                          on_lost=lambda handle: seen.append((handle, handle.lost))))
    assert await lock.acquire(blocking=False)
    delete_lock_keys(list(cluster)[: dlm.quorum], resource)  # someone broke our lock
    assert await eventually(lambda: bool(seen), 5.0), "on_lost was never called"
    assert seen == [(lock.handle, True)]
    assert await lock.lost() and not await lock.locked()
    with pytest.raises(LockLost, match="nodes answered that our key is gone") as caught:
        await lock.check()
    assert [r.outcome for r in caught.value.outcomes].count(Outcome.REFUSED) == dlm.quorum
    await _each_raises_lock_lost(lock.token, lock.extend)
    assert lock_keys(cluster, resource) == [False] * len(cluster)  # the watchdog dropped them
    assert await flavour.actor().on(flavour.manager(cluster).lock(resource)).acquire(
        blocking=False)
    with pytest.raises(LockLost):  # release of a lost lock says so
        await lock.release()


@pytest.mark.parametrize("nodes_fixture", ["nodes3", "nodes5"])
async def test_auto_extend_signals_loss_when_a_majority_hangs(
        request: pytest.FixtureRequest, flavour: Flavour, me: Actor, nodes_fixture: str) -> None:
    """on_lost of the client's own kind: for the asyncio client a coroutine function,
    which must be awaited, not dropped."""
    nodes: RedisNodes = request.getfixturevalue(nodes_fixture)
    resource = "ttl:auto-paused"
    ttl = 1.0
    fired: list[bool] = []
    dlm = flavour.manager(nodes, node_timeout=0.05)
    lock = me.on(dlm.lock(resource, ttl=ttl, auto_extend=True,
                          on_lost=flavour.callback(lambda handle: fired.append(handle.lost))))
    assert await lock.acquire(timeout=5.0)
    acquired = Stopwatch()
    for node in list(nodes)[len(nodes) - dlm.quorum:]:
        node.pause()
    why = await _until_or_why(lambda: bool(fired), 8.0)
    assert why is None, f"on_lost was never called: {why}"
    print(f"\nwatchdog signalled loss {acquired():.2f} s after the acquire (ttl {ttl} s)")
    # Renewal kept failing until the validity (about one ttl) ran out.
    assert acquired() >= 0.8 * ttl
    assert fired == [True]
    assert await lock.lost()
    with pytest.raises(LockLost, match="validity ran out"):
        await lock.check()
    await _each_raises_lock_lost(lock.extend, lock.release)


async def test_releasing_an_auto_extended_lock_at_once_is_not_a_watchdog_crash(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    # A bug this test found in the asyncio client: a release before the watchdog task
    # first ran made its protocol end without a request, which the driver did not expect.
    lock = flavour.manager(nodes3).lock("ttl:short", ttl=5.0, auto_extend=True)
    with capture_events() as events:
        for _ in range(5):
            acquired, _ = await me.call_all(lambda: lock.acquire(timeout=5.0), lock.release)
            assert acquired
        await asyncio.sleep(0.2)  # the watchdogs have run and ended
    assert [e for e in events if e["event"].endswith("crashed")] == []
    assert lock_keys(nodes3, "ttl:short") == [False] * 3


async def test_auto_extend_signals_each_loss_in_time_when_a_majority_hangs(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """Many auto-extended locks lost together are each told (on_lost) soon after their
    own validity ran out: the renewal loop, shared by all of them, spent a whole request
    timeout on the hung majority dropping each lost lock's keys before it told that
    lock's holder, and the next lock's loss waited behind it (16 locks, node_timeout
    0.1 s: the last was told about 1.6 s late)."""
    ttl, count = 1.0, 16
    dlm = flavour.manager(nodes5, node_timeout=0.1)
    acquired: dict[str, float] = {}
    fired: dict[str, float] = {}
    held = []  # (a lock whose handles are all gone is released, not lost)
    for i in range(count):
        lock = me.on(dlm.lock(f"ttl:many-paused-{i}", ttl=ttl, auto_extend=True,
                              on_lost=flavour.callback(
                                  lambda handle: fired.setdefault(handle.resource,
                                                                  time.monotonic()))))
        assert await lock.acquire(timeout=5.0)
        acquired[lock.handle.resource] = time.monotonic()
        held.append(lock)
    for node in list(nodes5)[len(nodes5) - dlm.quorum:]:
        node.pause()
    assert await eventually(lambda: len(fired) == count, 8.0), f"told: {sorted(fired)}"
    # Each validity ran out by ttl after its acquire returned: told within one request
    # timeout of that, with room for a busy machine (2 cores shared with other runs).
    late = {r: round(fired[r] - acquired[r] - ttl, 3) for r in acquired}
    print(f"\nthe last of {count} losses was told {max(late.values()):.2f} s after its"
          " validity ran out")
    assert max(late.values()) < 0.6, late


async def test_abandoned_locks_do_not_hold_up_the_renewal_of_a_live_one(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """Auto-extended locks whose handles were garbage-collected are released by the
    renewal loop: before the round, one request each, every one waiting a whole request
    timeout on the hung majority (0.25 s at least: a holder's release is patient), while
    the live lock due with them waited past its validity."""
    ttl = 1.0
    dlm = flavour.manager(nodes5, node_timeout=0.1)
    for i in range(8):  # their handles are dropped at once
        assert await me.on(dlm.lock(f"ttl:abandoned-{i}", ttl=ttl,
                                    auto_extend=True)).acquire(timeout=5.0)
    fired: list[float] = []
    lock = me.on(dlm.lock("ttl:live", ttl=ttl, auto_extend=True,
                          on_lost=flavour.callback(lambda _: fired.append(time.monotonic()))))
    assert await lock.acquire(timeout=5.0)
    acquired = time.monotonic()
    gc.collect()
    for node in list(nodes5)[len(nodes5) - dlm.quorum:]:
        node.pause()
    assert await eventually(lambda: bool(fired), 8.0), "on_lost was never called"
    late = fired[0] - acquired - ttl
    print(f"\nthe live lock's loss was told {late:.2f} s after its validity ran out")
    assert late < 0.6
    # The abandoned ones were released (on the nodes that answer), not renewed.
    assert [lock_keys(nodes5[:2], f"ttl:abandoned-{i}") for i in range(8)] == [
        [False, False]] * 8


async def test_a_long_lock_s_renewal_does_not_hold_up_a_short_one_s_loss(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """A renewal round may wait up to half the validity its locks have left: a lock of
    TTL 10 s whose round met the hung majority kept the renewal loop for 3.3 s, while a
    lock of TTL 2 s, renewed by the same loop but not due in that round, ran out of
    validity and was told about 3 s late. A round now also ends by half the validity left of
    every other lock the loop renews."""
    dlm = flavour.manager(nodes5, node_timeout=0.1)
    long = me.on(dlm.lock("ttl:long", ttl=10.0, auto_extend=True))
    assert await long.acquire(timeout=5.0)
    # A renewal round opens the loop's connections to every node (the asyncio client's
    # loop has connections of its own: with none open to the hung nodes, the long
    # lock's round would end when their connect_timeout of 1 s ran out).
    warm = me.on(dlm.lock("ttl:warm-up", ttl=0.3, auto_extend=True))
    assert await warm.acquire(timeout=5.0)
    await asyncio.sleep(0.5)
    await warm.release()
    # The long lock's first renewal comes after a third of its validity (3.3 s): the
    # short lock is taken before that, due after it (0.66 s on), and the majority hangs.
    await asyncio.sleep(2.4)
    fired: list[float] = []
    short = me.on(dlm.lock("ttl:short-beside-long", ttl=2.0, auto_extend=True,
                           on_lost=flavour.callback(lambda _: fired.append(time.monotonic()))))
    assert await short.acquire(timeout=5.0)
    acquired = time.monotonic()
    paused = list(nodes5)[len(nodes5) - dlm.quorum:]
    for node in paused:
        node.pause()
    assert await eventually(lambda: bool(fired), 8.0), "on_lost was never called"
    late = fired[0] - acquired - 2.0
    print(f"\nthe short lock's loss was told {late:.2f} s after its validity ran out")
    for node in paused:  # the long lock's round in flight gets its answers
        node.resume()
    assert late < 0.6
