"""Lock handles, shared by the sync and asyncio clients: all but waiting and I/O.

A handle holds its options and, per owner (thread or task, held weakly), that owner's
acquisition, and writes acquire, release, extend and ``on_lost`` as flows that the shells drive.
:class:`LockBase` is one resource's handle, :class:`MultiLockBase` a set's."""

from __future__ import annotations

import contextvars
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from redlock._client.registry import Registry
from redlock._client.telemetry import AttemptWatch, observe
from redlock._core.algorithm import RedlockCore
from redlock._core.handover import Handover, export_state
from redlock._core.kinds import MUTEX, Kind
from redlock._core.requests import Flow, Invoke, T
from redlock._core.settings import (
    label,
    shown,
    validate_resource,
    validate_resources,
    validate_timeout,
)
from redlock._core.state import AcquireResult, LockState, Status
from redlock._observe.log import get_logger
from redlock.errors import (
    AlreadyHeld,
    LockLost,
    LockNotAcquired,
    NodeResult,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    RedlockError,
    describe,
)

logger = get_logger("redlock.locks")


# Set only while on_lost runs (in a thread or task of its own): the handle then answers
# token/lost/check() for the lost acquisition instead of the caller's own.
ACTING_FOR: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "redlock_acting_for", default=None)


V = TypeVar("V")


class OwnerMap(Generic[V]):
    """A handle's value per owner, held weakly: a finished thread or task takes its entry
    along. Each access is one dict operation, atomic, so threads share it without a lock."""

    __slots__ = ("_data", "_drop")

    def __init__(self) -> None:
        data: dict[weakref.ref[Any], V] = {}
        self._data = data

        def drop(ref: weakref.ref[Any]) -> None:  # the owner is gone: so is its entry
            data.pop(ref, None)
        self._drop: Callable[[weakref.ref[Any]], None] = drop

    def get(self, owner: object) -> V | None:
        return self._data.get(weakref.ref(owner))

    def __setitem__(self, owner: object, value: V) -> None:
        self._data[weakref.ref(owner, self._drop)] = value

    def __len__(self) -> int:
        return len(self._data)


def check_mode(blocking: bool, timeout: float | None) -> None:
    if not blocking and timeout is not None:
        raise ValueError("a timeout makes no sense with blocking=False (one attempt):"
                         " pass one or the other")


