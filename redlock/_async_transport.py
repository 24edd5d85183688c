"""The asyncio transport: a request's calls run concurrently, each bounded by its
timeout; an acquire left without a reply (timeout or cancellation) keeps its
connection parked so its release is written behind it (see :mod:`redlock._transport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redlock._node_config import build_pool, check_node_list, node_labels, pool_overrides
from redlock._protocol import Broadcast, Call
from redlock._transport import ParkedAcquires, render

T = TypeVar("T")

_UNREAD: object = object()  # a reply not read yet (None is a real reply)


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


def _is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the stream itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._writer


class AsyncTransport:
    """One connection pool per node; a request's calls run concurrently."""

    def __init__(self, nodes: Iterable[str | redis.asyncio.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.asyncio.Redis, "redis.asyncio.Redis")
        self.pools: list[redis.asyncio.ConnectionPool] = [
            build_pool(node, redis.asyncio.ConnectionPool, parse_url, overrides) for node in items]
        self.addresses = node_labels(items)
        self._parked: ParkedAcquires[Any] = ParkedAcquires(len(self.pools))
        # The call sent first on every new connection, and who is told the replies
        # (node -> reply) before the request's replies are returned (set by the manager).
        self.identify: Callable[[int], Call] | None = None
        self.identified: Callable[[dict[int, object]], None] = lambda _: None

    async def broadcast(self, request: Broadcast) -> list[object]:
        """Every call's reply or exception. Calls for one node share one connection
        and one write (a pipeline); the nodes are asked concurrently."""
        by_node: dict[int, list[int]] = {}
        for index, call in enumerate(request.calls):
            by_node.setdefault(call.node, []).append(index)
        replies: list[object] = [None] * len(request.calls)
        identities: dict[int, object] = {}
        await asyncio.gather(*(self._node(node, [request.calls[i] for i in indexes],
                                          indexes, replies, identities, request.timeout)
                               for node, indexes in by_node.items()))
        if identities:
            self.identified(identities)
        return replies

    async def _node(self, node: int, calls: list[Call], indexes: list[int],
                    replies: list[object], identities: dict[int, object],
                    timeout: float) -> None:
        parked = [conn for call in calls for conn in self._parked.take_for(call)]
        exchange = self._exchange(node, calls, identities, timeout)
        if parked:
            results, _ = await asyncio.gather(exchange, self._trail(parked, calls, timeout))
        else:
            results = await exchange
        for index, result in zip(indexes, results, strict=True):
            replies[index] = result

    async def _exchange(self, node: int, calls: list[Call], identities: dict[int, object],
                        timeout: float) -> list[object]:
        """Send one node's calls and read their replies (raw), all within ``timeout``;
        a new connection carries the identity probe first (its reply in ``identities``)."""
        pool = self.pools[node]
        conn: Any = None
        sent = False
        results: list[object] = []

        async def send() -> None:
            nonlocal sent
            commands = [render(call, evalsha=True) for call in calls]
            probe = self.identify is not None and _is_new(conn)
            if probe:
                commands.insert(0, render(self.identify(node), evalsha=False))  # type: ignore[misc]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            sent = True
            if probe:
                try:
                    identities[node] = await conn.read_response(timeout=timeout,
                                                                disconnect_on_error=False)
                except ResponseError as exc:  # e.g. NOPERM: the calls say more
                    identities[node] = exc
                conn._redlock_identified = conn._writer  # this connection is known now

        async def exchange() -> None:
            nonlocal conn
            conn = await pool.get_connection()
            try:
                await send()
                unknown = await self._read_replies(conn, calls, results, timeout)
            except RedisConnectionError:
                if results:
                    raise
                # A pooled connection to a server that has restarted since its last use
                # fails at once (redis.asyncio does not notice on checkout, redis-py's
                # sync pool does). The dead server never ran the calls, and each of our
                # scripts may run twice anyway (an owner's second acquire is "already
                # ours"): one more try on a new connection, within the same budget.
                await self._discard(node, conn)
                conn = await pool.get_connection()
                await send()
                unknown = await self._read_replies(conn, calls, results, timeout)
            if unknown:  # first use of a script on this node (or SCRIPT FLUSH): send bodies
                await conn.send_packed_command(conn.pack_commands(
                    [render(calls[i], evalsha=False) for i in unknown]), check_health=False)
                retried: list[object] = []
                await self._read_replies(conn, [calls[i] for i in unknown], retried, timeout)
                for i, result in zip(unknown, retried, strict=True):
                    results[i] = result

        try:
            await within(exchange(), timeout)
        except (asyncio.TimeoutError, RedisTimeoutError):
            await self._no_reply(node, calls, conn, sent)
            return self._fill(results, calls,
                              RedisTimeoutError(f"no reply within {timeout * 1000:.0f} ms"))
        except asyncio.CancelledError:
            await self._no_reply(node, calls, conn, sent)
            raise
        except Exception as exc:
            if conn is not None:  # a late reply must never be read as the next command's
                await self._discard(node, conn)
            return self._fill(results, calls, exc)
        await pool.release(conn)
        return results

    @staticmethod
    async def _read_replies(conn: Any, calls: list[Call], results: list[object],
                            timeout: float) -> list[int]:
        """Append one reply per call (an error reply is that call's result); returns
        the positions answered NOSCRIPT. Timeouts and connection errors propagate."""
        unknown = []
        for position in range(len(calls)):
            try:
                results.append(await conn.read_response(timeout=timeout,
                                                        disconnect_on_error=False))
            except NoScriptError:
                unknown.append(position)
                results.append(_UNREAD)
            except ResponseError as exc:
                results.append(exc)
        return unknown

    @staticmethod
    def _fill(results: list[object], calls: list[Call], exc: BaseException) -> list[object]:
        """The replies read so far, ``exc`` for every call left without one."""
        padded = results + [_UNREAD] * (len(calls) - len(results))
        return [exc if result is _UNREAD else result for result in padded]

    async def _no_reply(self, node: int, calls: list[Call], conn: Any, sent: bool) -> None:
        if conn is None:
            return  # never connected: the pool took its connection back itself
        if sent and len(calls) == 1 and ParkedAcquires.wants(calls[0]) and conn.is_connected:
            evicted = self._parked.park(calls[0], conn)
            if evicted is not None:
                await self._discard(node, evicted)
            return
        await self._discard(node, conn)

    async def _trail(self, parked: list[Any], calls: list[Call], timeout: float) -> None:
        """Write the releases behind each unanswered acquire, then close (FIN after them):
        the node runs our release after our acquire, in order."""
        releases = [render(call, evalsha=False) for call in calls
                    if ParkedAcquires.wants_trail(call)]
        for conn in parked:
            with contextlib.suppress(Exception):
                await within(conn.send_packed_command(conn.pack_commands(releases),
                                                      check_health=False), timeout)
            await self._discard(calls[0].node, conn)

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
