"""A cancelled asyncio release is still sent (issue 10, finding 8).

The release used to mark the acquisition released before anything was sent: a task
cancelled while its release was still connecting (``asyncio.timeout`` around ``async
with lock``) left the key on every node for its whole TTL, and a retried ``release()``
did nothing. Here the nodes answer slowly (Toxiproxy latency on every reply) and the
release must open new connections (the handshake is slow too), so the cancellation
lands before the release was written; the key must still go at once.
"""

from __future__ import annotations

import asyncio

import pytest

from redlock import AsyncRedlock
from redlock.testing import Proxies
from tests.clients import eventually
from tests.internals import drop_idle_connections
from tests.peek import lock_keys

pytestmark = [pytest.mark.faults,
              pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="Python >= 3.11")]


async def test_a_release_cancelled_before_it_was_written_is_sent_anyway(
        proxied5: Proxies) -> None:
    nodes = [proxy.node for proxy in proxied5]
    async with AsyncRedlock(proxied5.urls, node_timeout=2.0) as dlm:
        lock = dlm.lock("cancel:release", ttl=30.0)
        assert await lock.acquire(blocking=False)
        assert lock_keys(nodes, "cancel:release") == [True] * 5
        await drop_idle_connections(dlm)  # the release must connect (and handshake) first
        for proxy in proxied5:
            proxy.latency(0.3)
        # Cancelled inside the handshake (nothing of the release written yet), in the
        # owner's own task, as asyncio.timeout() around a with block does.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await lock.release()
        proxied5.heal()
        # Sent anyway, before the cancellation propagated (not left for its 30 s TTL).
        assert await eventually(lambda: lock_keys(nodes, "cancel:release") == [False] * 5,
                                3.0)
        assert not lock.locked()
        await lock.release()  # done: a second release is a no-op
