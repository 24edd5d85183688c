"""The asyncio client: :class:`AsyncRedlock` and its :class:`AsyncLock` handles.

Same algorithm, same surface as :mod:`redlock.client` (a test keeps them equal): a
thin shell over :mod:`redlock._client.manager` and :mod:`redlock._client.handles` that adds the
asyncio transport (a request's calls run concurrently), the driver, and how a task
waits. Cancelling an acquire releases whatever it may have set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar, cast

from redlock._client.handles import HandleBase, LockBase, MultiLockBase
from redlock._client.lines import Ticket
from redlock._client.manager import ManagerBase
from redlock._core.amnesia.repair import RepairReport
from redlock._core.handover import Handover
from redlock._core.inspect import LockStatus, ReleaseReport
from redlock._core.requests import (
    NO_REPLY,
    Broadcast,
    Protocol,
    Replies,
    Request,
    Sleep,
    T,
    drive_async,
)
from redlock._io.async_listener import AsyncReleaseListener
from redlock._io.async_transport import AsyncTransport, wait_event

_H = TypeVar("_H", bound="_AsyncHandle")


class _AsyncHandle(HandleBase["AsyncRedlock"]):
    """What an asyncio handle adds to the shared one: its I/O methods, driven here."""

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """See :meth:`redlock.Lock.acquire`."""
        flow = self._observed("acquire", self._acquire_flow(blocking, timeout))
        return await self._manager._drive(flow)

    async def release(self) -> None:
        """See :meth:`redlock.Lock.release`."""
        await self._manager._drive(self._observed("release", self._release_flow()))

    async def extend(self, ttl: float | None = None) -> None:
        """See :meth:`redlock.Lock.extend`."""
        await self._manager._drive(self._observed("extend", self._extend_flow(ttl)))

    async def __aenter__(self: _H) -> _H:
        if not await self.acquire():
            raise self._entered_failure()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        leaving = self._exit_flow(exc_type is not None)
        await self._manager._drive(self._observed("release", leaving))


class AsyncLock(_AsyncHandle, LockBase["AsyncRedlock"]):
    """The asyncio twin of :class:`redlock.Lock`; each task gets its own acquisition."""


class AsyncMultiLock(_AsyncHandle, MultiLockBase["AsyncRedlock"]):
    """The asyncio twin of :class:`redlock.MultiLock`; each task gets its own acquisition."""


class AsyncRedlock(ManagerBase[AsyncLock, AsyncMultiLock]):
    """The asyncio twin of :class:`redlock.Redlock`; see there for the arguments
    (``sleep``, if given, is a coroutine function)."""

    _handle_class = AsyncLock
    _multi_handle_class = AsyncMultiLock
    _transport: AsyncTransport
    _asynchronous = True

    async def repair(self, *, force: bool = False) -> list[RepairReport]:
        """See :meth:`redlock.Redlock.repair`."""
        return await self._drive(self._core.repair(force=force))

    async def initialise(self, *, force: bool = False) -> list[RepairReport]:
        """See :meth:`redlock.Redlock.initialise`."""
        return await self._drive(self._core.initialise(force=force))

    async def inspect(self, resource: str) -> LockStatus:
        """See :meth:`redlock.Redlock.inspect`."""
        return await self._drive(self._inspect_flow(resource))

    async def is_locked(self, resource: str) -> bool:
        """See :meth:`redlock.Redlock.is_locked` (anyone holds it; ``lock.locked()``: I do)."""
        return await self._drive(self._is_locked_flow(resource))

    async def force_release(self, resource: str) -> list[ReleaseReport]:
        """See :meth:`redlock.Redlock.force_release`."""
        return await self._drive(self._force_release_flow(resource))

    async def adopt(self, handover: Handover | Mapping[str, Any] | str | bytes, *,
                    auto_extend: bool = False,
                    on_lost: Callable[[AsyncLock], object] | None = None) -> AsyncLock:
        """See :meth:`redlock.Redlock.adopt` (the calling task holds the handle)."""
        return await self._drive(self._adopt_flow(handover, auto_extend, on_lost))

    async def close(self) -> None:
        """See :meth:`redlock.Redlock.close` (no task of the manager is left running)."""
        self._in_this_process()  # in a forked child: nothing of the parent's is closed
        self._closing.set()
        self._maintenance_news.set()  # a waiting maintenance stops at once
        self._renewals.stop()  # and so does the renewal loop, after its current round
        for runner in (self._maintenance_runner, self._renewals.runner):
            if (runner is not None and not runner.done()
                    and runner is not asyncio.current_task()
                    and runner.get_loop() is asyncio.get_running_loop()):
                # A repair in progress finishes its step; one that hangs is cancelled.
                await asyncio.wait({runner}, timeout=self._close_grace())
                if not runner.done():
                    runner.cancel()
                    with contextlib.suppress(BaseException):
                        await runner
        if self._listener is not None:
            await self._listener.close()
        await self._transport.close()

    async def __aenter__(self) -> AsyncRedlock:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the shell: transport, driver, waiting -------------------------------------

    def _open_transport(self, nodes: Iterable[Any], connect_timeout: float) -> AsyncTransport:
        return AsyncTransport(nodes, connect_timeout)

    def _open_listener(self) -> AsyncReleaseListener:
        return AsyncReleaseListener(self._transport.pools, self._transport.addresses,
                                    self._core.settings.connect_timeout, self._wakeups)

    def _new_event(self) -> asyncio.Event:
        return asyncio.Event()

    def _new_turn(self) -> asyncio.Lock:
        return asyncio.Lock()

    def _current_owner(self) -> Hashable:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("AsyncLock must be used from inside an asyncio task")
        return task

    def _spawn(self, protocol: Protocol[None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._drive(protocol), name=name)
        self._background.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._background.discard)
        return task

    async def _drive(self, protocol: Protocol[T]) -> T:
        self._in_this_process()
        ticket: Ticket[asyncio.Event] = Ticket()  # a blocking acquire's place in line
        try:
            return await drive_async(protocol, functools.partial(self._execute, ticket))
        finally:
            self._end_call(ticket)
            self._maintain()  # a request found a restarted or amnesiac node: see to it

    async def _execute(self, ticket: Ticket[asyncio.Event], request: Request) -> Replies:
        if isinstance(request, Broadcast):
            if request.line is None:
                return await self._transport.broadcast(request)
            if not request.turns:
                self._lines.start_queued_attempt(ticket)
                return await self._transport.broadcast(request)
            line, handoff, until = self._lines.start_attempt(request.line, ticket)
            try:
                if handoff is not None:
                    await wait_event(handoff, until - time.monotonic())
                await line.turn.acquire()
            except BaseException:
                self._lines.exit(request.line, line)
                raise
            try:
                return await self._transport.broadcast(request)
            finally:
                line.turn.release()
                self._lines.end_attempt(request.line, line, ticket)
        if isinstance(request, Sleep):
            if request.until is not None:
                await wait_event(cast(asyncio.Event, request.until), request.seconds)
            elif self._sleep is not None:  # an injected sleep (tests) is honoured as given
                await self._sleep(request.seconds)
            elif request.line is not None:
                self._maintain()  # a blocking acquire met a restarted node: see to it now
                line, wake = self._lines.start_wait(request.line, ticket)
                seconds = self._watch_releases(request, ticket)
                try:
                    await wait_event(wake, seconds)
                finally:
                    self._lines.exit(request.line, line)
            else:
                await asyncio.sleep(request.seconds)
            return NO_REPLY
        outcome = request.function(*request.args)
        if inspect.isawaitable(outcome):
            await outcome
        return NO_REPLY
