"""Case 2: an asyncio application whose event loop also does CPU work.

A coroutine blocks the loop 3 ms at a time (``time.sleep(0.003); await asyncio.sleep(0)``,
as a synchronous parser, a template or a hash would), while the application holds and
waits for locks with ``AsyncRedlock`` on its default settings over real redis-server
nodes. The loop answers a little late, all the time; the nodes are healthy. Nothing
here may be lost, refused or unfair because of that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from fencing import AsyncRedisFencedStore
from redlock import AsyncLock, AsyncRedlock, LockLost, QuorumUnavailable
from redlock.testing import RedisNode, RedisNodes
from tests.apps.support import (
    NAMESPACE,
    BusyLoop,
    Tally,
    lock_key,
    not_rising,
    nothing_left,
    within,
)
from tests.internals import Keys

HOLDERS = 200  # (a): auto-extended locks held at once, each on a resource of its own
HOLD_TTL = 1.0
HOLD_SECONDS = 2.5

WORKERS, ROUNDS = 50, 2  # (b): 50 tasks x 2 acquisitions of one resource
# The figure is 60 s. A correct client serves these 100 short critical sections
# in a few seconds (1.1 s without the busy loop, measured), so 20 s is still a wide
# margin, and a failing run ends within the per-test limit (2 x 20 s, not 2 x 60 s).
ROUND_TIMEOUT = 20.0

WAITERS = 100  # (c): waiters of one resource, all at once
WAITER_TIMEOUT = 30.0
WAITER_WORK = 0.01  # each holds the lock this long: a line of ~1 s of work


@pytest.fixture
async def data(counter_node: RedisNode) -> Any:
    """The application's own Redis (counter, fenced store), asyncio client."""
    client = redis.asyncio.Redis(host=counter_node.host, port=counter_node.port)
    try:
        yield client
    finally:
        await client.aclose()


def _live_keys(node: RedisNode, resources: list[str]) -> set[str]:
    """Which of ``resources`` have a live lock key on ``node`` (asked directly)."""
    with node.client() as client, client.pipeline(transaction=False) as pipe:
        for resource in resources:
            pipe.pttl(lock_key(resource))
        return {r for r, left in zip(resources, pipe.execute(), strict=True) if left > 0}


async def _initialised(dlm: AsyncRedlock) -> None:
    """One lock cycle before the scenario, as an application's first request does: the
    session's nodes are flushed before each test, and the first acquire of an empty
    cluster initialises it (docs/design.md §4.2). These tests are about holding and
    waiting, not about a new cluster's first moments under load."""
    async with dlm.lock("warm-up", ttl=1.0, timeout=10.0):
        pass


@pytest.fixture(params=[3, 5], ids=lambda n: f"N={n}")
def lock_nodes(request: pytest.FixtureRequest) -> RedisNodes:
    nodes: RedisNodes = request.getfixturevalue(f"nodes{request.param}")
    return nodes


