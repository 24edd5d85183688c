"""One route per lock operation (docs/design.md §2.6): every acquire and release, of a
new manager or of one that has long known its nodes, goes the same way, and the rare
cases are branches of it. What is counted is the requests the handles send (the usual
acquire is one, the usual release one, from a manager's very first call); what is
asserted besides is the outcome on the nodes: keys, lock values and fence counters.
The cases: a clean grant, a refusal and a wait in line, counters written back, a silent
node; none warms the manager first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redlock import Outcome
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, eventually
from tests.internals import requests_sent, scripts
from tests.peek import (
    decided_as,
    fence_counters,
    lock_keys,
    lock_values,
    resume_and_settle,
    set_fence_counters,
    strictly_increasing,
)


async def initialised(flavour: Flavour, nodes: RedisNodes) -> None:
    """The cluster as another client left it: initialised (a new cluster's first acquire
    writes the markers first, docs/design.md §4.2)."""
    other = flavour.actor("other")
    async with other.holding(flavour.manager(nodes).lock("route:other", ttl=5.0)):
        pass


def scripts_of(sent: list[Any]) -> list[str]:
    """Each request's script (its first call's), in order."""
    return [r.calls[0].script.name if r.calls[0].script is not None else r.calls[0].args[0]
            for r in sent]


async def test_an_uncontended_lock_is_one_request_each_way_from_the_first_call(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    await initialised(flavour, cluster)
    dlm = flavour.manager(cluster)
    sent = requests_sent(dlm)  # a new manager: nothing sent yet
    lock = me.on(dlm.lock("route:r", ttl=5.0))
    tokens = []
    for blocking in (True, False, True, False):
        assert await lock.acquire(blocking=blocking)
        tokens.append(await lock.token())
        assert lock_keys(cluster, "route:r") == [True] * len(cluster)
        assert 4.5 < await lock.validity() <= 5.0
        await lock.release()
        assert lock_keys(cluster, "route:r") == [False] * len(cluster)
    async with me.holding(dlm.lock("route:r", ttl=5.0)) as held:
        tokens.append(await held.token())
    assert lock_keys(cluster, "route:r") == [False] * len(cluster)
    assert scripts_of(sent) == ["acquire", "release"] * 5
    # The manager's first attempt read its nodes' configuration in the same round.
    assert [c.args[0] for c in sent[0].calls[len(cluster):]] == ["INFO"] * len(cluster)
    assert all(len(r.calls) == len(cluster) for r in sent[1:])
    assert strictly_increasing(tokens)
    assert fence_counters(cluster, "route:r") == [tokens[-1]] * len(cluster)


async def test_sets_and_the_lock_family_take_the_same_route(flavour: Flavour, me: Actor,
                                                            nodes3: RedisNodes) -> None:
    await initialised(flavour, nodes3)
    dlm = flavour.manager(nodes3)
    sent = requests_sent(dlm)
    async with me.holding(dlm.lock_many(["route:a", "route:b"], ttl=5.0)):
        pass
    async with me.holding(dlm.semaphore("route:s", permits=2, ttl=5.0)):
        pass
    async with me.holding(dlm.rwlock("route:rw", ttl=5.0).write()):
        pass
    assert [r.calls[0].script for r in sent] == [
        scripts.ACQUIRE_MANY, scripts.RELEASE, sent[2].calls[0].script,
        sent[3].calls[0].script, sent[4].calls[0].script, scripts.RELEASE]
    assert len(sent) == 6  # one request each way, whatever the kind


async def test_a_refused_attempt_is_judged_and_a_blocking_one_waits_in_line(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """Held by another manager's caller: the single try is refused (the failure says
    why), the blocking one waits in line and is served when the holder releases."""
    dlm = flavour.manager(nodes3)
    holder_actor = flavour.actor("holder")
    holder = holder_actor.on(flavour.manager(nodes3).lock("route:held", ttl=5.0))
    assert await holder.acquire(blocking=False)
    held_by = lock_values(nodes3, "route:held")
    lock = me.on(dlm.lock("route:held", ttl=5.0))
    sent = requests_sent(dlm)

    assert not await lock.acquire(blocking=False)
    assert scripts_of(sent) == ["acquire"]  # refused everywhere: nothing to release
    failure = lock.last_failure
    assert failure is not None
    assert decided_as(failure.outcomes, [Outcome.REFUSED] * 3, dlm.quorum), failure.outcomes
    assert lock_values(nodes3, "route:held") == held_by  # nothing of ours was set

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await holder.release()
    first = await holder.token()
    acquired, _ = await asyncio.gather(lock.acquire(timeout=5.0), release_soon())
    assert acquired and await lock.token() > first
    await lock.release()
    assert lock_keys(nodes3, "route:held") == [False] * 3


async def test_counters_that_differ_are_written_back(flavour: Flavour, me: Actor,
                                                     nodes3: RedisNodes) -> None:
    """One node's counter is ahead: the attempt's token is committed on that node only,
    so it is written back to the others before the lock is held."""
    await initialised(flavour, nodes3)
    dlm = flavour.manager(nodes3)
    set_fence_counters(nodes3, "route:ahead", [50, 7, 7])
    lock = me.on(dlm.lock("route:ahead", ttl=5.0))
    sent = requests_sent(dlm)
    assert await lock.acquire(blocking=False)
    assert await lock.token() == 51
    assert scripts_of(sent) == ["acquire", "write_back"]
    assert fence_counters(nodes3, "route:ahead") == [51, 51, 51]
    await lock.release()
    assert scripts_of(sent) == ["acquire", "write_back", "release"]
    assert lock_keys(nodes3, "route:ahead") == [False] * 3


async def test_a_silent_node_is_decided_without(flavour: Flavour, me: Actor,
                                                nodes3: RedisNodes) -> None:
    """A node that does not answer in time: the attempt is decided on the other two (a
    quorum), and released as a holder does; the lagging node's late key goes with its
    release."""
    dlm = flavour.manager(nodes3)
    lock = me.on(dlm.lock("route:silent", ttl=5.0))
    assert await lock.acquire(blocking=False)  # (connections to every node open)
    await lock.release()
    nodes3[2].pause()
    try:
        assert await lock.acquire(blocking=False)
        token = await lock.token()
        assert lock_keys(nodes3[:2], "route:silent") == [True, True]
        assert fence_counters(nodes3[:2], "route:silent") == [token, token]
        await lock.release()  # acked by the two: not lost, whatever the third says
        assert lock_keys(nodes3[:2], "route:silent") == [False, False]
    finally:
        resume_and_settle(nodes3[2:])
    # The release trails the acquire on the silent node's connection (docs/design.md §2.4)
    assert await eventually(lambda: lock_keys(nodes3, "route:silent") == [False] * 3, 2.0)
