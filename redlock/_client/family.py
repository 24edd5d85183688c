"""The lock family's handles, shared by both clients (docs/design.md §12), as
:mod:`redlock._client.handles` is for locks: :class:`SemaphoreBase` (a permit),
:class:`ReadLockBase` and :class:`WriteLockBase` (made by :class:`ReadWriteLockBase`),
:class:`LeadershipBase` (made by :class:`ElectionBase`'s ``campaign()``).
Each takes the lock's options; none is reentrant or exportable."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from redlock._client.handles import HandleBase
from redlock._client.registry import Registry
from redlock._core.kinds import READ, WRITE, Leadership, Permit
from redlock._core.requests import Flow
from redlock._core.settings import validate_resource
from redlock._core.views import (
    Leader,
    ReadWriteStatus,
    SemaphoreStatus,
    election_channels,
    next_leader,
    read_leader,
    rwlock_status,
    semaphore_status,
)

#: The most permits a semaphore may have: each attempt reads every slot on every node.
MAX_PERMITS = 1024


def validate_permits(permits: object) -> int:
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"permits must be between 1 and {MAX_PERMITS}, got {permits}")
    return permits


def validate_identity(identity: object) -> str:
    if not isinstance(identity, str):
        raise TypeError(f"identity must be a str, not {type(identity).__name__}")
    if not identity:
        raise ValueError("identity must be a non-empty string (who campaigns: a host"
                         " name, a pod name, an address)")
    return identity


def default_identity() -> str:
    """``host:pid``: enough to tell the candidates of a fleet apart."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _FamilyHandle(HandleBase):
    """A handle of one name, of one kind of the family; not reentrant."""

    @property
    def name(self) -> str:
        """The name it was made with."""
        return self._resources[0]

    @property
    def resource(self) -> str:
        """The name (telemetry and events call it the resource)."""
        return self._resources[0]

    @property
    def kind_name(self) -> str:
        return self._kind.name

    @property
    def token(self) -> int:
        """The fencing token (raises :class:`LockLost` once lost or expired)."""
        state = self._held()
        state.check()
        return state.token

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self._ttl:g}s {self._status_text()}>"


class SemaphoreBase(_FamilyHandle):
    """A permit of the counting semaphore ``name`` with ``permits`` slots (§12.2):
    acquire, release, extend and ``auto_extend`` as a lock's; while held, ``token`` is
    the slot's fencing token and ``slot_name`` the resource a fenced store checks it
    under. Safe to share across threads or tasks: each owner gets its own permit."""

    def __init__(self, registry: Registry, name: str, permits: int = 1, ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None) -> None:
        self._permits = validate_permits(permits)
        super().__init__(registry, (validate_resource(name),), ttl, blocking=blocking,
                         timeout=timeout, auto_extend=auto_extend, on_lost=on_lost,
                         reentrant=False, kind=Permit(permits=self._permits))

    @property
    def permits(self) -> int:
        """How many holders the semaphore admits at once (every client of the name must
        make it with the same number)."""
        return self._permits

    @property
    def slot(self) -> int:
        """Which of the ``permits`` slots the caller's permit is (0-based)."""
        state = self._held()
        state.check()
        assert isinstance(state.kind, Permit) and state.kind.slot is not None
        return state.kind.slot

    @property
    def slot_name(self) -> str:
        """The name a fenced store keeps this permit's mark under, ``"<name>:permit:<slot>"``:
        one mark per slot, since K holders hold at once (docs/design.md §12.2)."""
        return Permit(permits=self._permits).slot_name(self.name, self.slot)

    def _status_flow(self) -> Flow[SemaphoreStatus]:
        return semaphore_status(self._core, self.name, self._permits)


class ReadLockBase(_FamilyHandle):
    """A read-write lock's read handle: readers share; ``token`` is the last write token
    the read saw (every write that ended before it has a token ≤ it, every write that
    starts after it a larger one, docs/design.md §12.3)."""

    def __init__(self, registry: Registry, name: str, ttl: float = 10.0, *, blocking: bool = True,
                 timeout: float | None = None, auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None) -> None:
        super().__init__(registry, (validate_resource(name),), ttl, blocking=blocking,
                         timeout=timeout, auto_extend=auto_extend, on_lost=on_lost,
                         reentrant=False, kind=self._mode)

    _mode: ClassVar[Any] = READ


class WriteLockBase(ReadLockBase):
    """A read-write lock's write handle: excludes readers and other writers; queued
    writers go before readers that arrive after them. ``token`` is a fencing token from
    the name's counter, strictly increasing across writes."""

    _mode: ClassVar[Any] = WRITE