@pytest.mark.slow
async def test_auto_extended_locks_survive_a_busy_loop(lock_nodes: RedisNodes) -> None:
    """200 auto-extended locks (ttl 1 s, each on its own resource) held at once for 2.5 s
    while the loop is kept busy: none may be lost.

    Proves that the renewal loop keeps every lock alive when the event loop is merely
    late (3 ms blocks; the TTL is 1 s, a renewal is due every ~0.3 s): ``check()`` passes
    at the end of every hold, no ``on_lost`` fires, every lock's key is still on a quorum
    of the nodes (asked directly) at the end, the releases report no loss, everything
    ends within its deadline and nothing of the library is left running afterwards.
    """
    baseline = asyncio.all_tasks()
    quorum = len(lock_nodes) // 2 + 1
    tally = Tally()
    told_lost: list[str] = []
    at_end: list[str] = []  # the resources whose holders passed check() after the hold
    everyone_at_end = asyncio.Event()  # every holder is at the end of its hold, or failed
    release_now = asyncio.Event()
    arrived = 0

    def arrive() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == HOLDERS:
            everyone_at_end.set()

    async def on_lost(handle: AsyncLock) -> None:
        told_lost.append(str(handle))

    async def holder(dlm: AsyncRedlock, index: int) -> None:
        resource = f"job:{index}"
        where = "acquire"
        try:
            async with dlm.lock(resource, ttl=HOLD_TTL, auto_extend=True, on_lost=on_lost,
                                timeout=10.0) as held:
                where = "hold"
                await asyncio.sleep(HOLD_SECONDS)
                where = "check"
                held.check()
                at_end.append(resource)
                where = "held to the end"  # still held while the test looks at the nodes
                arrive()
                await asyncio.wait_for(release_now.wait(), 15.0)
                where = "release"
            tally.ok()
        except Exception as exc:
            tally.failed(exc, where)
            if where not in ("held to the end", "release"):  # not arrived yet
                arrive()

    held_keys: list[set[str]] = []
    async with AsyncRedlock(lock_nodes.urls) as dlm:
        await _initialised(dlm)
        started = time.monotonic()
        async with BusyLoop() as busy:
            holders = asyncio.gather(*(holder(dlm, i) for i in range(HOLDERS)))
            try:
                await within(20.0, everyone_at_end.wait(), tally, "the holds")
                # Still held (and renewed): every lock's key must be on a quorum of nodes.
                held_keys = [_live_keys(node, at_end) for node in lock_nodes]
            finally:
                release_now.set()
                await within(20.0, holders, tally, "the releases")
        took = time.monotonic() - started
    left = await nothing_left(baseline)

    per_node = [len(keys) for keys in held_keys]
    short = [r for r in at_end if sum(r in keys for keys in held_keys) < quorum]
    lost = tally.count("LockLost")
    figures = (f"N={len(lock_nodes)}, {HOLDERS} holders in {took:.1f} s, {busy.blocks}"
               f" loop blocks of 3 ms: {tally}\non_lost called {len(told_lost)} times;"
               f" keys still on each node at the end (of {len(at_end)} held): {per_node}")
    problems = []
    if lost:
        problems.append(f"lost {lost}/{HOLDERS} auto-extended locks with every node up")
    if tally.counts["ok"] != HOLDERS:
        problems.append(f"only {tally.counts['ok']}/{HOLDERS} holds ended well")
    if told_lost:
        problems.append(f"on_lost called {len(told_lost)} times")
    if short:
        problems.append(f"{len(short)} locks held to the end had their key on fewer than"
                        f" {quorum} nodes")
    if left:
        problems.append(f"left running after close: {left}")
    assert not problems, "\n".join(problems) + "\n" + figures


async def _one_resource(dlm: AsyncRedlock, data: Any, resource: str, timeout: float,
                        work: float, tally: Tally, tokens: list[int]) -> None:
    """One acquisition of ``resource`` around a GET-then-SET increment of its counter
    (and a fenced write with the token): what only the lock makes safe."""
    store = AsyncRedisFencedStore(data)
    where = "acquire"
    try:
        async with dlm.lock(resource, ttl=5.0, timeout=timeout) as held:
            where = "critical section"
            tokens.append(held.token)  # in the order the critical sections run
            value = int(await data.get(f"counter:{resource}") or 0)
            if work:
                await asyncio.sleep(work)
            await store.write(resource, held.token, str(value + 1).encode())
            await data.set(f"counter:{resource}", value + 1)
            where = "release"
        tally.ok()
    except Exception as exc:
        tally.failed(exc, where)


async def _contend(nodes: RedisNodes, data: Any, owners: int,
                   owner: Callable[[AsyncRedlock, Tally, list[int]], Awaitable[None]],
                   deadline: float, what: str) -> tuple[Tally, list[int], int, float, list[str]]:
    """``owners`` tasks running ``owner`` at once on one manager, with the loop kept busy:
    their tally, the tokens in grant order, the counter, the time taken, and what was
    left running after the manager was closed."""
    baseline = asyncio.all_tasks()
    tally = Tally()
    tokens: list[int] = []
    async with AsyncRedlock(nodes.urls) as dlm:
        await _initialised(dlm)
        started = time.monotonic()
        async with BusyLoop():
            await within(deadline, asyncio.gather(
                *(owner(dlm, tally, tokens) for _ in range(owners))), tally, what)
        took = time.monotonic() - started
    left = await nothing_left(baseline)
    counter = int(await data.get("counter:stock") or 0)
    return tally, tokens, counter, took, left


async def _contend_and_check(nodes: RedisNodes, data: Any, owners: int,
                             owner: Callable[[AsyncRedlock, Tally, list[int]], Awaitable[None]],
                             deadline: float, what: str, expected: int, label: str) -> None:
    """``_contend``, then every one of the ``expected`` acquisitions must have been
    granted and the counter must be exactly ``expected`` (``_contention_problems``)."""
    tally, tokens, counter, took, left = await _contend(nodes, data, owners, owner, deadline,
                                                        what)
    problems = _contention_problems(tally, tokens, counter, expected, left)
    if counter != expected:
        problems.append(f"counter {counter}, expected exactly {expected}")
    assert not problems, "\n".join(problems) + (
        f"\n{label} in {took:.1f} s: {tally}\ncounter {counter}")


