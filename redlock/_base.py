"""Everything the sync and asyncio clients share: all but waiting and socket I/O.

:class:`ManagerBase` holds the settings, the algorithm (:class:`RedlockCore`), the
local lines and the reentrancy registry, and makes handles. :class:`LockBase` holds a
handle's options and per-owner state, and writes acquire, release, extend and the
watchdog as protocols (generators, see :mod:`redlock._protocol`). The shells
(:mod:`redlock.client`, :mod:`redlock.aio`) add only a transport, a driver and how
they wait: ``lock.acquire()`` there is ``drive(self._acquire_flow(...))``.

A handle may be shared by threads (sync) or tasks (asyncio): each owner (thread or
task) that acquires through it gets its own acquisition, with its own secret owner
value and token; ``token``, ``validity``, ``release()`` act on the caller's own.
"""

from __future__ import annotations

import contextvars
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from redlock import _inspect
from redlock._algorithm import RedlockCore
from redlock._decorator import F, make_decorator
from redlock._handover import Handover, as_handover, export_state
from redlock._handover import adopt as adopt_handover
from redlock._lines import LocalLines
from redlock._log import get_logger
from redlock._multi import MultiCore
from redlock._protocol import Invoke, Protocol, T, Wakeable
from redlock._renewals import Renewals
from redlock._rules import Settings, validate_resource, validate_timeout
from redlock._state import AcquireResult, LockState, Status
from redlock._telemetry import Telemetry, observe
from redlock.errors import (
    AlreadyHeld,
    LockLost,
    LockNotAcquired,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    RedlockError,
    describe,
)

logger = get_logger(__name__)

H = TypeVar("H", bound="LockBase[Any]")
M = TypeVar("M", bound="ManagerBase[Any]")

# Set only while a watchdog runs on_lost (in its own thread or task): the handle then
# answers token/lost/check() for the lost acquisition instead of the caller's own.
_ACTING_FOR: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "redlock_acting_for", default=None)


def _check_mode(blocking: bool, timeout: float | None) -> None:
    if not blocking and timeout is not None:
        raise ValueError("a timeout makes no sense with blocking=False (one attempt):"
                         " pass one or the other")