R = TypeVar("R", bound=ReadLockBase)
W = TypeVar("W", bound=WriteLockBase)


class ReadWriteLockBase(Generic[R, W]):
    """``dlm.rwlock(name, ttl)``: makes read and write handles of one name, with this
    object's TTL unless given."""

    _read_class: type[R]
    _write_class: type[W]

    def __init__(self, registry: Registry, name: str, ttl: float = 10.0) -> None:
        self._registry = registry
        self._name = validate_resource(name)
        self._ttl = registry.core.settings.check_ttl(ttl)

    @property
    def name(self) -> str:
        """The read-write lock's name, shared by its read and write handles."""
        return self._name

    @property
    def ttl(self) -> float:
        """The TTL of the handles it makes, unless given another."""
        return self._ttl

    def read(self, ttl: float | None = None, *, blocking: bool = True,
             timeout: float | None = None, auto_extend: bool = False,
             on_lost: Callable[[R], object] | None = None) -> R:
        """A read handle (readers share); the options are ``lock()``'s."""
        return self._read_class(self._registry, self._name, self._ttl if ttl is None else ttl,
                                blocking=blocking, timeout=timeout, auto_extend=auto_extend,
                                on_lost=on_lost)

    def write(self, ttl: float | None = None, *, blocking: bool = True,
              timeout: float | None = None, auto_extend: bool = False,
              on_lost: Callable[[W], object] | None = None) -> W:
        """A write handle (excludes everyone); the options are ``lock()``'s."""
        return self._write_class(self._registry, self._name, self._ttl if ttl is None else ttl,
                                 blocking=blocking, timeout=timeout, auto_extend=auto_extend,
                                 on_lost=on_lost)

    def _status_flow(self) -> Flow[ReadWriteStatus]:
        return rwlock_status(self._registry.core, self._name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r} ttl={self._ttl:g}s>"


class LeadershipBase(_FamilyHandle):
    """An election's leadership (``election.campaign()``): acquired by waiting in the
    election's line, renewed in the background while held; ``token`` is the term,
    strictly increasing across terms; leaving the block (or ``resign()``) steps down."""

    def __init__(self, registry: Registry, name: str, ttl: float, identity: str, *,
                 timeout: float | None, on_lost: Callable[[Any], object] | None) -> None:
        self._identity = identity
        super().__init__(registry, (validate_resource(name),), ttl, blocking=True,
                         timeout=timeout, auto_extend=True, on_lost=on_lost, reentrant=False,
                         kind=Leadership(identity=identity))

    @property
    def identity(self) -> str:
        """Who campaigns: what ``leader()`` reports while this leadership is held."""
        return self._identity

    @property
    def term(self) -> int:
        """The term (the same number as ``token``)."""
        return self.token


L = TypeVar("L", bound=LeadershipBase)


class ElectionBase(Generic[L]):
    """``dlm.election(name, ttl, identity)``: campaign for leadership, see who leads,
    follow changes (docs/design.md §12.1)."""

    _leadership_class: type[L]

    def __init__(self, registry: Registry, name: str, ttl: float = 10.0,
                 identity: str | None = None) -> None:
        self._registry = registry
        self._name = validate_resource(name)
        self._ttl = registry.core.settings.check_ttl(ttl)
        self._identity = (default_identity() if identity is None else validate_identity(identity))

    @property
    def name(self) -> str:
        """The election's name."""
        return self._name

    @property
    def ttl(self) -> float:
        """How long a term lasts unless renewed (leaderships are renewed while held)."""
        return self._ttl

    @property
    def identity(self) -> str:
        """This candidate's identity (default ``host:pid``), what ``leader()`` reports."""
        return self._identity

    def campaign(self, timeout: float | None = None, *,
                 on_lost: Callable[[L], object] | None = None) -> L:
        """The leadership, to enter (``with`` / ``async with``): entering waits in the
        election's line until elected (or ``timeout`` seconds: then
        :class:`LockNotAcquired`); the block's value is the leadership, renewed while
        held (``on_lost`` is told if it is lost anyway); leaving the block resigns."""
        return self._leadership_class(self._registry, self._name, self._ttl, self._identity,
                                      timeout=timeout, on_lost=on_lost)

    def _leader_flow(self) -> Flow[Leader | None]:
        return read_leader(self._registry.core, self._name)

    def _next_flow(self, last: Leader | None, first: bool, wake: Any) -> Flow[Leader | None]:
        return next_leader(self._registry.core, self._name, last, first, self._ttl, wake,
                           self._registry.closing)

    def _channels(self) -> tuple[str, ...]:
        return election_channels(self._registry.core.keys, self._name)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self._name!r} ttl={self._ttl:g}s"
                f" identity={self._identity!r}>")
