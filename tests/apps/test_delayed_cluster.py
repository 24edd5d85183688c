"""Case 3: a cluster behind a real network delay, stalled once.

Three real redis-server nodes, each behind its own Toxiproxy proxy that delays every
packet ~1 ms each way (a ~2 ms round trip, a LAN's), used by both clients on their
default settings. While the application holds a lock (ttl 10 s) and an auto-extended one
(ttl 3 s), every node stalls once for at least 0.3 s (SIGSTOP, then SIGCONT: a host
freeze, a fork for a snapshot, a VM migration) so that a request made meanwhile times
out. The nodes come back with every key intact; so must the application's locks.

One behaviour, both clients: the ``flavour`` fixture (tests/conftest.py) runs it on
``Redlock`` (the calls made from a thread of their own) and on ``AsyncRedlock`` (from a
task), through the actors of tests/clients.py. The lock family (a permit, a read, a
leadership) goes through the same stall in a test of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest

from redlock import LockNotAcquired, RedlockError
from redlock.testing import Proxies, RedisNodes, ToxiproxyServer
from tests.apps.support import pttls, wait_no_library_threads, wait_no_other_tasks
from tests.clients import Actor, Flavour, Held, resolve

pytestmark = pytest.mark.faults

DELAY_MS = 1  # each way, on every proxy
STALL = 0.3  # at least this long, and until the request made meanwhile has ended
STALL_LIMIT = 5.0  # a request that does not end while every node is stopped is a hang
HELD_TTL = 10.0
AUTO_TTL = 3.0

HELD, AUTO, BYSTANDER = "orders:42", "sessions:7", "orders:43"


@pytest.fixture
def delayed3(nodes3: RedisNodes, toxiproxy: ToxiproxyServer) -> Iterator[Proxies]:
    """The three nodes, each behind a proxy of its own that delays both directions by
    ``DELAY_MS``; the proxies are deleted after the test."""
    proxies = toxiproxy.front(nodes3)
    try:
        for proxy in proxies:
            proxy.add_toxic("latency", stream="upstream", latency=DELAY_MS)
            proxy.add_toxic("latency", stream="downstream", latency=DELAY_MS)
        yield proxies
    finally:
        for proxy in proxies:
            with contextlib.suppress(Exception):  # the next proxy must still go
                proxy.delete()


async def _stalled(nodes: RedisNodes, bystander: Held) -> tuple[object, float]:
    """Stop every node until ``bystander``'s single try has ended (timed out), and at
    least STALL seconds; resume them. The try's outcome (False or the LockNotAcquired it
    raised; anything else fails the test) and how long the stall lasted."""
    for node in nodes:
        node.pause()
    try:
        stalled = time.monotonic()
        attempt = asyncio.ensure_future(bystander.acquire(blocking=False, limit=STALL_LIMIT))
        done, _ = await asyncio.wait({attempt}, timeout=STALL_LIMIT)
        await asyncio.sleep(max(0.0, STALL - (time.monotonic() - stalled)))
    finally:
        for node in nodes:
            node.resume()
    stall = time.monotonic() - stalled
    assert done, f"an acquire with every node stopped did not end within {STALL_LIMIT} s"
    try:
        got: object = attempt.result()
    except LockNotAcquired as exc:  # QuorumUnavailable: every node timed out
        got = exc
    assert got is False or isinstance(got, LockNotAcquired), (
        f"an acquire with every node stopped returned {got!r}")
    return got, stall



async def _closed(dlm: Any, actors: list[Actor], baseline: set[asyncio.Task[Any]]
                  ) -> list[str]:
    """Close the actors and the manager; what of the library is still running after."""
    for actor in actors:
        await actor.close()
    await resolve(dlm.close())
    left = wait_no_library_threads() + await wait_no_other_tasks(baseline)
    return [f"left running after close: {left}"] if left else []

class Steps:
    """Calls whose RedlockError is noted as a problem (every failure is reported with its
    figures at once, at the end) instead of ending the test."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    async def __call__(self, what: str, call: Awaitable[object]) -> object:
        try:
            return await call
        except RedlockError as exc:
            self.problems.append(f"{what}: {type(exc).__name__}: {exc}")
            return None


