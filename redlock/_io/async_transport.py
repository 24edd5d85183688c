"""The asyncio transport: a request's nodes are asked concurrently, each exchange a
task of its own. The request returns as soon as its replies decide it (early quorum)
or at its deadline; the exchanges it did not wait for go on in the background with
the connection's own budget (``connect_timeout``), so a new connection finishes its
handshake and a late reply is read: the connection goes back to the pool. An acquire
still unanswered on such a connection gets its owner's release written behind it
(see :mod:`redlock._io.wire`). Cancelling a request leaves its exchanges running the
same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redlock._core.requests import Broadcast, CommandArg, Replies, learnt_deadline
from redlock._io.async_exchange import (
    Exchange,
    Gathering,
    Slots,
    is_new,
    readable_while_idle,
)
from redlock._io.failures import as_failure, map_failures
from redlock._io.nodes import build_pool, check_node_list, node_labels, pool_overrides
from redlock._io.wire import (
    NOT_AWAITED,
    PENDING,
    SENT_LATE,
    STRAGGLER_GRACE_MIN,
    Late,
    LateConnections,
    fill_pending,
    pack,
    render,
)

T = TypeVar("T")

# At a request's deadline, a reply may already sit in a socket or a stream buffer that a
# busy event loop has not got round to (a coroutine doing CPU work delays every callback):
# that reply arrived in time. Before calling the node late, the request lets the loop run
# this many more turns while such replies wait to be read.
_LAST_TURNS = 8


async def within(awaitable: Awaitable[T], timeout: float) -> T:
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
    """One connection pool per node; each request's nodes asked concurrently."""

    def __init__(self, nodes: Iterable[str | redis.asyncio.Redis], connect_timeout: float,
                 identify: tuple[CommandArg, ...] | None = None) -> None:
        # ``identify``: the command sent first on every new connection (IDENTIFY, docs/
        # design.md §4.4); its reply is returned with the request's (Replies.identities).
        self.identify = identify
        # Our reads carry their own timeouts: the pools' socket timeout bounds only the
        # connection's handshake (and a send that cannot proceed), like connecting.
        overrides = pool_overrides(connect_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.asyncio.Redis, "redis.asyncio.Redis")
        self.pools: list[redis.asyncio.ConnectionPool] = [
            build_pool(node, redis.asyncio.ConnectionPool, parse_url, overrides)
            for node in items]
        self.addresses = node_labels(items)
        self.items = items  # the nodes as given (a forked child builds its own pools)
        self.connect_timeout = connect_timeout
        self._late: LateConnections[Any] = LateConnections(len(self.pools))
        self._running: set[asyncio.Task[None]] = set()
        self._slots = [Slots() for _ in self.pools]
        # Connected connections taken from the pools and kept here between requests: a
        # pool's checkout and return cost more than the request's own I/O (they stay
        # "in use" for the pool, which closes them all on disconnect()).
        self._idle: list[list[Any]] = [[] for _ in self.pools]
        self._lanes: dict[str, list[list[Any]]] = {}  # lane -> per node, its connections
        self._closed = False
        # The call sent first on every new connection, and who is told the replies
        # (node -> reply) as soon as they arrive (set by the manager).

    async def broadcast(self, request: Broadcast) -> Replies:
        """Every call's reply or exception (NOT_AWAITED for those the request was
        decided without). Calls for one node share one connection and one write."""
        if self._closed:  # a background flow (maintenance) racing the manager's close
            return Replies([as_failure(RedisConnectionError("the manager is closed"))]
                           * len(request.calls))
        replies = Replies([PENDING] * len(request.calls))
        exchanges: dict[int, Exchange] = {}
        for index, call in enumerate(request.calls):
            exchange = exchanges.get(call.node)
            if exchange is None:
                exchange = exchanges[call.node] = Exchange(call.node, replies, request.lane)
            exchange.indexes.append(index)
            exchange.calls.append(call)
        if self._late.any():
            await self.write_behind(request)
        loop = asyncio.get_running_loop()
        gathering = Gathering(loop, replies, request.enough)
        gathering.learn = request.learn
        tasks: dict[asyncio.Task[None], Exchange] = {}
        for exchange in exchanges.values():
            exchange.results = [PENDING] * len(exchange.calls)
            task = loop.create_task(self._exchange(exchange))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            task.add_done_callback(functools.partial(gathering.finished, exchange))
            tasks[task] = exchange
        gathering.left = len(tasks)
        started = time.monotonic()
        deadline = started + request.timeout
        last_turns = _LAST_TURNS
        try:
            # One wake-up per decision, not one per reply: the exchanges' done callbacks
            # collect the replies and wake this task when the request is decided, when
            # every exchange is done, or (below) never: then the deadline ends it.
            while gathering.left:
                if not gathering.decided and gathering.decides():
                    # Decided: the stragglers get as long again as the decision took
                    # (all of a healthy cluster's replies come in together), no longer.
                    gathering.decided = True
                    now = time.monotonic()
                    deadline = min(deadline, now + max(now - started, STRAGGLER_GRACE_MIN))
                if gathering.learn:  # a first request: its timeout from its own replies
                    learnt = learnt_deadline(request, started, time.monotonic(),
                                             len(replies.round_trips))
                    if learnt is not None:
                        gathering.learn, deadline = 0, min(deadline, learnt)
                left = deadline - time.monotonic()
                if left <= 0:
                    # A reply already here but not yet read (a busy loop) came in time.
                    if last_turns and any(exchange.reply_waiting() for task, exchange
                                          in tasks.items() if not task.done()):
                        last_turns -= 1
                        await asyncio.sleep(0)
                        continue
                    break
                if gathering.wake.done():
                    gathering.wake = loop.create_future()
                    continue  # re-check: what woke us may have decided it
                try:
                    await within(gathering.wake, left)
                except asyncio.TimeoutError:
                    continue  # the deadline: look for replies waiting to be read first
        finally:
            # Every reply an exchange has read counts, whether or not its done callback
            # (run a loop turn after the task ends) has copied it yet: a reply that was
            # read is never lost, and one that was not is never taken for an answer.
            for exchange in tasks.values():
                exchange.copy_into(replies)
            gathering.replies = None  # late exchanges must not write into these replies
            for exchange in tasks.values():
                exchange.replies = None
            decided = request.enough is not None and request.enough(replies,
                                                                    replies.identities)
            for task, exchange in tasks.items():
                if task.done():
                    continue
                exchange.over = True  # it goes on in the background (see the module's doc)
                if exchange.conn is None:
                    self._slots[exchange.node].wake_over()
                fill_pending(exchange.indexes, replies, NOT_AWAITED if decided else
                             SENT_LATE if exchange.releases_late()
                             else RedisTimeoutError(
                                 f"no reply within {(deadline - started) * 1000:.0f} ms"))
        map_failures(replies)  # redis-py errors as the library's (_io/failures.py)
        return replies

    async def _exchange(self, exchange: Exchange) -> None:
        """Connect if need be, send the node's calls, read every reply: all within the
        connection's own budget (the request may stop waiting long before)."""
        try:
            await within(self._converse(exchange), self.connect_timeout)
        except Exception as exc:  # asyncio.TimeoutError included: the node is hung
            exchange.results = [exc if r is PENDING else r for r in exchange.results]

    async def _converse(self, exchange: Exchange) -> None:
        node = exchange.node
        conn = await self._checkout(exchange)
        if conn is None:  # an acquire whose request ended while it waited for a slot
            return
        exchange.conn = conn
        if exchange.needless():
            # Connected only after the request was over: an acquire sent now would set
            # a key nobody waits for (its release may already have gone), and a failed
            # attempt's release could delete the key a later attempt of the same call
            # set (redlock._io.wire.late_sendable). A final release or an extend
            # still goes: its caller may have been cancelled (asyncio.timeout around
            # ``async with``) and nothing else would free the key before its TTL. The
            # connection is warm for the next request either way.
            self._give_back(node, conn, exchange.lane)
            return
        if readable_while_idle(conn):
            # A pooled connection the server closed while it sat idle (it restarted):
            # redis.asyncio does not notice on checkout (the sync pool does). Nothing
            # was sent on it: open a new one.
            await conn.disconnect(nowait=True)
            await conn.connect()
        try:
            await self._talk(exchange, conn)
        except BaseException:
            await self._discard(node, conn)  # a late reply must never be read as the next
            raise                            # command's
        self._give_back(node, conn, exchange.lane)

    async def _talk(self, exchange: Exchange, conn: Any) -> None:
        """Send the node's calls on ``conn`` and read every reply."""
        node, calls = exchange.node, exchange.calls
        new = is_new(conn)
        # A new connection: identify the server first, and send script bodies (the
        # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
        commands = [render(call, evalsha=not new) for call in calls]
        probed = new and self.identify is not None
        if probed:
            commands.insert(0, self.identify)  # type: ignore[arg-type]
        late = Late(conn, node, calls, len(commands), time.monotonic() + self.connect_timeout)
        self._late.add(late)  # a release for an acquire in here goes behind it
        try:
            await conn.send_packed_command(pack(conn, commands), check_health=False)
            exchange.sent_at = time.monotonic()
            if probed:
                identity = await self._reply(conn, late)
                conn._redlock_identified = conn._writer  # this connection is known now
                if exchange.replies is not None:  # at once: the request's early decision
                    exchange.replies.identities[node] = identity
            await self._read(exchange, conn, late)
        finally:
            late.closed = True
            self._late.remove(late)

    async def _read(self, exchange: Exchange, conn: Any, late: Late[Any]) -> None:
        results = exchange.results
        unknown = []
        for position in range(len(exchange.calls)):
            reply = await self._reply(conn, late)
            if position == 0 and exchange.replies is not None:
                exchange.replies.round_trips[exchange.node] = (
                    time.monotonic() - exchange.sent_at)
            if isinstance(reply, NoScriptError):
                unknown.append(position)
            else:
                results[position] = reply
        if unknown:  # SCRIPT FLUSH since: send the bodies
            late.outstanding += len(unknown)
            await conn.send_packed_command(pack(
                conn, [render(exchange.calls[i], evalsha=False) for i in unknown]),
                check_health=False)
            for position in unknown:
                results[position] = await self._reply(conn, late)
        while late.outstanding > 0:  # releases written behind an acquire in here
            await self._reply(conn, late)
        late.closed = True  # before any await: nothing more may be written behind now

    @staticmethod
    async def _reply(conn: Any, late: Late[Any]) -> object:
        """One reply; an error reply is returned, not raised (it is that call's result)."""
        try:
            return await conn.read_response(disconnect_on_error=False)
        except ResponseError as exc:
            return exc
        finally:
            late.outstanding -= 1

    async def _checkout(self, exchange: Exchange) -> Any:
        """A connection to the exchange's node: the last one given back, or a new one (see
        Slots); None for an acquire whose request ended while it waited."""
        node = exchange.node
        if exchange.lane is not None:
            # The lane's own connection; the first time, a shared one (served first among
            # waiters: a lock holder's request), which then stays in the lane. Opening a
            # new one instead took 300 ms on a busy event loop.
            conn = await self._kept(node, exchange.lane)
            if conn is not None:
                return conn
        slots = self._slots[node]
        while True:
            conn = await self._kept(node)
            if conn is not None:
                return conn
            if exchange.needless():
                return None
            if slots.free > 0:
                slots.free -= 1
                try:
                    return await self.pools[node].get_connection()
                finally:
                    slots.free += 1
                    slots.wake_one()
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            slots.waiting.append((exchange, future))
            try:
                await future
            finally:
                if (exchange, future) in slots.waiting:
                    slots.waiting.remove((exchange, future))

    def _give_back(self, node: int, conn: Any, lane: str | None = None) -> None:
        """A connection for the next request (of its lane); an exchange waiting for one
        takes it."""
        if lane is not None:
            self._lanes.setdefault(lane, [[] for _ in self.pools])[node].append(conn)
            return
        self._idle[node].append(conn)
        self._slots[node].wake_one()

    async def _kept(self, node: int, lane: str | None = None) -> Any:
        idle = self._idle[node] if lane is None else self._lanes.setdefault(
            lane, [[] for _ in self.pools])[node]
        while idle:
            conn = idle.pop()
            if conn.is_connected:
                return conn
            await self._discard(node, conn)
        return None

    async def _discard(self, node: int, conn: Any) -> None:
        """Close a connection (pending writes are flushed first) and hand it back."""
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        with contextlib.suppress(Exception):
            await self.pools[node].release(conn)

    async def write_behind(self, request: Broadcast) -> None:  # (see redlock._io.wire)
        """Write each release behind the unanswered acquires of the same owner."""
        for call in request.calls:
            for late in self._late.behind(call):
                if late.closed:
                    continue
                late.outstanding += 1
                with contextlib.suppress(Exception):  # the normal release goes out too
                    await late.conn.send_packed_command(pack(
                        late.conn, [render(call, evalsha=False)]), check_health=False)

    async def close(self) -> None:
        self._closed = True  # nothing new is sent: it would open connections after these
        for task in list(self._running):
            task.cancel()
        for task in list(self._running):
            with contextlib.suppress(BaseException):
                await task
        for late in self._late.drain():
            await self._discard(late.node, late.conn)
        for stacks in (self._idle, *self._lanes.values()):
            for node, idle in enumerate(stacks):
                while idle:
                    await self._discard(node, idle.pop())
        for pool in self.pools:
            await pool.disconnect()
