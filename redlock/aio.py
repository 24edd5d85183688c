"""The asyncio client: a thin I/O shell over :mod:`redlock.core`.

Same algorithm, same surface as :mod:`redlock.client` (a test keeps them equal);
here a request's commands run concurrently with ``asyncio.gather``, each bounded
by the node timeout. Cancelling an acquire releases whatever it may have set.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from types import TracebackType
from typing import Any

import redis.asyncio
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
from redlock.nodes import address_of, check_node_list, pool_overrides

logger = structlog.get_logger(__name__)

OnLost = Callable[["AsyncLock"], object]
AsyncSleep = Callable[[float], Awaitable[object]]


class _Nodes:
    """One connection pool per node; a request's calls run concurrently."""

    def __init__(self, nodes: Sequence[str | redis.asyncio.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        self.clients: list[redis.asyncio.Redis] = []
        for node in check_node_list(nodes, redis.asyncio.Redis, "redis.asyncio.Redis"):
            if isinstance(node, str):
                pool = redis.asyncio.ConnectionPool.from_url(node, **overrides)
            else:  # the caller's client: same settings, our own bounded pool
                source = node.connection_pool
                pool = redis.asyncio.ConnectionPool(
                    connection_class=source.connection_class,
                    **{**source.connection_kwargs, **overrides})
            self.clients.append(redis.asyncio.Redis(connection_pool=pool))
        self.addresses = [address_of(c.connection_pool.connection_kwargs) for c in self.clients]

    async def broadcast(self, request: Broadcast) -> list[object]:
        return list(await asyncio.gather(*(self._bounded(call, request.timeout)
                                           for call in request.calls)))

    async def _bounded(self, call: Call, timeout: float) -> object:
        try:
            return await asyncio.wait_for(self._send(call), timeout)
        except asyncio.TimeoutError:
            return RedisTimeoutError(f"no reply within {timeout * 1000:.0f} ms")
        except Exception as exc:
            return exc

    async def _send(self, call: Call) -> object:
        client = self.clients[call.node]
        if call.script is None:
            return await client.execute_command(*call.args)
        tail = (len(call.keys), *call.keys, *call.args)
        try:
            return await client.execute_command("EVALSHA", call.script.sha, *tail)
        except NoScriptError:  # first use on this node (or SCRIPT FLUSH): send the body
            return await client.execute_command("EVAL", call.script.source, *tail)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
            await client.connection_pool.disconnect()


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

    async def _run(self, protocol: Protocol[T], sleep: AsyncSleep | None = None) -> T:
        request: Request = next(protocol)
        while True:
            try:
                reply: Replies
                if isinstance(request, Broadcast):
                    reply = await self._nodes.broadcast(request)
                else:
                    await (sleep or self._sleep)(request.seconds)
                    reply = ()
            except BaseException as exc:  # cancelled: the protocol cleans up, then re-raises
                request = protocol.throw(exc)
                continue
            try:
                request = protocol.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


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
        result = await self._redlock._run(self._core.acquire(
            self.resource, self.ttl, blocking=blocking, timeout=timeout))
        state = self._finish_acquire(result, owner)
        if state is None:
            return False
        if self.auto_extend:
            self._start_watchdog(state)
        return True

    async def release(self) -> None:
        """See :meth:`redlock.Lock.release`."""
        state = self._prepare_release(self._owner_key())
        if state is None:
            return
        watchdog = self._watchdogs.pop(state, None)
        if watchdog is not None:
            watchdog[0].set()
        await self._redlock._run(self._core.release(state))

    async def extend(self, ttl: float | None = None) -> None:
        """See :meth:`redlock.Lock.extend`."""
        state = self._held()
        await self._redlock._run(self._core.extend_or_lose(
            state, self.ttl if ttl is None else self._core.check_ttl(ttl)))

    def _start_watchdog(self, state: LockState) -> None:
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