class ManagerBase(Generic[H]):
    """A distributed lock manager over N independent Redis masters.

    Args:
        nodes: URLs (``redis://host:port``, ``rediss://user:pass@host:port``) or
            redis-py clients (``Sentinel.master_for(service)`` clients too, named
            ``sentinel:<service>``), one per independent master, in any collection (a
            list, a tuple, a set: the order of a set is arbitrary, and node names in
            errors follow it). An odd N is best. Redis Cluster clients are refused.
        namespace: key prefix; keys are ``{namespace}:{{resource}}:lock`` / ``:fence``.
        node_timeout: seconds each node may take to answer one request (connect
            included). Keep it small relative to the TTL: 5-50 ms for a 10 s TTL.
        drift_factor: clock-drift allowance as a fraction of the TTL (plus 2 ms).
        retry_delay_min: the shortest wait between attempts (the floor of the jittered
            exponential backoff).
        retry_delay_max: the longest wait between attempts (a release by a handle of
            this manager wakes a waiter early).
        max_ttl: the largest TTL accepted, and how long an amnesiac node stays out
            before it is re-seeded and rejoins (every old lock has expired by then).
        outage_timeout: a blocking acquire raises :class:`QuorumUnavailable` once the
            cluster has been unavailable (too few nodes answering, not contention) for
            this long, whatever its own timeout; None waits through outages.
        clock: a monotonic clock in seconds (injectable for tests).
        sleep: how to wait between attempts (injectable for tests; the default waits
            in the manager's local line, where a release wakes the first waiter).
        tracer_provider, meter_provider: OpenTelemetry providers to record spans and
            metrics with (needs the ``otel`` extra); by default the global ones, and
            nothing is recorded while those are OpenTelemetry's no-op defaults.
    """

    _handle_class: type[H]
    _asynchronous = False  # the asyncio shell's handles are awaited

    def __init__(
        self,
        nodes: Iterable[Any],
        *,
        namespace: str = "redlock",
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay_min: float = 0.005,
        retry_delay_max: float = 0.25,
        max_ttl: float = 3600.0,
        outage_timeout: float | None = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        settings = Settings(namespace=namespace, node_timeout=node_timeout,
                            drift_factor=drift_factor, retry_delay_min=retry_delay_min,
                            retry_delay_max=retry_delay_max, max_ttl=max_ttl,
                            outage_timeout=outage_timeout)
        # The transport checks the node list; it opens no connection before first use,
        # so nothing leaks if anything below raises.
        self._transport = self._open_transport(nodes, settings.node_timeout)
        self._core = RedlockCore(self._transport.addresses, settings, clock)
        self._multi_core = MultiCore(self._core)
        self._telemetry = Telemetry.create(settings.namespace, self._core.n, self._core.quorum,
                                           tracer_provider, meter_provider)
        self._sleep = sleep
        self._lines: LocalLines[Any, Any] = LocalLines(self._new_event, self._new_turn)
        # Per owner (a thread or task, held weakly: a finished one takes its entries
        # along), the acquisitions it may re-enter, by resource.
        self._reentrant: weakref.WeakKeyDictionary[Any, dict[str, LockState]] = (
            weakref.WeakKeyDictionary())
        self._reentrant_mutex = threading.Lock()
        self._background: set[Any] = set()  # asyncio keeps only weak refs to tasks
        self._renewals = Renewals(self._core, self._new_event,
                                  lambda loop: self._spawn(loop, "redlock-renewals"),
                                  self._notify_lost)

    # -- what each shell provides ----------------------------------------------

    def _open_transport(self, nodes: Iterable[Any], node_timeout: float) -> Any:
        raise NotImplementedError

    def _new_event(self) -> Wakeable:
        raise NotImplementedError

    def _new_turn(self) -> Any:
        raise NotImplementedError

    def _current_owner(self) -> Hashable:
        raise NotImplementedError

    def _spawn(self, protocol: Protocol[None], name: str) -> None:
        """Run a protocol in the background (a thread, or a task)."""
        raise NotImplementedError

    # -- public ----------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses, in the order given."""
        return self._core.addresses

    @property
    def quorum(self) -> int:
        """How many nodes make a majority: N // 2 + 1."""
        return self._core.quorum

    def lock(
        self,
        resource: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_extend: bool = False,
        on_lost: Callable[[H], object] | None = None,
        reentrant: bool = False,
    ) -> H:
        """A lock handle for ``resource``; nothing is sent until it is acquired."""
        return self._handle_class(self, resource, ttl, blocking=blocking, timeout=timeout,
                                  auto_extend=auto_extend, on_lost=on_lost, reentrant=reentrant)

    # -- operator views and tools (redlock/_inspect.py), driven by the shells ---

    def _inspect_flow(self, resource: str) -> Protocol[_inspect.LockStatus]:
        return _inspect.inspect_lock(self._core, validate_resource(resource))

    def _is_locked_flow(self, resource: str) -> Protocol[bool]:
        return _inspect.is_locked(self._core, validate_resource(resource))

    def _force_release_flow(self, resource: str) -> Protocol[list[_inspect.ReleaseReport]]:
        resource = validate_resource(resource)
        try:
            return (yield from _inspect.force_release(self._core, resource))
        finally:
            self._lines.notify(self._core.keys.channel(resource))  # local waiters: go

    def locked(
        self,
        resource: str | Callable[..., str],
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_extend: bool = False,
        on_lost: Callable[[H], object] | None = None,
        reentrant: bool = False,
        pass_lock: str | None = None,
    ) -> Callable[[F], F]:
        """Decorator: each call of the function runs while holding ``resource``.

        ``resource`` is a name, or a function of the call's arguments that returns one
        (``lambda order_id, **_: f"order:{order_id}"``: one lock per order). The other
        options are :meth:`lock`'s. A lock that cannot be had raises
        :class:`LockNotAcquired` (like ``with lock:``) and the function does not run.
        ``pass_lock="held"`` hands the held lock to the function as the keyword argument
        ``held`` (declare it, e.g. ``*, held: Lock | None = None``) to read its token,
        extend it or check it. Recursive functions need ``reentrant=True``.

        ``Redlock.locked`` takes plain functions, ``AsyncRedlock.locked`` coroutine
        functions; the other kind, and generator functions, raise ``TypeError`` here.
        """
        options = {"ttl": ttl, "blocking": blocking, "timeout": timeout,
                   "auto_extend": auto_extend, "on_lost": on_lost, "reentrant": reentrant}
        return make_decorator(self, resource, options, pass_lock,
                              asynchronous=self._asynchronous)

    def _adopt_flow(self, handover: Handover | Mapping[str, Any] | str | bytes,
                    auto_extend: bool, on_lost: Callable[[H], object] | None) -> Protocol[H]:
        """Take over an exported acquisition (docs/design.md §5.6) in a new handle that
        the calling owner (thread or task) holds."""
        value = as_handover(handover)
        handle = self._handle_class(self, value.resource, value.ttl, auto_extend=auto_extend,
                                    on_lost=on_lost)
        owner = handle._owner_key()
        state = yield from adopt_handover(self._core, value)
        state.holder = weakref.ref(owner)
        with handle._mutex:
            handle._states[owner] = state
        if handle.auto_extend:
            self._renewals.add(state, handle)
        return handle

    # -- reentrancy: per (resource, owner) across this manager's handles -------

    def _reentered(self, resource: str, owner: Hashable) -> LockState | None:
        """The acquisition of ``resource`` this owner may re-enter, if any."""
        with self._reentrant_mutex:
            held = self._reentrant.get(owner, {})
            state = held.get(resource)
            if state is not None and state.status != Status.HELD:
                del held[resource]
                return None
            return state

    def _register_reentrant(self, state: LockState, owner: Hashable) -> None:
        with self._reentrant_mutex:
            self._reentrant.setdefault(owner, {})[state.resource] = state

    def _forget_reentrant(self, state: LockState, owner: Hashable | None) -> None:
        if owner is None:
            return
        with self._reentrant_mutex:
            held = self._reentrant.get(owner)
            if held is not None and held.get(state.resource) is state:
                del held[state.resource]

    def _notify_lost(self, state: LockState, handles: list[Any]) -> None:
        """The renewals lost ``state``: tell each handle, each in a thread/task of its own
        (a slow callback must not hold up the renewal of other locks)."""
        for handle in handles:
            if handle.on_lost is not None:
                self._spawn(handle._lost_flow(state), f"redlock-on-lost:{state.resource}")


class LockBase(Generic[M]):
    """One resource's lock handle: options, per-owner state, and the flows."""

    def __init__(self, manager: M, resource: str, ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None,
                 reentrant: bool = False) -> None:
        self._manager = manager
        self._core: RedlockCore = manager._core
        self.resource = validate_resource(resource)
        self.ttl = self._core.settings.check_ttl(ttl)
        self.blocking = bool(blocking)
        self.timeout = validate_timeout(timeout)
        _check_mode(self.blocking, self.timeout)
        self.auto_extend = bool(auto_extend)
        self.on_lost = on_lost
        self.reentrant = bool(reentrant)
        self.last_failure: LockNotAcquired | None = None
        # Per owner (thread or task, held weakly), its acquisition through this handle;
        # kept after a release so that a second release() is a no-op.
        self._states: weakref.WeakKeyDictionary[Any, LockState] = weakref.WeakKeyDictionary()
        self._mutex = threading.Lock()

    def _owner_key(self) -> Hashable:
        acting_for = _ACTING_FOR.get()
        if acting_for is not None:  # inside on_lost: the handle shows the lost acquisition
            return acting_for
        return self._manager._current_owner()

    # -- the flows the shells drive -------------------------------------------

    def _acquire_flow(self, blocking: bool | None, timeout: float | None) -> Protocol[bool]:
        owner = self._owner_key()
        if blocking is not None and timeout is not None:
            _check_mode(bool(blocking), validate_timeout(timeout))
        blocking = self.blocking if blocking is None else bool(blocking)
        timeout = self.timeout if timeout is None else validate_timeout(timeout)
        if (yield from self._reenter_flow(owner)):
            return True
        result = yield from self._core.acquire(self.resource, self.ttl, blocking=blocking,
                                               timeout=timeout)
        state = self._finish_acquire(result, owner)
        if state is None:
            return False
        if self.auto_extend:
            self._manager._renewals.add(state, self)
        return True

    def _reenter_flow(self, owner: Hashable) -> Protocol[bool]:
        """True when the owner re-entered an acquisition it holds (a reentrant lock);
        raises :class:`AlreadyHeld` if it holds one through this handle and may not nest.
        Re-entry through another handle honours that handle's options: a longer TTL is
        extended to, and auto_extend starts renewing."""
        state = self._manager._reentered(self.resource, owner) if self.reentrant else None
        if state is not None:
            state.check()  # re-entering a lock whose validity ran out must not pass silently
            with state.mutex:
                state.depth += 1
            with self._mutex:
                self._states[owner] = state
            if self.ttl > state.ttl:
                yield from self._core.extend_or_lose(state, self.ttl)
                self._manager._renewals.rescheduled(state)
            if self.auto_extend:
                self._manager._renewals.add(state, self)
            return True
        with self._mutex:
            current = self._states.get(owner)
        if current is not None and current.status == Status.HELD and not current.expired():
            raise AlreadyHeld(
                f"this owner already holds {self.resource!r} through this handle: release it"
                " first, or create the lock with reentrant=True to nest",
                resource=self.resource)
        return False

    def _release_flow(self) -> Protocol[None]:
        """Release at depth 0. Raises :class:`LockLost` (after cleaning up) when the
        acquisition had been lost, had expired, or a majority no longer held our key:
        the critical section may have run unprotected. A second release is a no-op."""
        owner = self._owner_key()
        state = self._held(owner)
        with state.mutex:
            if state.depth > 1:
                state.depth -= 1
                return
            if state.release_called:
                return
            state.release_called = True
        self._manager._renewals.remove(state)
        self._manager._forget_reentrant(state, owner)
        if state.status == Status.LOST:  # its keys were dropped when it was lost
            state.check()
        expired = state.expired()
        try:
            outcomes = yield from self._core.release(state)
        finally:
            self._manager._lines.notify(self._core.keys.channel(self.resource))
        taken = sum(1 for r in outcomes if r.outcome is Outcome.REFUSED)
        if expired or taken > self._core.n - self._core.quorum:
            why = ("its validity had run out" if expired
                   else f"{taken} of {self._core.n} nodes no longer held our key")
            raise LockLost(f"lock on {self.resource!r} was not held to the end ({why}): the"
                           " critical section may have run unprotected",
                           resource=self.resource, outcomes=outcomes)

    def _exit_flow(self, propagating: bool) -> Protocol[None]:
        """Leaving a ``with`` block: release; a lost lock raises unless another
        exception is already on its way (that one says more; the loss is logged)."""
        try:
            yield from self._release_flow()
        except LockLost as lost:
            if not propagating:
                raise
            logger.warning("redlock.lost_on_exit", resource=self.resource, reason=str(lost))

    def _extend_flow(self, ttl: float | None) -> Protocol[None]:
        state = self._held(self._owner_key())
        ttl = self.ttl if ttl is None else self._core.settings.check_ttl(ttl)
        yield from self._core.extend_or_lose(state, ttl)
        self._manager._renewals.rescheduled(state)

    def _observed(self, op: str, protocol: Protocol[T]) -> Protocol[T]:
        """The protocol, wrapped for OpenTelemetry when something records (§11.5)."""
        return observe(self._manager._telemetry, op, protocol, self,
                       self._core.amnesia.health)

    def _lost_flow(self, state: LockState) -> Protocol[None]:
        """Tell this handle's on_lost that ``state`` was lost while renewed."""
        if self.on_lost is None:
            return
        # The callback runs in a thread or task of its own, not in the owner's: let the
        # handle's token/lost/check() answer for the owner's acquisition in there.
        acting = _ACTING_FOR.set(state.holder())
        try:
            yield Invoke(self.on_lost, (self,))
        except Exception:
            logger.exception("redlock.on_lost_failed", resource=self.resource)
        finally:
            _ACTING_FOR.reset(acting)

    # -- bookkeeping -------------------------------------------------------------

    def _finish_acquire(self, result: AcquireResult, owner: Hashable) -> LockState | None:
        """Record a success, or build (and for outages raise) the failure."""
        if result.state is None:
            failure_type = QuorumUnavailable if result.unavailable else LockNotAcquired
            self.last_failure = failure_type(
                f"could not acquire {self.resource!r} after {result.attempts} attempt(s):"
                f" {result.reason}; {describe(result.outcomes)}",
                resource=self.resource, outcomes=result.outcomes)
            if result.unavailable:
                raise self.last_failure
            return None
        result.state.holder = weakref.ref(owner)
        with self._mutex:
            self._states[owner] = result.state
        if self.reentrant:
            self._manager._register_reentrant(result.state, owner)
        return result.state

    def _entered_failure(self) -> LockNotAcquired:
        return self.last_failure or LockNotAcquired(
            f"could not acquire {self.resource!r}", resource=self.resource)

    # -- the caller's own acquisition -------------------------------------------

    def _current(self) -> LockState | None:
        with self._mutex:
            return self._states.get(self._owner_key())

    def _held(self, owner: Hashable | None = None) -> LockState:
        with self._mutex:
            state = self._states.get(self._owner_key() if owner is None else owner)
        if state is None:
            raise NotHeld(f"{self.resource!r} is not held by this owner through this handle",
                          resource=self.resource)
        return state

    @property
    def token(self) -> int:
        """The fencing token; raises :class:`LockLost` once the lock is lost or expired."""
        state = self._held()
        state.check()
        return state.token

    @property
    def validity(self) -> float:
        """Seconds of validity left on a monotonic clock; 0 when not held."""
        state = self._current()
        return 0.0 if state is None else state.validity()

    @property
    def lost(self) -> bool:
        """True once the lock was lost (extend or the watchdog failed)."""
        state = self._current()
        return state is not None and state.status == Status.LOST

    def locked(self) -> bool:
        """True while the caller holds the lock and its validity has not run out (no
        I/O). Whether anyone holds the resource: the manager's ``is_locked(resource)``."""
        return self.validity > 0

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock was lost or its validity ran out."""
        self._held().check()

    def export(self) -> Handover:
        """Hand the caller's acquisition over: a value another process or manager passes
        to ``adopt()`` to hold, extend and release it (docs/design.md §5.6).

        Ownership moves: from now on this handle neither extends (its watchdog stops)
        nor releases (``release()`` sends nothing), and ``token``/``check()`` raise
        :class:`NotHeld`. Raises :class:`LockLost` if the lock is no longer valid.
        """
        owner = self._owner_key()
        state = self._held(owner)
        with state.mutex:
            if state.depth > 1:
                raise RedlockError(
                    f"{self.resource!r} is re-entered ({state.depth} levels): export it"
                    " from the outermost level only", resource=self.resource)
        value = export_state(state, self._core.keys.namespace)
        with state.mutex:
            if state.status != Status.HELD:  # lost meanwhile (the renewals)
                state.check()
            state.status = Status.HANDED_OVER
        self._manager._renewals.remove(state)
        self._manager._forget_reentrant(state, owner)
        return value

    def __repr__(self) -> str:
        state = self._current()
        status = "unlocked" if state is None else state.status
        return f"<{type(self).__name__} {self.resource!r} ttl={self.ttl:g}s {status}>"
