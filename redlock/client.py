"""The synchronous client: :class:`Redlock` and its :class:`Lock` handles.

A thin shell over :mod:`redlock._client` (everything shared with the asyncio client): it names the
sync flavour's pieces (the scatter/gather transport on one thread, the release listener thread, the
executor that blocks, threads for background work) and gives the public methods, which block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, cast

from redlock import _fork
from redlock._client.backends import ThreadBackend
from redlock._client.executors import SyncExecutor
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
from redlock._core.handover import Handover
from redlock._core.requests import Flow, T
from redlock._core.views import Leader, ReadWriteStatus, SemaphoreStatus
from redlock._io.sync_listener import SyncReleaseListener
from redlock._io.sync_transport import SyncTransport
from redlock._observe.warn import BlockingInEventLoopWarning, warn
from redlock.errors import LockLost

_H = TypeVar("_H", bound="_SyncHandle")


class _SyncHandle(HandleBase):
    """What a sync handle adds to the shared one: its I/O methods, driven here."""

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Acquire on a quorum; True when held.

        ``blocking=False`` makes exactly one attempt (a ``timeout`` with it is a ``ValueError``),
        which returns within one request ceiling (a fifth of the TTL, at most 2 s; or
        ``node_timeout`` if set and longer). Blocking waits up to ``timeout`` seconds (None: this
        handle's timeout, which may be None: no deadline). Either deadline holds whatever the nodes
        do (hung, new, amnesiac), give or take a few 10 ms rounds. Returns False when others hold
        the lock; raises :class:`QuorumUnavailable` when too few nodes answer at all (an outage is
        not contention), at once or after the manager's ``outage_timeout``."""
        return cast(bool, self._registry.drive(self._acquire_flow(blocking, timeout)))

    def release(self) -> None:
        """Release on every node (a re-entered lock at depth 0); a second call is a no-op.

        Raises :class:`LockLost` (after cleaning up) when the lock was lost, its validity
        had run out, or a majority of nodes no longer held our key: the critical section
        may have run unprotected. Leaving a ``with`` block raises it too, unless another
        exception is already propagating."""
        self._registry.drive(self._release_flow())

    def extend(self, ttl: float | None = None) -> None:
        """Reset the TTL on a quorum; raises :class:`LockLost` when that fails in time."""
        self._registry.drive(self._extend_flow(ttl))

    def __enter__(self: _H) -> _H:
        if not self.acquire():
            raise self._entered_failure()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.release()
        except LockLost as lost:
            self._lost_on_exit(lost, exc_type is not None)


class Lock(_SyncHandle, LockBase):
    """One resource's lock handle. Safe to share across threads: each thread that
    acquires through it gets its own acquisition (own lock value and token).

    Use as a context manager, or call :meth:`acquire` / :meth:`release`. While held,
    :attr:`token` is the fencing token to pass to the protected resource."""


class MultiLock(_SyncHandle, MultiLockBase):
    """A lock over several resources at once (``dlm.lock_many([...])``): all or
    nothing, a token per resource in :attr:`tokens`. Safe to share across threads."""


class Semaphore(_SyncHandle, SemaphoreBase):
    """A permit of a counting semaphore (``dlm.semaphore(name, permits=K)``): at most K
    held at once across every client, each with its slot's fencing token. Use as a
    context manager, or call :meth:`acquire` / :meth:`release`; safe to share across
    threads (each thread gets its own permit)."""

    def status(self) -> SemaphoreStatus:
        """Who holds each permit now, by a quorum of the nodes (a snapshot);
        :class:`QuorumUnavailable` when fewer than a quorum answered."""
        return cast(SemaphoreStatus, self._registry.drive(self._status_flow()))


class ReadLock(_SyncHandle, ReadLockBase):
    """A read-write lock's read handle (``dlm.rwlock(name).read()``): readers share."""


class WriteLock(_SyncHandle, WriteLockBase):
    """A read-write lock's write handle (``dlm.rwlock(name).write()``): alone."""


class ReadWriteLock(ReadWriteLockBase[ReadLock, WriteLock]):
    """``dlm.rwlock(name, ttl)``: its :meth:`read` and :meth:`write` handles share the
    name; a writer excludes everyone, and writers in line go before later readers."""

    _read_class = ReadLock
    _write_class = WriteLock

    def status(self) -> ReadWriteStatus:
        """The writer and the readers now, by a quorum of the nodes (a snapshot);
        :class:`QuorumUnavailable` when fewer than a quorum answered."""
        return cast(ReadWriteStatus, self._registry.drive(self._status_flow()))


class Leadership(_SyncHandle, LeadershipBase):
    """An election's leadership (``election.campaign()``): ``with`` it to lead; its
    ``token`` is the term, for the fenced stores; ``check()`` raises :class:`LockLost`
    once the leadership is lost."""

    def resign(self) -> None:
        """Step down now (what leaving the ``with`` block does)."""
        self.release()