@pytest.mark.slow
async def test_one_stall_of_every_node_loses_no_lock(flavour: Flavour, nodes3: RedisNodes,
                                                     delayed3: Proxies) -> None:
    """After every node stalled once (a request timing out meanwhile) and came back:

    * ``extend()`` of the lock held across the stall succeeds, again and again, with its
      full validity; its key is on every node with a fresh PTTL (asked directly): the
      stall cost nothing, so nothing may be lost, and no key may be deleted;
    * the auto-extended lock (ttl 3 s) held across the stall and for longer than its TTL
      after it still passes ``check()``, its key on every node;
    * the request made during the stall did not get the lock with every node stopped,
      and its key does not linger: it is released once the nodes answer (design §5.5);
    * both releases report no loss, and the next holder of the resource gets a larger
      token (fencing);
    * nothing hangs, and nothing of the library runs after the manager is closed.
    """
    baseline = asyncio.all_tasks()
    dlm = flavour.bare_manager(delayed3.urls)  # the library's defaults, as an app would
    holder, bystander, successor = (flavour.actor(name)
                                    for name in ("holder", "bystander", "successor"))
    held = holder.on(dlm.lock(HELD, ttl=HELD_TTL))
    auto = holder.on(dlm.lock(AUTO, ttl=AUTO_TTL, auto_extend=True))
    assert await held.acquire(blocking=False)
    assert await auto.acquire(blocking=False)
    first_token = int(await held.token())
    for _ in range(10):  # a few rounds at the delayed round trip: what the client measures
        await held.extend()

    # The stall: every node stopped until the bystander's acquire has ended (timed out),
    # and at least STALL seconds.
    got, stall = await _stalled(nodes3, bystander.on(dlm.lock(BYSTANDER, ttl=HELD_TTL)))

    # Everything below is checked, and every failure reported with its figures at once.
    step = Steps()
    problems = step.problems

    # Afterwards: the lock held across the stall extends, with its keys where they were.
    left_before = round(float(await held.validity()), 2)
    extended = []
    for i in range(3):
        await step(f"extend() #{i + 1} after the stall"
                   + (f" (with {left_before} s of validity left)" if i == 0 else ""),
                   held.extend())
        extended.append(round(float(await held.validity()), 2))
        await asyncio.sleep(0.1)
    on_nodes = pttls(nodes3, HELD)
    if min(extended) < HELD_TTL - 1.0:
        problems.append(f"validity after each extend(): {extended}")
    if min(on_nodes) < (HELD_TTL - 1.5) * 1000:
        problems.append(f"{HELD}'s key on the nodes after the extends (PTTL ms, -2: gone):"
                        f" {on_nodes}")

    # The auto-extended lock, held past its TTL after the stall: still renewed.
    await asyncio.sleep(AUTO_TTL + 0.5)
    await step(f"check() of the auto-extended lock {AUTO_TTL + 0.5} s after the stall",
               auto.check())
    auto_on_nodes = pttls(nodes3, AUTO)
    if min(auto_on_nodes) <= 0:
        problems.append(f"{AUTO}'s key on the nodes (PTTL ms): {auto_on_nodes}")

    # The bystander's attempt left no key behind (its release runs after its acquire).
    deadline = time.monotonic() + 2.0
    while max(pttls(nodes3, BYSTANDER)) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if max(pttls(nodes3, BYSTANDER)) > 0:
        problems.append(f"the failed attempt's key lingers: {pttls(nodes3, BYSTANDER)}")

    await step("release() of the held lock", held.release())
    await step("release() of the auto-extended lock", auto.release())
    if max(pttls(nodes3, HELD) + pttls(nodes3, AUTO)) > 0:
        problems.append(f"keys left after the releases (PTTL ms): {HELD}"
                        f" {pttls(nodes3, HELD)}, {AUTO} {pttls(nodes3, AUTO)}")
    next_holder = successor.on(dlm.lock(HELD, ttl=HELD_TTL))
    if await step("the next holder's acquire", next_holder.acquire(timeout=5.0)):
        next_token = int(await next_holder.token())
        await step("the next holder's release", next_holder.release())
        if next_token <= first_token:
            problems.append(f"the next holder's token {next_token} after {first_token}")
    else:
        problems.append("the next holder did not get the lock within 5 s")

    problems += await _closed(dlm, [holder, bystander, successor], baseline)
    assert not problems, "\n".join(problems) + f"\n(stall {stall:.2f} s, {got!r})"


