"""The asyncio client: a thin I/O shell over :mod:`redlock.core`.

Same algorithm, same surface as :mod:`redlock.client` (a test keeps them equal);
here a request's commands run concurrently with ``asyncio.gather``, each bounded
by the node timeout. Cancelling an acquire releases whatever it may have set.

An acquire script that got no reply in time (timeout, or the caller was cancelled)
may still run on its node later: a hung node works through its socket when it
comes back. Its connection is therefore kept, and the release for the same owner is
written behind it on that same socket (as well as sent on a fresh one), so the node
runs the release after the acquire and no key of ours survives there.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from redlock import scripts
from redlock.core import (
    Broadcast,
    Call,
    LockState,
    Protocol,
    RedlockCore,
    RepairReport,
    Replies,
    Request,
    Settings,
    T,
)
from redlock.handle import LockHandleBase
from redlock.lines import LocalLines, Ticket
from redlock.nodes import address_of, check_node_list, pool_overrides

logger = structlog.get_logger(__name__)

OnLost = Callable[["AsyncLock"], object]
# Set only inside a watchdog task while it runs on_lost (each task has its own context).
_ACTING_FOR: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "redlock_acting_for", default=None)
AsyncSleep = Callable[[float], Awaitable[object]]


_PARKED_PER_NODE = 16

_T = TypeVar("_T")


async def _within(awaitable: Coroutine[Any, Any, _T], timeout: float) -> _T:
    """``asyncio.wait_for`` without its extra Task per call where the language allows:
    ``asyncio.timeout`` (3.11+) cancels the current task in place, which is ~100 us
    cheaper per acquire+release on three nodes (benchmarks/async_overhead.py)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)  # pragma: no cover (3.10)


def _command(call: Call, *, evalsha: bool) -> tuple[Any, ...]:
    if call.script is None:
        return call.args
    head = ("EVALSHA", call.script.sha) if evalsha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


@dataclass(frozen=True)
class _Parked:
    """A connection whose acquire script got no reply in time (timeout or cancellation).

    The node may still run that script later (a hung node works through its socket
    when it comes back). The connection is kept, not closed, so that the release for
    the same owner can be written *behind* it on the same socket: the node then runs
    our release after our acquire, in order, whenever it gets to them.
    """

    conn: Any
    lock_key: str
    owner: object