class Election(ElectionBase[Leadership]):
    """``dlm.election(name, ttl, identity)``: a fenced leader election (docs/design.md §12.1).
    ``campaign()`` to lead, ``leader()`` to see who leads, ``observe()`` to follow the changes."""

    _leadership_class = Leadership

    def leader(self) -> Leader | None:
        """Who leads now (identity, term, time left), read from a quorum; None when
        nobody does (or an election is under way); :class:`QuorumUnavailable` when fewer
        than a quorum of nodes answered (the leadership is then unknown, not vacant). A
        snapshot: it may be stale on return; the term in the leader's hands is what
        fences."""
        return cast("Leader | None", self._registry.drive(self._leader_flow()))

    def observe(self) -> Iterator[Leader | None]:
        """Yield the leadership now, then each change (a new term, or vacancy: None),
        woken by the nodes' notifications, or when a leader's time runs out. Runs until
        the caller stops iterating, or the manager is closed. Through an outage it yields
        nothing; one that lasts the manager's ``outage_timeout`` raises
        :class:`QuorumUnavailable` (docs/design.md §12.1)."""
        wake = self._registry.new_event()
        stop = self._registry.watch_every(self._channels(), wake)
        closing = self._registry.closing
        try:
            last, first = None, True
            while not closing.is_set():
                last = self._registry.drive(self._next_flow(last, first, wake))
                if closing.is_set():
                    return
                first = False
                yield last
        finally:
            stop()


class Redlock(ManagerBase[Lock, MultiLock]):
    __doc__ = ManagerBase.__doc__

    _handle_class = Lock
    _multi_handle_class = MultiLock
    _backend_class = ThreadBackend
    _transport_class = SyncTransport
    _listener_class = SyncReleaseListener
    _executor_class = SyncExecutor
    _transport: SyncTransport

    def election(self, name: str, ttl: float = 10.0, *, identity: str | None = None) -> Election:
        """A fenced leader election named ``name`` (docs/design.md §12.1): each term is
        a fencing token; ``identity`` (default ``host:pid``) is what ``leader()``
        reports for this candidate."""
        return Election(self._registry, name, ttl, identity)

    def semaphore(self, name: str, permits: int = 1, ttl: float = 10.0, *, blocking: bool = True,
                  timeout: float | None = None, auto_extend: bool = False,
                  on_lost: Callable[[Semaphore], object] | None = None) -> Semaphore:
        """A permit handle of the counting semaphore ``name`` with ``permits`` slots
        (every client of the name must pass the same number; docs/design.md §12.2). The
        other options are :meth:`lock`'s."""
        return Semaphore(self._registry, name, permits, ttl, blocking=blocking,
                         timeout=timeout, auto_extend=auto_extend, on_lost=on_lost)

    def rwlock(self, name: str, ttl: float = 10.0) -> ReadWriteLock:
        """A read-write lock named ``name`` (docs/design.md §12.3): ``.read()`` and
        ``.write()`` make its handles."""
        return ReadWriteLock(self._registry, name, ttl)

    def adopt(self, handover: Handover | Mapping[str, Any] | str | bytes, *,
              auto_extend: bool = False, on_lost: Callable[[Lock], object] | None = None) -> Lock:
        """Hold an acquisition exported elsewhere (``lock.export()``, or its JSON or
        dict form): returns a handle the calling thread holds, to extend and release.

        One round checks that a quorum of nodes still holds its key and measures how
        long (docs/design.md §5.6). Raises :class:`LockLost` if the acquisition is gone
        (expired, released), :class:`QuorumUnavailable` if too few nodes answer."""
        return self._drive(self._adopt_flow(handover, auto_extend, on_lost))

    def _drive(self, flow: Flow[T]) -> T:
        # The handles' one way to the executor (a test of the generation, then the flavour's
        # warning, rather than the shared _drive's frames: every call passes here).
        if self._generation != _fork.generation:
            self._in_this_process()
        if not self._told_of_loop and _in_event_loop():
            self._blocks_a_loop()
        return cast(T, self._executor.drive(flow))

    # Whether this manager warned that it was called in a running event loop (once per
    # manager; until then every driven call asks).
    _told_of_loop = False

    def _blocks_a_loop(self) -> None:
        self._told_of_loop = True
        warn("Redlock, the blocking client, was called on a thread running an asyncio event"
             " loop (in async def code): every call blocks the loop, and all its tasks wait"
             " until the nodes answer. Use AsyncRedlock there (async with dlm.lock(...)), or"
             " run the blocking call in a thread (await asyncio.to_thread(...)). Told once"
             " per manager.", BlockingInEventLoopWarning)

    def close(self) -> None:
        """Stop the manager's background work and close the connections it opened (the
        caller's clients stay open). When it returns no thread of the manager runs any
        more. Auto-extended locks still held are no longer renewed: they are marked lost
        (their holders' ``check()`` raises :class:`LockLost`) and expire with their TTL."""
        for runner in self._stop_background():
            if runner is not None and runner is not threading.current_thread():
                runner.join(self._close_grace())  # a repair in progress finishes its step
        if self._room.listener is not None:
            self._room.listener.close()
        self._transport.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _in_event_loop() -> bool:
    """Whether this thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