def _family_pttls(nodes: RedisNodes, key: str, member: str | None = None) -> list[int]:
    """Per node: a key's PTTL in ms (-2: gone); for the read-write lock's readers (a
    sorted set of leases by the node's clock), ms left of ``member``'s lease."""
    left = []
    for node in nodes:
        with node.client() as client:
            if member is None:
                left.append(int(client.pttl(key)))
                continue
            lease = client.zscore(key, member)
            now_s, now_us = client.time()
            now_ms = now_s * 1000 + now_us // 1000
            left.append(-2 if lease is None else int(lease - now_ms))
    return left


@pytest.mark.slow
async def test_one_stall_of_every_node_loses_no_family_grant(
        flavour: Flavour, nodes3: RedisNodes, delayed3: Proxies) -> None:
    """The lock family across the same stall: a semaphore permit, a read of a read-write
    lock and an election's leadership, all renewed (ttl 3 s), held across one stall of
    every node and for longer than their TTL after it, pass ``check()`` with their keys
    (or lease) on every node; a permit asked for during the stall is not granted and
    leaves nothing behind; the releases free everything; nothing hangs or lingers."""
    baseline = asyncio.all_tasks()
    dlm = flavour.bare_manager(delayed3.urls)
    holder, bystander = flavour.actor("holder"), flavour.actor("bystander")
    permit = holder.on(dlm.semaphore("family:stall:sem", permits=1, ttl=AUTO_TTL,
                                     auto_extend=True))
    reading = holder.on(dlm.rwlock("family:stall:doc", ttl=AUTO_TTL).read(auto_extend=True))
    election = dlm.election("family:stall:leader", ttl=AUTO_TTL, identity="holder")
    leading = holder.on(election.campaign(timeout=5.0))
    assert await permit.acquire(timeout=5.0)
    assert await reading.acquire(timeout=5.0)
    assert await leading.acquire(timeout=5.0)
    term = int(await leading.token())

    got, stall = await _stalled(nodes3, bystander.on(
        dlm.semaphore("family:stall:sem", permits=1, ttl=AUTO_TTL)))
    step = Steps()
    problems = step.problems

    await asyncio.sleep(AUTO_TTL + 0.5)  # past the TTL: only the renewals keep them
    for name, handle in (("permit", permit), ("read", reading), ("leadership", leading)):
        await step(f"check() of the {name} {AUTO_TTL + 0.5} s after the stall", handle.check())
    read_member = None
    with nodes3[0].client() as client:  # the reader's id in the lease set (SHA1 of its owner)
        members = client.zrange("redlock:{family:stall:doc}:read", 0, -1)
        read_member = members[0].decode() if members else None
    on_nodes = {
        "permit": _family_pttls(nodes3, "redlock:{family:stall:sem}:permit:0"),
        "leader": _family_pttls(nodes3, "redlock:{family:stall:leader}:leader"),
        "read lease": (_family_pttls(nodes3, "redlock:{family:stall:doc}:read", read_member)
                       if read_member else [-2]),
    }
    for what, left in on_nodes.items():
        if min(left) <= 0:
            problems.append(f"the {what} on the nodes (ms left, -2: gone): {left}")
    seen = await resolve(election.leader())
    if seen is None or seen.identity != "holder" or seen.token != term:
        problems.append(f"leader() after the stall: {seen} (term {term} expected)")

    await step("release() of the permit", permit.release())
    await step("release() of the read", reading.release())
    await step("resigning the leadership", leading.release())
    after = {what: max(_family_pttls(nodes3, key)) for what, key in (
        ("permit", "redlock:{family:stall:sem}:permit:0"),
        ("leader", "redlock:{family:stall:leader}:leader"))}
    if any(left > 0 for left in after.values()):
        problems.append(f"keys left after the releases (PTTL ms): {after}")
    status = await resolve(dlm.rwlock("family:stall:doc").status())
    if status.readers:
        problems.append(f"readers left after the release: {status.readers}")

    problems += await _closed(dlm, [holder, bystander], baseline)
    assert not problems, "\n".join(problems) + f"\n(stall {stall:.2f} s, {got!r})"