class _Nodes:
    """One connection pool per node; a request's calls run concurrently."""

    def __init__(self, nodes: Sequence[str | redis.asyncio.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        self.pools: list[redis.asyncio.ConnectionPool] = []
        for node in check_node_list(nodes, redis.asyncio.Redis, "redis.asyncio.Redis"):
            if isinstance(node, str):
                pool = redis.asyncio.ConnectionPool.from_url(node, **overrides)
            else:  # the caller's client: same settings, our own bounded pool
                source = node.connection_pool
                pool = redis.asyncio.ConnectionPool(
                    connection_class=source.connection_class,
                    **{**source.connection_kwargs, **overrides})
            self.pools.append(pool)
        self.addresses = [address_of(pool.connection_kwargs) for pool in self.pools]
        self._parked: list[list[_Parked]] = [[] for _ in self.pools]

    async def broadcast(self, request: Broadcast) -> list[object]:
        return list(await asyncio.gather(*(self._bounded(call, request.timeout)
                                           for call in request.calls)))

    async def _bounded(self, call: Call, timeout: float) -> object:
        if call.script is scripts.RELEASE:
            parked = self._unpark(call)
            if parked:
                reply, _ = await asyncio.gather(self._exchange(call, timeout),
                                                self._trail(parked, call, timeout))
                return reply
        return await self._exchange(call, timeout)

    async def _exchange(self, call: Call, timeout: float) -> object:
        """Send one call and read its reply (raw, like the sync shell), within ``timeout``."""
        pool = self.pools[call.node]
        conn: Any = None
        sent = False

        async def exchange() -> object:
            nonlocal conn, sent
            conn = await pool.get_connection()
            await conn.send_command(*_command(call, evalsha=True), check_health=False)
            sent = True
            try:
                return await conn.read_response(timeout=timeout, disconnect_on_error=False)
            except NoScriptError:  # first use on this node (or SCRIPT FLUSH): send the body
                await conn.send_command(*_command(call, evalsha=False), check_health=False)
                return await conn.read_response(timeout=timeout, disconnect_on_error=False)

        try:
            reply = await _within(exchange(), timeout)
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
        if sent and call.script is scripts.ACQUIRE and conn.is_connected:
            parked = self._parked[call.node]
            parked.append(_Parked(conn, call.keys[0], call.args[0]))
            if len(parked) > _PARKED_PER_NODE:
                await self._discard(call.node, parked.pop(0).conn)
            return
        await self._discard(call.node, conn)

    def _unpark(self, release: Call) -> list[_Parked]:
        parked = self._parked[release.node]
        mine = [p for p in parked
                if (p.lock_key, p.owner) == (release.keys[0], release.args[0])]
        self._parked[release.node] = [p for p in parked if p not in mine]
        return mine

    async def _trail(self, parked: list[_Parked], release: Call, timeout: float) -> None:
        """Write the release behind each unanswered acquire, then close (FIN after it)."""
        for item in parked:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(item.conn.send_command(
                    *_command(release, evalsha=False), check_health=False), timeout)
            await self._discard(release.node, item.conn)

    async def _discard(self, node: int, conn: Any) -> None:
        """Close a connection (pending writes are flushed first) and hand it back."""
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)
        with contextlib.suppress(Exception):
            await self.pools[node].release(conn)

    async def close(self) -> None:
        for node, parked in enumerate(self._parked):
            for item in parked:
                await self._discard(node, item.conn)
            parked.clear()
        for pool in self.pools:
            await pool.disconnect()


# The asyncio shell's lines: tasks wait on asyncio events and locks.
_AsyncLines = LocalLines[asyncio.Event, asyncio.Lock]
_AsyncTicket = Ticket[asyncio.Event]


class AsyncRedlock:
    """The asyncio twin of :class:`redlock.Redlock`; see there for the arguments."""

    def __init__(
        self,
        nodes: Sequence[str | redis.asyncio.Redis],
        *,
        namespace: str = "redlock",
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay_min: float = 0.005,
        retry_delay_max: float = 0.25,
        max_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: AsyncSleep = asyncio.sleep,
    ) -> None:
        settings = Settings(namespace=namespace, node_timeout=node_timeout,
                            drift_factor=drift_factor, retry_delay_min=retry_delay_min,
                            retry_delay_max=retry_delay_max, max_ttl=max_ttl)
        self._nodes = _Nodes(nodes, settings.node_timeout)
        self._core = RedlockCore(self._nodes.addresses, settings, clock)
        self._sleep = sleep
        self._lines: _AsyncLines = LocalLines(asyncio.Event, asyncio.Lock)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses, in the order given."""
        return self._core.addresses

    @property
    def quorum(self) -> int:
        return self._core.quorum

    def lock(
        self,
        resource: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_extend: bool = False,
        on_lost: OnLost | None = None,
        reentrant: bool = False,
    ) -> AsyncLock:
        """A lock handle for ``resource``; nothing is sent until it is acquired."""
        return AsyncLock(self, resource, ttl, blocking=blocking, timeout=timeout,
                         auto_extend=auto_extend, on_lost=on_lost, reentrant=reentrant)

    async def repair(self, *, force: bool = False) -> list[RepairReport]:
        """See :meth:`redlock.Redlock.repair`."""
        return await self._run(self._core.repair(force=force))

    async def close(self) -> None:
        """Close the connections this manager opened (the caller's clients stay open)."""
        await self._nodes.close()

    async def __aenter__(self) -> AsyncRedlock:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, protocol: Protocol[T], sleep: AsyncSleep | None = None,
                   ticket: _AsyncTicket | None = None) -> T:
        request: Request = next(protocol)
        while True:
            try:
                reply: Replies
                if isinstance(request, Broadcast) and request.one_at_a_time is not None:
                    reply = await self._attempt_in_turn(request, request.one_at_a_time,
                                                        ticket or Ticket())
                elif isinstance(request, Broadcast):
                    reply = await self._nodes.broadcast(request)
                else:
                    if (sleep is None and ticket is not None and request.wake_channel is not None
                            and self._sleep is asyncio.sleep):
                        await self._wait_in_line(request.wake_channel, ticket, request.seconds)
                    else:  # an injected sleep (tests) is honoured as given
                        await (sleep or self._sleep)(request.seconds)
                    reply = ()
            except BaseException as exc:  # cancelled: the protocol cleans up, then re-raises
                request = protocol.throw(exc)
                continue
            try:
                request = protocol.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    async def _run_in_line(self, protocol: Protocol[T]) -> T:
        """_run for acquire: its attempts and waits keep one place in the local line."""
        ticket: _AsyncTicket = Ticket()
        try:
            return await self._run(protocol, ticket=ticket)
        finally:
            self._lines.leave(ticket)

    async def _attempt_in_turn(self, request: Broadcast, key: str,
                               ticket: _AsyncTicket) -> Replies:
        line, handoff, until = self._lines.start_attempt(key, ticket)
        try:
            left = until - time.monotonic()
            if handoff is not None and left > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await _within(handoff.wait(), left)
            await line.turn.acquire()
        except BaseException:
            self._lines.exit(key, line)
            raise
        try:
            return await self._nodes.broadcast(request)
        finally:
            line.turn.release()
            self._lines.end_attempt(key, line, ticket)

    async def _wait_in_line(self, key: str, ticket: _AsyncTicket, seconds: float) -> None:
        line, wake = self._lines.start_wait(key, ticket)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await _within(wake.wait(), seconds)
        finally:
            self._lines.exit(key, line)


class AsyncLock(LockHandleBase):
    """The asyncio twin of :class:`redlock.Lock`; each task gets its own acquisition."""

    def __init__(self, redlock: AsyncRedlock, resource: str, ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: OnLost | None = None, reentrant: bool = False) -> None:
        super().__init__(redlock._core, resource, ttl, blocking=blocking, timeout=timeout,
                         auto_extend=auto_extend, reentrant=reentrant)
        self._redlock = redlock
        self.on_lost = on_lost
        self._watchdogs: dict[LockState, tuple[asyncio.Event, asyncio.Task[None]]] = {}

    def _owner_key(self) -> Hashable:
        acting_for = _ACTING_FOR.get()
        if acting_for is not None:  # inside on_lost: the handle shows the lost acquisition
            return acting_for
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("AsyncLock must be used from inside an asyncio task")
        return task

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """See :meth:`redlock.Lock.acquire`."""
        owner = self._owner_key()
        blocking, timeout = self._options(blocking, timeout)
        if self._prepare_acquire(owner) is not None:
            return True
        result = await self._redlock._run_in_line(self._core.acquire(
            self.resource, self.ttl, blocking=blocking, timeout=timeout))
        state = self._finish_acquire(result, owner)
        if state is None:
            return False
        if self.auto_extend:
            self._start_watchdog(state, owner)
        return True

    async def release(self) -> None:
        """See :meth:`redlock.Lock.release`."""
        state = self._prepare_release(self._owner_key())
        if state is None:
            return
        watchdog = self._watchdogs.pop(state, None)
        if watchdog is not None:
            watchdog[0].set()
        try:
            await self._redlock._run(self._core.release(state))
        finally:
            self._redlock._lines.notify(self._core.keys.channel(self.resource))

    async def extend(self, ttl: float | None = None) -> None:
        """See :meth:`redlock.Lock.extend`."""
        state = self._held()
        await self._redlock._run(self._core.extend_or_lose(
            state, self.ttl if ttl is None else self._core.check_ttl(ttl)))

    def _start_watchdog(self, state: LockState, owner: Hashable) -> None:
        stop = asyncio.Event()

        async def wait(seconds: float) -> None:  # a release wakes it at once
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

        async def run() -> None:
            try:
                lost = await self._redlock._run(self._core.watchdog(state), wait)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("redlock.watchdog_crashed", resource=self.resource)
                lost = state.mark_lost("the auto-extend watchdog crashed")
            self._watchdogs.pop(state, None)
            if lost and self.on_lost is not None:
                # The callback runs in this watchdog task, not in the owner's: let the
                # handle's token/lost/check() answer for the owner's acquisition in here.
                _ACTING_FOR.set(owner)
                try:
                    outcome: Any = self.on_lost(self)
                    if inspect.isawaitable(outcome):
                        await outcome
                except Exception:
                    logger.exception("redlock.on_lost_failed", resource=self.resource)

        task = asyncio.get_running_loop().create_task(
            run(), name=f"redlock-watchdog:{self.resource}")
        self._watchdogs[state] = (stop, task)

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire():
            raise self._entered_failure()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()
