"""The asyncio client: :class:`AsyncRedlock` and its :class:`AsyncLock` handles.

Same algorithm, same surface as :mod:`redlock.client` (a test keeps them equal): a thin
shell over :mod:`redlock._client` that names the asyncio flavour's pieces (the
transport that asks a request's nodes concurrently, a listener task per node, the
executor that awaits, tasks for background work) and gives the public methods, which
are coroutines. Cancelling an acquire releases whatever it may have set."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar, cast

from redlock import _fork
from redlock._client.backends import AsyncioBackend
from redlock._client.executors import AsyncExecutor
from redlock._client.family import (
    ElectionBase,
    LeadershipBase,
    ReadLockBase,
    ReadWriteLockBase,
    SemaphoreBase,
    WriteLockBase,
)
from redlock._client.handles import HandleBase, LockBase, MultiLockBase
from redlock._client.manager import ManagerBase
from redlock._client.renewal_thread import RenewalThread, ended
from redlock._client.renewer import Renewer
from redlock._core.handover import Handover
from redlock._core.requests import Flow, T
from redlock._core.settings import Keys
from redlock._core.state import LockState
from redlock._core.views import Leader, ReadWriteStatus, SemaphoreStatus
from redlock._io.async_listener import AsyncReleaseListener
from redlock._io.async_transport import AsyncTransport
from redlock.errors import LockLost

_H = TypeVar("_H", bound="_AsyncHandle")


class AsyncRenewer(Renewer):
    """The renewer (docs/design.md §5.2) as the asyncio client uses it: a loss is told on
    the event loop its lock was acquired on (``on_lost`` runs as a task there)."""

    _loop: asyncio.AbstractEventLoop | None = None

    def add(self, state: LockState, handle: Any) -> None:
        self._loop = asyncio.get_running_loop()
        super().add(state, handle)

    def _tell(self, function: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # the application's loop is gone: nobody is left to tell
        with contextlib.suppress(RuntimeError):  # closed between the check and the call
            loop.call_soon_threadsafe(function, *args)


class _AsyncHandle(HandleBase):
    """What an asyncio handle adds to the shared one: its I/O methods, driven here."""

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """See :meth:`redlock.Lock.acquire`."""
        return cast(bool, await self._registry.drive(self._acquire_flow(blocking, timeout)))

    async def release(self) -> None:
        """See :meth:`redlock.Lock.release`."""
        await self._registry.drive(self._release_flow())

    async def extend(self, ttl: float | None = None) -> None:
        """See :meth:`redlock.Lock.extend`."""
        await self._registry.drive(self._extend_flow(ttl))

    async def __aenter__(self: _H) -> _H:
        if not await self.acquire():
            raise self._entered_failure()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.release()
        except LockLost as lost:
            self._lost_on_exit(lost, exc_type is not None)


class AsyncLock(_AsyncHandle, LockBase):
    """The asyncio twin of :class:`redlock.Lock`; each task gets its own acquisition."""


class AsyncMultiLock(_AsyncHandle, MultiLockBase):
    """The asyncio twin of :class:`redlock.MultiLock`; each task gets its own acquisition."""


class AsyncSemaphore(_AsyncHandle, SemaphoreBase):
    """The asyncio twin of :class:`redlock.Semaphore`; each task gets its own permit."""

    async def status(self) -> SemaphoreStatus:
        """See :meth:`redlock.Semaphore.status`."""
        return cast(SemaphoreStatus, await self._registry.drive(self._status_flow()))


class AsyncReadLock(_AsyncHandle, ReadLockBase):
    """The asyncio twin of :class:`redlock.ReadLock`."""


class AsyncWriteLock(_AsyncHandle, WriteLockBase):
    """The asyncio twin of :class:`redlock.WriteLock`."""


class AsyncReadWriteLock(ReadWriteLockBase[AsyncReadLock, AsyncWriteLock]):
    """The asyncio twin of :class:`redlock.ReadWriteLock`."""

    _read_class = AsyncReadLock
    _write_class = AsyncWriteLock

    async def status(self) -> ReadWriteStatus:
        """See :meth:`redlock.ReadWriteLock.status`."""
        return cast(ReadWriteStatus, await self._registry.drive(self._status_flow()))


class AsyncLeadership(_AsyncHandle, LeadershipBase):
    """The asyncio twin of :class:`redlock.Leadership` (``async with``)."""

    async def resign(self) -> None:
        """See :meth:`redlock.Leadership.resign`."""
        await self.release()


class AsyncElection(ElectionBase[AsyncLeadership]):
    """The asyncio twin of :class:`redlock.Election`."""

    _leadership_class = AsyncLeadership

    async def leader(self) -> Leader | None:
        """See :meth:`redlock.Election.leader`."""
        return cast("Leader | None", await self._registry.drive(self._leader_flow()))

    async def observe(self) -> AsyncIterator[Leader | None]:
        """See :meth:`redlock.Election.observe` (an async iterator)."""
        wake = self._registry.new_event()
        stop = self._registry.watch_every(self._channels(), wake)
        closing = self._registry.closing
        try:
            last, first = None, True
            while not closing.is_set():
                last = await self._registry.drive(self._next_flow(last, first, wake))
                if closing.is_set():
                    return
                first = False
                yield last
        finally:
            stop()


class AsyncRedlock(ManagerBase[AsyncLock, AsyncMultiLock]):
    """The asyncio twin of :class:`redlock.Redlock`; see there for the arguments."""

    _handle_class = AsyncLock
    _multi_handle_class = AsyncMultiLock
    _backend_class = AsyncioBackend
    _transport_class = AsyncTransport
    _listener_class = AsyncReleaseListener
    _executor_class = AsyncExecutor
    _transport: AsyncTransport

    def election(self, name: str, ttl: float = 10.0, *,
                 identity: str | None = None) -> AsyncElection:
        """See :meth:`redlock.Redlock.election`."""
        return AsyncElection(self._registry, name, ttl, identity)

    def semaphore(self, name: str, permits: int = 1, ttl: float = 10.0, *, blocking: bool = True,
                  timeout: float | None = None, auto_extend: bool = False,
                  on_lost: Callable[[AsyncSemaphore], object] | None = None) -> AsyncSemaphore:
        """See :meth:`redlock.Redlock.semaphore`."""
        return AsyncSemaphore(self._registry, name, permits, ttl, blocking=blocking,
                              timeout=timeout, auto_extend=auto_extend, on_lost=on_lost)

    def rwlock(self, name: str, ttl: float = 10.0) -> AsyncReadWriteLock:
        """See :meth:`redlock.Redlock.rwlock`."""
        return AsyncReadWriteLock(self._registry, name, ttl)

    async def adopt(self, handover: Handover | Mapping[str, Any] | str | bytes, *,
                    auto_extend: bool = False,
                    on_lost: Callable[[AsyncLock], object] | None = None) -> AsyncLock:
        """See :meth:`redlock.Redlock.adopt` (the calling task holds the handle)."""
        return await self._drive(self._adopt_flow(handover, auto_extend, on_lost))

    def _drive(self, flow: Flow[T]) -> Awaitable[T]:
        # The handles' one way to the executor (see redlock.Redlock._drive).
        if self._generation != _fork.generation:
            self._in_this_process()
        return cast(Awaitable[T], self._executor.drive(flow))

    _renewer_class = AsyncRenewer

    def _renewal_runner(self) -> tuple[Callable[[], Any], Callable[[Flow[None]], Any],
                                       Callable[[LockState, list[Any]], None]]:
        """The renewals run in a thread of their own, not as a task: a busy loop wakes a
        task late and reads its replies late (redlock/_client/renewal_thread.py)."""
        previous: RenewalThread | None = getattr(self, "_renewal_thread", None)
        if previous is not None:  # a forked child: the parent's connections stay unused
            _fork.keep_forever(previous.forget())
        settings = self._core.settings
        self._renewal_thread = RenewalThread(
            self._endpoints, self._addresses, settings.connect_timeout,
            Keys(settings.namespace).identify_command(), self._room, self._core,
            self._registry.lost, self._maintain)
        return threading.Event, self._renewal_thread.start, self._renewal_thread.lost

    async def close(self) -> None:
        """See :meth:`redlock.Redlock.close` (no task or thread of the manager is left running)."""
        for runner in self._stop_background():
            if isinstance(runner, threading.Thread):  # the renewals' thread: after its round
                await ended(runner, self._close_grace())
            elif (runner is not None and not runner.done()
                    and runner is not asyncio.current_task()
                    and runner.get_loop() is asyncio.get_running_loop()):
                # A repair in progress finishes its step; one that hangs is cancelled.
                await asyncio.wait({runner}, timeout=self._close_grace())
                if not runner.done():
                    runner.cancel()
                    with contextlib.suppress(BaseException):
                        await runner
        if self._room.listener is not None:
            await self._room.listener.close()
        renewal_thread: RenewalThread | None = getattr(self, "_renewal_thread", None)
        if renewal_thread is not None:
            await renewal_thread.close()
        await self._transport.close()

    async def __aenter__(self) -> AsyncRedlock:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