def _contention_problems(tally: Tally, tokens: list[int], counter: int, expected: int,
                         left: list[str]) -> list[str]:
    problems = []
    if tally.counts["ok"] != expected:
        problems.append(f"only {tally.counts['ok']}/{expected} acquisitions granted")
    if tally.count(QuorumUnavailable.__name__):
        problems.append(f"{tally.count(QuorumUnavailable.__name__)} QuorumUnavailable"
                        " with every node up")
    if tally.count(LockLost.__name__):
        problems.append(f"{tally.count(LockLost.__name__)} false LockLost")
    if counter != len(tokens):
        problems.append(f"lost update: counter {counter} after {len(tokens)} critical sections")
    if not_rising(tokens):
        problems.append(f"tokens not rising in grant order at {not_rising(tokens)[:5]}")
    if left:
        problems.append(f"left running after close: {left}")
    return problems


@pytest.mark.slow
async def test_one_resource_two_rounds_under_a_busy_loop(nodes5: RedisNodes,
                                                         data: Any) -> None:
    """50 tasks each acquire one shared resource twice in a row (timeout 20 s each) and
    increment a counter under it, while the loop is kept busy.

    Proves that contention on a late loop only makes waiters wait: every one of the 100
    acquisitions is granted within its timeout (there are ~100 short critical sections
    to serve), none raises ``QuorumUnavailable`` or ``LockLost`` with all nodes up, the
    GET-then-SET counter is exact, tokens strictly rise in grant order, and nothing of
    the library is left running after close.
    """

    async def owner(dlm: AsyncRedlock, tally: Tally, tokens: list[int]) -> None:
        for _ in range(ROUNDS):
            await _one_resource(dlm, data, "stock", ROUND_TIMEOUT, 0.0, tally, tokens)

    await _contend_and_check(nodes5, data, WORKERS, owner, ROUNDS * ROUND_TIMEOUT + 20.0,
                             "the two rounds", WORKERS * ROUNDS, f"{WORKERS} tasks x {ROUNDS}")


@pytest.mark.slow
async def test_a_hundred_waiters_under_a_busy_loop(nodes5: RedisNodes, data: Any) -> None:
    """100 tasks wait at once for one resource (timeout 30 s each), each holding it 10 ms
    to increment a counter, while the loop is kept busy.

    Proves that the waiting line serves a long queue on a late loop: all 100 are granted
    within their timeout (about 1 s of work in all; a line that stalls shows as waiters
    refused with "free, but N waiters are first in line" until they give up), no
    ``QuorumUnavailable`` with all nodes up, the counter is exact, tokens strictly rise,
    nothing is left running.
    """

    async def owner(dlm: AsyncRedlock, tally: Tally, tokens: list[int]) -> None:
        await _one_resource(dlm, data, "stock", WAITER_TIMEOUT, WAITER_WORK, tally, tokens)

    await _contend_and_check(nodes5, data, WAITERS, owner, WAITER_TIMEOUT + 20.0,
                             "the waiters", WAITERS, f"{WAITERS} waiters")


@pytest.mark.slow
async def test_a_new_cluster_under_a_burst_of_first_acquires(nodes5: RedisNodes) -> None:
    """The application's very first requests arrive together: 200 tasks acquire and
    release distinct resources at once on 5 brand-new (empty) nodes while the loop is
    kept busy, with no warm-up.

    Proves that a new cluster's initialisation under load completes once and hurts
    nobody: every acquisition is granted, none raises ``ClusterAmnesiaError`` (seen
    before: all 200 in 2 of 7 runs, "3 of 5 nodes have no node marker") or
    ``QuorumUnavailable``, every node ends with its marker and no node is benched as
    amnesiac (no amnesia episode key on any node: a benched node stays out an hour).
    """
    baseline = asyncio.all_tasks()
    tally = Tally()

    async def first_request(dlm: AsyncRedlock, index: int) -> None:
        try:
            async with dlm.lock(f"first:{index}", ttl=5.0, timeout=10.0):
                await asyncio.sleep(0.01)
            tally.ok()
        except Exception as exc:
            tally.failed(exc, "first request")

    async with AsyncRedlock(nodes5.urls) as dlm, BusyLoop():
        await within(30.0, asyncio.gather(*(first_request(dlm, i) for i in range(200))),
                      tally, "the first requests")
    left = await nothing_left(baseline)
    markers, episodes = [], []
    for node in nodes5:
        with node.client() as client:
            markers.append(bool(client.exists(Keys(NAMESPACE).marker)))
            episodes.append(bool(client.exists(Keys(NAMESPACE).episode)))
    problems = []
    if tally.counts["ok"] != 200:
        problems.append(f"only {tally.counts['ok']}/200 first requests succeeded: {tally}")
    if not all(markers):
        problems.append(f"nodes without their marker: {markers}")
    if any(episodes):
        problems.append(f"nodes benched as amnesiac (episode keys): {episodes}")
    if left:
        problems.append(f"left running after close: {left}")
    assert not problems, "\n".join(problems)
