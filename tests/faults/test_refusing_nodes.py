"""A node that refuses connections is not asked again on every request
(redlock._io.wire.Refusals), on both clients, with real nodes.

A connection attempt that failed fast (refused, reset) is not repeated for
RETRY_CONNECT_MIN, doubling to RETRY_CONNECT_MAX: meanwhile that node's calls fail at
once with the same error. Before, every request opened a connection (a thread or a
task) to each refusing node: with 2 of 5 down, an acquire+release took 3.2 times the
healthy cycle on the sync client and 2.0 times on the asyncio one. A node that comes
back is asked again within RETRY_CONNECT_MAX.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from redlock._io import wire
from redlock.testing import Proxies, RedisNodes
from tests.clients import Actor, Flavour, Stopwatch
from tests.peek import write_markers

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

CYCLES = 60


@contextlib.contextmanager
def slamming_port() -> Iterator[tuple[str, list[int]]]:
    """A loopback port that accepts each connection and resets it at once (a node whose
    host refuses it, counted): its URL, and how many connections it was asked for."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # (a closed listener does not wake accept(): it polls)
    count = [0]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            count[0] += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # (linger on, 0 s: a reset)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}", count
    finally:
        stop.set()
        thread.join(5.0)
        listener.close()


async def cycles(me: Actor, dlm: object, count: int) -> None:
    lock = me.on(dlm.lock("refused", ttl=5.0))  # type: ignore[attr-defined]
    for _ in range(count):
        assert await lock.acquire(blocking=False)
        await lock.release()


async def test_a_refusing_node_is_not_asked_on_every_request(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    write_markers(nodes3)  # (a cluster in use: a new one needs every node once)
    with slamming_port() as (url_a, asked_a), slamming_port() as (url_b, asked_b):
        dlm = flavour.manager([*nodes3.urls, url_a, url_b])
        took = Stopwatch()
        await cycles(me, dlm, CYCLES)
        seconds = took()
    asked = asked_a[0] + asked_b[0]
    # Each of the 2 * CYCLES requests asked both, before (2 connections per request, at
    # least 240). Now at most one attempt per node in each RETRY_CONNECT_MIN (the waits
    # double), and far fewer than one per request.
    assert asked <= 2 * (1 + seconds / wire.RETRY_CONNECT_MIN), (asked, seconds)
    assert asked < CYCLES, (asked, seconds)


async def test_a_node_that_comes_back_is_asked_again(
        flavour: Flavour, me: Actor, proxied5: Proxies) -> None:
    write_markers([proxy.node for proxy in proxied5])
    dlm = flavour.manager(proxied5.urls)
    proxied5[0].refuse()
    await cycles(me, dlm, 20)  # (refused again and again: the wait is at its longest)
    proxied5[0].enable()
    await asyncio.sleep(wire.RETRY_CONNECT_MAX + 0.05)
    # The next request asks node 0 again: it opens a connection there. The other four
    # may decide that request before the connection is up (an acquire is never sent
    # late), so node 0 grants the first one whose connection is open, a request or a
    # few later; refused for ever (the wait never ending), it would grant none.
    key = "redlock:{refused}:lock"
    lock = me.on(dlm.lock("refused", ttl=5.0))
    granted, took = 0, Stopwatch()
    with proxied5[0].node.client() as node0:
        while not granted and took() < 2.0:
            assert await lock.acquire(blocking=False)
            granted = node0.exists(key)
            await lock.release()
    assert granted == 1, f"node 0 granted nothing in {took():.2f} s"
