"""A failed attempt's commands that reach a node late change nothing its call's later
attempt set there (docs/design.md §2.1), on both clients, with real nodes.

The sequence: a blocking acquire's first attempt writes its ACQUIRE to node 0 on one
connection, and that connection stalls (a lost packet waiting for its retransmission
does this; here a forwarder holds its bytes back, tests/support/stall.py). The attempt
fails: node 1 is held by somebody else, only node 2 granted. Its release for node 0 is
written behind the stalled ACQUIRE and sent on another connection too, where it finds
nothing. The next attempt gets nodes 0 and 2, a quorum of 3, and holds the lock. Then
the stalled connection's bytes arrive: the first attempt's ACQUIRE, then its RELEASE.

When every attempt of a call set the same lock value, that ACQUIRE found "our" key
and refreshed it, and that RELEASE deleted it: the lock, counted on nodes 0 and 2, held
on node 2 alone, one node short of a quorum (a client that found node 1 free too would
have taken it), and its release raised LockLost. Each attempt now sets a value of its
own, so the late commands find a later attempt's value: the ACQUIRE is refused and the
RELEASE deletes nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour
from tests.support.stall import StallingForwarder

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

RESOURCE = "late-attempt"


async def test_a_late_acquire_and_release_of_a_failed_attempt_leave_the_next_attempts_key(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    key = f"redlock:{{{RESOURCE}}}:lock"
    with StallingForwarder(nodes3[0].port) as forwarder, \
            nodes3[0].client() as node0, nodes3[1].client() as node1, \
            nodes3[2].client() as node2:
        urls = [forwarder.url, nodes3[1].url, nodes3[2].url]
        dlm = flavour.manager(urls, node_timeout=0.1, connect_timeout=10.0)
        assert await me.cycle(dlm.lock("warm-up"))  # connected and inspected
        node1.set(key, "somebody else", px=30_000)

        forwarder.stall_next()
        lock = me.on(dlm.lock(RESOURCE, ttl=20.0))
        assert await lock.acquire(timeout=5.0)
        assert forwarder.stalled()  # the first attempt's ACQUIRE, and its RELEASE behind it
        ours = node2.get(key)
        assert ours is not None and node0.get(key) == ours  # the second attempt's grants

        forwarder.resume()  # the first attempt's ACQUIRE and RELEASE run on node 0 now
        await asyncio.sleep(0.3)
        assert node0.get(key) == ours
        assert node0.pttl(key) > 10_000

        # Held to the end on both nodes (before: LockLost, "2 of 3 nodes no longer held
        # our key"), and released on both.
        await lock.release()
        assert [node.get(key) for node in (node0, node2)] == [None, None]
