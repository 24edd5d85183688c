"""The asyncio transport: a request's calls run concurrently, each bounded by its
timeout; an acquire left without a reply (timeout or cancellation) keeps its
connection parked so its release is written behind it (see :mod:`redlock._transport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redlock._node_config import build_pool, check_node_list, node_labels, pool_overrides
from redlock._protocol import Broadcast, Call
from redlock._transport import ParkedAcquires, render

T = TypeVar("T")


async def within(awaitable: Coroutine[Any, Any, T], timeout: float) -> T:
    """``asyncio.wait_for`` without its extra Task per call where the language allows:
    ``asyncio.timeout`` (3.11+) cancels the current task in place, which is cheaper
    (BENCHMARKS.md, the asyncio overhead section)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)  # pragma: no cover (3.10)


async def wait_event(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` passed, whichever comes first."""
    if seconds <= 0 or event.is_set():
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await within(event.wait(), seconds)


class AsyncTransport:
    """One connection pool per node; a request's calls run concurrently."""

    def __init__(self, nodes: Iterable[str | redis.asyncio.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.asyncio.Redis, "redis.asyncio.Redis")
        self.pools: list[redis.asyncio.ConnectionPool] = [
            build_pool(node, redis.asyncio.ConnectionPool, parse_url, overrides) for node in items]
        self.addresses = node_labels(items)
        self._parked: ParkedAcquires[Any] = ParkedAcquires(len(self.pools))

    async def broadcast(self, request: Broadcast) -> list[object]:
        return list(await asyncio.gather(*(self._bounded(call, request.timeout)
                                           for call in request.calls)))

    async def _bounded(self, call: Call, timeout: float) -> object:
        parked = self._parked.take_for(call)
        if parked:
            reply, _ = await asyncio.gather(self._exchange(call, timeout),
                                            self._trail(parked, call, timeout))
            return reply
        return await self._exchange(call, timeout)

    async def _exchange(self, call: Call, timeout: float) -> object:
        """Send one call and read its reply (raw, like the sync transport) in ``timeout``."""
        pool = self.pools[call.node]
        conn: Any = None
        sent = False

        async def exchange() -> object:
            nonlocal conn, sent
            conn = await pool.get_connection()
            await conn.send_command(*render(call, evalsha=True), check_health=False)
            sent = True
            try:
                return await conn.read_response(timeout=timeout, disconnect_on_error=False)
            except NoScriptError:  # first use on this node (or SCRIPT FLUSH): send the body
                await conn.send_command(*render(call, evalsha=False), check_health=False)
                return await conn.read_response(timeout=timeout, disconnect_on_error=False)

        try:
            reply = await within(exchange(), timeout)
        except (asyncio.TimeoutError, RedisTimeoutError):
            await self._no_reply(call, conn, sent)
            return RedisTimeoutError(f"no reply within {timeout * 1000:.0f} ms")
        except asyncio.CancelledError:
            await self._no_reply(call, conn, sent)
            raise
        except Exception as exc:
            if conn is not None:  # a late reply must never be read as the next command's
                await self._discard(call.node, conn)
            return exc
        await pool.release(conn)
        return reply

    async def _no_reply(self, call: Call, conn: Any, sent: bool) -> None:
        if conn is None:
            return  # never connected: the pool took its connection back itself
        if sent and ParkedAcquires.wants(call) and conn.is_connected:
            evicted = self._parked.park(call, conn)
            if evicted is not None:
                await self._discard(call.node, evicted)
            return
        await self._discard(call.node, conn)

    async def _trail(self, parked: list[Any], release: Call, timeout: float) -> None:
        """Write the release behind each unanswered acquire, then close (FIN after it)."""
        for conn in parked:
            with contextlib.suppress(Exception):
                await within(conn.send_command(*render(release, evalsha=False),
                                               check_health=False), timeout)
            await self._discard(release.node, conn)

    async def _discard(self, node: int, conn: Any) -> None:
        """Close a connection (pending writes are flushed first) and hand it back."""
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        with contextlib.suppress(Exception):
            await self.pools[node].release(conn)

    async def close(self) -> None:
        for node, conn in self._parked.drain():
            await self._discard(node, conn)
        for pool in self.pools:
            await pool.disconnect()
