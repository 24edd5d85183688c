"""The quick lane (docs/design.md §2.6): an uncontended lock's acquire and release go
straight through the transport, and everything else goes on in the flow from what the
quick attempt came to, with the flow's outcome.

Each test warms its manager first (a new manager learns its nodes' configuration and
markers through the flow), then counts the flows it drives: none for the clean case,
one where the replies needed a decision. What is asserted besides is the outcome on
the nodes: keys, owners and fence counters.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redlock import Outcome
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, eventually
from tests.internals import flows_driven
from tests.peek import (
    decided_as,
    fence_counters,
    lock_keys,
    lock_values,
    resume_and_settle,
    set_fence_counters,
    strictly_increasing,
)


async def warm(me: Actor, dlm: Any) -> None:
    """One acquire and release through the flow: the manager now knows its nodes."""
    lock = me.on(dlm.lock("quick:warm", ttl=5.0))
    assert await lock.acquire(blocking=False)
    await lock.release()


async def test_an_uncontended_lock_takes_the_quick_lane(flavour: Flavour, me: Actor,
                                                        cluster: RedisNodes) -> None:
    dlm = flavour.manager(cluster)
    await warm(me, dlm)
    lock = me.on(dlm.lock("quick:r", ttl=5.0))
    driven = flows_driven(dlm)
    tokens = []
    for blocking in (True, False, True, False):
        assert await lock.acquire(blocking=blocking)
        tokens.append(await lock.token())
        assert lock_keys(cluster, "quick:r") == [True] * len(cluster)
        assert 4.5 < await lock.validity() <= 5.0
        await lock.release()
        assert lock_keys(cluster, "quick:r") == [False] * len(cluster)
    async with me.holding(dlm.lock("quick:r", ttl=5.0)) as held:
        tokens.append(await held.token())
    assert lock_keys(cluster, "quick:r") == [False] * len(cluster)
    assert driven() == 0
    assert strictly_increasing(tokens)
    assert fence_counters(cluster, "quick:r") == [tokens[-1]] * len(cluster)


async def test_a_refused_quick_attempt_goes_on_in_the_flow(flavour: Flavour, me: Actor,
                                                           nodes3: RedisNodes) -> None:
    """Held by another manager's caller: the single try is refused (the flow says why),
    the blocking one waits in line and is served when the holder releases."""
    dlm = flavour.manager(nodes3)
    await warm(me, dlm)
    holder_actor = flavour.actor("holder")
    holder = holder_actor.on(flavour.manager(nodes3).lock("quick:held", ttl=5.0))
    assert await holder.acquire(blocking=False)
    held_by = lock_values(nodes3, "quick:held")
    lock = me.on(dlm.lock("quick:held", ttl=5.0))
    driven = flows_driven(dlm)

    assert not await lock.acquire(blocking=False)
    assert driven() == 1
    failure = lock.last_failure
    assert failure is not None
    assert decided_as(failure.outcomes, [Outcome.REFUSED] * 3, dlm.quorum), failure.outcomes
    assert lock_values(nodes3, "quick:held") == held_by  # nothing of ours was set

    async def release_soon() -> None:
        await asyncio.sleep(0.2)
        await holder.release()
    first = await holder.token()
    acquired, _ = await asyncio.gather(lock.acquire(timeout=5.0), release_soon())
    assert acquired and await lock.token() > first
    assert driven() == 2
    await lock.release()
    assert lock_keys(nodes3, "quick:held") == [False] * 3


async def test_counters_that_differ_are_written_back_by_the_flow(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """One node's counter is ahead: the quick attempt's token is committed on that node
    only, so the flow writes it back to the others before the lock is held."""
    dlm = flavour.manager(nodes3)
    await warm(me, dlm)
    set_fence_counters(nodes3, "quick:ahead", [50, 7, 7])
    lock = me.on(dlm.lock("quick:ahead", ttl=5.0))
    driven = flows_driven(dlm)
    assert await lock.acquire(blocking=False)
    assert await lock.token() == 51
    assert driven() == 1
    assert fence_counters(nodes3, "quick:ahead") == [51, 51, 51]
    await lock.release()
    assert driven() == 1  # the release is a plain one: quick
    assert lock_keys(nodes3, "quick:ahead") == [False] * 3


async def test_a_silent_node_sends_the_quick_attempt_to_the_flow(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """A node that does not answer in time: the flow decides on the other two (a quorum),
    and releases as a holder does; the lagging node's late key goes with its release."""
    dlm = flavour.manager(nodes3)
    await warm(me, dlm)
    lock = me.on(dlm.lock("quick:silent", ttl=5.0))
    driven = flows_driven(dlm)
    nodes3[2].pause()
    try:
        assert await lock.acquire(blocking=False)
        assert driven() == 1
        token = await lock.token()
        assert lock_keys(nodes3[:2], "quick:silent") == [True, True]
        assert fence_counters(nodes3[:2], "quick:silent") == [token, token]
        await lock.release()  # acked by the two: not lost, whatever the third says
        assert lock_keys(nodes3[:2], "quick:silent") == [False, False]
    finally:
        resume_and_settle(nodes3[2:])
    # The release trails the acquire on the silent node's connection (docs/design.md §2.4)
    assert await eventually(lambda: lock_keys(nodes3, "quick:silent") == [False] * 3, 2.0)