class HandleBase:
    """Options, per-owner state and the flows, for one resource or a set."""

    def __init__(self, registry: Registry, resources: tuple[str, ...], ttl: float, *,
                 blocking: bool, timeout: float | None, auto_extend: bool,
                 on_lost: Callable[[Any], object] | None, reentrant: bool,
                 kind: Kind = MUTEX) -> None:
        self._registry = registry
        self._core: RedlockCore = registry.core
        self._resources = resources
        self._kind = kind  # what is acquired (docs/design.md §12.0)
        self._label = label(resources)
        # In messages: 'orders' for a lock, "permit of 'jobs'" for the other kinds.
        self._shown = shown(resources) if kind is MUTEX else kind.describe(resources)
        # The options, checked here once: read-only afterwards (the properties below).
        self._ttl = self._core.settings.check_ttl(ttl)
        self._blocking = bool(blocking)
        self._timeout = validate_timeout(timeout)
        check_mode(self._blocking, self._timeout)
        self._auto_extend = bool(auto_extend)
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be a callable (or None), not {type(on_lost).__name__}")
        self._on_lost = on_lost
        self._reentrant = bool(reentrant)
        self._last_failure: LockNotAcquired | None = None
        # Per owner (thread or task, held weakly), its acquisition through this handle;
        # kept after a release so that a second release() is a no-op.
        self._states: OwnerMap[LockState] = OwnerMap()

    # -- the options (read-only: a handle is made with them, dlm.lock(...) checks them) --

    @property
    def ttl(self) -> float:
        """Seconds the lock lives on the nodes unless extended (``extend(ttl)`` may give
        one acquisition another)."""
        return self._ttl

    @property
    def blocking(self) -> bool:
        """Whether ``acquire()`` waits (up to :attr:`timeout`) unless told otherwise."""
        return self._blocking

    @property
    def timeout(self) -> float | None:
        """The overall deadline of a blocking ``acquire()``, in seconds (None: none)."""
        return self._timeout

    @property
    def auto_extend(self) -> bool:
        """Whether the manager renews the lock in the background while it is held."""
        return self._auto_extend

    @property
    def on_lost(self) -> Callable[[Any], object] | None:
        """Called once, with this handle, when a renewed lock is lost anyway."""
        return self._on_lost

    @property
    def reentrant(self) -> bool:
        """Whether the same thread (asyncio task) may nest acquisitions through it."""
        return self._reentrant

    @property
    def last_failure(self) -> LockNotAcquired | None:
        """Why the last acquire through this handle that failed did (None: none has):
        its message and per-node ``outcomes``."""
        return self._last_failure

    def _owner_key(self) -> Hashable:
        acting_for = ACTING_FOR.get()
        if acting_for is not None:  # inside on_lost: the handle shows the lost acquisition
            return acting_for
        owner = self._registry.current_owner()
        if owner is None:  # (asyncio, outside a task)
            raise RuntimeError("AsyncLock must be used from inside an asyncio task")
        return owner

    def _quiet(self) -> bool:
        """Whether nothing records (OpenTelemetry, §11.5): the flows are then made as they
        are, after one look at an attribute."""
        telemetry = self._registry.telemetry
        return telemetry is None or time.monotonic() < telemetry.quiet_until

    def _observed(self, op: str, make_flow: Callable[[AttemptWatch | None], Flow[T]]) -> Flow[T]:
        """The operation's flow, made by ``make_flow(watch)`` and observed for
        OpenTelemetry when something records; ``watch`` hears of each acquire attempt
        from the core (None when nothing does)."""
        return observe(self._registry.telemetry, op, make_flow, self, self._core.amnesia.health)

    # -- the flows the shells drive -------------------------------------------

    def _acquire_flow(self, blocking: bool | None, timeout: float | None) -> Flow[bool]:
        """An acquire call (docs/design.md §2), observed when something records."""
        if self._quiet():
            return self._acquire(blocking, timeout, None)
        return self._observed("acquire", lambda watch: self._acquire(blocking, timeout, watch))

    def _release_flow(self) -> Flow[None]:
        """A release (docs/design.md §5.3), observed when something records."""
        if self._quiet():
            return self._release()
        return self._observed("release", lambda _: self._release())

    def _extend_flow(self, ttl: float | None) -> Flow[None]:
        """An explicit extend (docs/design.md §5.1), observed when something records."""
        if self._quiet():
            return self._extend(ttl)
        return self._observed("extend", lambda _: self._extend(ttl))

    def _acquire(self, blocking: bool | None, timeout: float | None,
                 watch: AttemptWatch | None) -> Flow[bool]:
        """A reentrant handle's owner may re-enter what it holds; anything else is the
        core's acquire."""
        owner = self._owner_key()
        blocking, timeout = self._call_options(blocking, timeout)
        if self._reentrant:
            if (yield from self._reenter_flow(owner)):
                return True
        else:
            self._refuse_nesting(owner)
        result = yield from self._core.acquire(self._resources, self._ttl, blocking=blocking,
                                               timeout=timeout, watch=watch, kind=self._kind)
        state = result.state
        if state is None:
            self._failed(result)
            return False
        self._acquired(state, owner)
        return True

    def _call_options(self, blocking: bool | None,
                      timeout: float | None) -> tuple[bool, float | None]:
        """An acquire call's mode and timeout: as given (checked), else the handle's."""
        if blocking is None and timeout is None:
            return self._blocking, self._timeout
        if blocking is not None and timeout is not None:
            check_mode(bool(blocking), validate_timeout(timeout))
        return (self._blocking if blocking is None else bool(blocking),
                self._timeout if timeout is None else validate_timeout(timeout))

    def _reenter_flow(self, owner: Hashable) -> Flow[bool]:
        """True when the owner re-entered an acquisition it holds (a reentrant lock);
        raises :class:`AlreadyHeld` if it holds one through this handle and may not nest.
        Re-entry through another handle honours that handle's options: a longer TTL is
        extended to, and auto_extend starts renewing."""
        state = self._registry.reentered(self._label, owner)
        if state is not None:
            state.check()  # re-entering a lock whose validity ran out must not pass silently
            with state.mutex:
                state.depth += 1
            self._states[owner] = state
            if self._ttl > state.ttl:
                yield from self._extended(state, self._ttl)
            if self._auto_extend:
                self._registry.renewals.add(state, self)
            return True
        self._refuse_nesting(owner)
        return False

    def _refuse_nesting(self, owner: Hashable) -> None:
        """:class:`AlreadyHeld` if the owner holds an acquisition through this handle."""
        current = self._states.get(owner)
        if current is not None and current.status == Status.HELD and not current.expired():
            raise AlreadyHeld(
                f"this owner already holds {self._shown} through this handle: release it"
                " first, or create the lock with reentrant=True to nest",
                resource=self._label)

    def _release(self) -> Flow[None]:
        """Release at depth 0. Raises :class:`LockLost` (after cleaning up) when the
        acquisition had been lost, had expired, or a majority no longer held our key:
        the critical section may have run unprotected. A second release is a no-op."""
        state, expired = self._begin_release()
        if state is None:
            return
        try:
            [outcomes] = yield from self._core.holding.release_many([state])
        finally:
            self._registry.released(state)
        self._end_release(expired, outcomes)

    def _begin_release(self) -> tuple[LockState | None, bool]:
        """The caller's release begins: what it releases (None: nothing to send, a nested
        level or a second release, or the parent's acquisition in a fork), and whether
        its validity had run out."""
        owner = self._owner_key()
        state = self._held(owner)
        if state.inherited:  # the parent process's acquisition (a fork): it releases it
            return None, False
        with state.mutex:
            if state.depth > 1:
                state.depth -= 1
                return None, False
            if state.release_called or state.status == Status.HANDED_OVER:
                return None, False
            state.release_called = True
        if state.auto_extended:
            self._registry.renewals.remove(state)
        if self._reentrant:  # (only a reentrant handle's acquisitions are registered)
            self._registry.forget_reentrant(state, owner)
        if state.status == Status.LOST:  # its keys were dropped when it was lost
            state.check()
        return state, state.expired()

    def _end_release(self, expired: bool, outcomes: tuple[NodeResult, ...]) -> None:
        taken = [r.outcome for r in outcomes].count(Outcome.REFUSED)
        if expired or (taken and self._core.holding.key_gone(outcomes)):
            why = ("its validity had run out" if expired
                   else f"{taken} of {self._core.n} nodes no longer held our key")
            raise LockLost(f"lock on {self._shown} was not held to the end ({why}): the"
                           " critical section may have run unprotected",
                           resource=self._label, outcomes=outcomes)

    def _lost_on_exit(self, lost: LockLost, propagating: bool) -> None:
        """Leaving a ``with`` block: a lost lock raises unless another exception is
        already on its way (that one says more; the loss is logged)."""
        if not propagating:
            raise lost
        logger.warning("redlock.lost_on_exit", resource=self._label, reason=str(lost))

    def _extend(self, ttl: float | None) -> Flow[None]:
        state = self._held(self._owner_key())
        ttl = self._ttl if ttl is None else self._core.settings.check_ttl(ttl)
        yield from self._extended(state, ttl)

    def _extended(self, state: LockState, ttl: float) -> Flow[None]:
        """An explicit extend: while the renewals have it, a round of theirs may still land
        with the old TTL after ours (docs/design.md §5.2); after it, they renew it from
        its new validity and TTL."""
        renewals = self._registry.renewals
        racing = renewals.withdraw(state)
        try:
            yield from self._core.holding.extend_or_lose(state, ttl, racing)
        finally:
            renewals.rescheduled(state)

    def _lost_flow(self, state: LockState) -> Flow[None]:
        """Tell this handle's on_lost that ``state`` was lost while renewed."""
        if self._on_lost is None:
            return
        # The callback runs in a thread or task of its own, not in the owner's: let the
        # handle's token/lost/check() answer for the owner's acquisition in there.
        acting = ACTING_FOR.set(state.holder())
        try:
            yield Invoke(self._on_lost, (self,))
        except Exception:
            logger.exception("redlock.on_lost_failed", resource=self._label)
        finally:
            ACTING_FOR.reset(acting)

    # -- bookkeeping -------------------------------------------------------------

    def _failed(self, result: AcquireResult) -> None:
        """Record why an acquire failed (and for outages raise it)."""
        failure_type = QuorumUnavailable if result.unavailable else LockNotAcquired
        self._last_failure = failure_type(
            f"could not acquire {self._shown} after {result.attempts} attempt(s):"
            f" {result.reason}; {describe(result.outcomes)}",
            resource=self._label, outcomes=result.outcomes)
        if result.unavailable:
            raise self._last_failure

    def _acquired(self, state: LockState, owner: Hashable) -> None:
        """The owner holds ``state`` now: recorded, re-entrant, renewed as asked."""
        self._hold(state, owner)
        if self._reentrant:
            self._registry.register_reentrant(state, owner)
        if self._auto_extend:
            self._registry.renewals.add(state, self)

    def _hold(self, state: LockState, owner: Hashable) -> None:
        state.holder = weakref.ref(owner)
        self._states[owner] = state

    def _entered_failure(self) -> LockNotAcquired:
        return self._last_failure or LockNotAcquired(
            f"could not acquire {self._shown}", resource=self._label)

    # -- the caller's own acquisition -------------------------------------------

    def _current(self) -> LockState | None:
        return self._states.get(self._owner_key())

    def _held(self, owner: Hashable | None = None) -> LockState:
        state = self._states.get(self._owner_key() if owner is None else owner)
        if state is None:
            raise NotHeld(f"{self._shown} is not held by this owner through this handle",
                          resource=self._label)
        return state

    @property
    def validity(self) -> float:
        """Seconds of validity left on a monotonic clock; 0 when not held."""
        state = self._current()
        return 0.0 if state is None else state.validity()

    @property
    def lost(self) -> bool:
        """True once the lock was lost (extend or the renewals failed)."""
        state = self._current()
        return state is not None and state.status == Status.LOST

    def locked(self) -> bool:
        """True while the caller holds the lock and its validity has not run out (no
        I/O). Whether anyone holds the resource, asked of the nodes:
        ``redlock.admin.Admin(dlm).is_locked(resource)``."""
        return self.validity > 0

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock was lost or its validity ran out."""
        self._held().check()

    def _status_text(self) -> str:
        try:
            state = self._current()
        except RuntimeError:  # an asyncio handle shown outside its event loop
            return "(no task: its owner is not known here)"
        return "unlocked" if state is None else str(state.status)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._label} ttl={self._ttl:g}s {self._status_text()}>"


class LockBase(HandleBase):
    """One resource's lock handle."""

    def __init__(self, registry: Registry, resource: str, ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None, reentrant: bool = False) -> None:
        name = validate_resource(resource)
        super().__init__(registry, (name,), ttl, blocking=blocking, timeout=timeout,
                         auto_extend=auto_extend, on_lost=on_lost, reentrant=reentrant)

    @property
    def resource(self) -> str:
        """The resource's name, as the lock was made with it."""
        return self._resources[0]

    @property
    def token(self) -> int:
        """The fencing token; raises :class:`LockLost` once the lock is lost or expired."""
        state = self._held()
        state.check()
        return state.token

    def export(self) -> Handover:
        """Hand the caller's acquisition over: a value another process or manager passes to
        ``adopt()`` to hold it (docs/design.md §5.6). From now on this handle neither extends
        nor releases it, and ``token``/``check()`` raise :class:`NotHeld`. Raises
        :class:`LockLost` if the lock is no longer valid."""
        owner = self._owner_key()
        state = self._held(owner)
        if state.inherited:
            state.check()  # raises NotHeld: the parent process's acquisition
        with state.mutex:
            if state.depth > 1:
                raise RedlockError(
                    f"{self._label!r} is re-entered ({state.depth} levels): export it"
                    " from the outermost level only", resource=self._label)
        value = export_state(state, self._core.keys.namespace, self._core.env.wall_clock)
        with state.mutex:
            if state.status != Status.HELD:  # lost meanwhile (the renewals)
                state.check()
            state.status = Status.HANDED_OVER
        if state.auto_extended:
            self._registry.renewals.remove(state)
        if self._reentrant:  # (only a reentrant handle's acquisitions are registered)
            self._registry.forget_reentrant(state, owner)
        return value


class MultiLockBase(HandleBase):
    """A set of resources' lock handle: all or nothing, a token per resource (not
    reentrant). The keys are those of single locks, so single and set acquisitions of
    a resource exclude each other and share its fence counter (docs/design.md §11.2)."""

    def __init__(self, registry: Registry, resources: Iterable[str], ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None) -> None:
        super().__init__(registry, validate_resources(resources), ttl, blocking=blocking,
                         timeout=timeout, auto_extend=auto_extend, on_lost=on_lost,
                         reentrant=False)

    @property
    def resources(self) -> tuple[str, ...]:
        """The resources, sorted and without duplicates."""
        return self._resources

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each resource (raises :class:`LockLost` once lost or
        expired): pass ``tokens[resource]`` to that resource's fenced store."""
        state = self._held()
        state.check()
        return dict(state.tokens)
