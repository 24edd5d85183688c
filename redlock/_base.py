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
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import structlog

from redlock._algorithm import RedlockCore
from redlock._decorator import F, make_decorator
from redlock._handover import Handover, as_handover, export_state
from redlock._handover import adopt as adopt_handover
from redlock._lines import LocalLines
from redlock._multi import MultiCore
from redlock._protocol import Invoke, Protocol, T, Wakeable
from redlock._rules import Settings, validate_resource, validate_timeout
from redlock._state import AcquireResult, LockState, Status
from redlock._telemetry import Telemetry, observe, observe_watchdog
from redlock.errors import (
    AlreadyHeld,
    LockNotAcquired,
    NotHeld,
    QuorumUnavailable,
    RedlockError,
    describe,
)

logger = structlog.get_logger(__name__)

H = TypeVar("H", bound="LockBase[Any]")
M = TypeVar("M", bound="ManagerBase[Any]")

# Set only while a watchdog runs on_lost (in its own thread or task): the handle then
# answers token/lost/check() for the lost acquisition instead of the caller's own.
_ACTING_FOR: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "redlock_acting_for", default=None)


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
        retry_delay_min, retry_delay_max: bounds of the jittered exponential backoff
            between attempts (a release by a handle of this manager wakes a waiter early).
        max_ttl: the largest TTL accepted, and how long an amnesiac node stays out
            before it is re-seeded and rejoins (every old lock has expired by then).
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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        settings = Settings(namespace=namespace, node_timeout=node_timeout,
                            drift_factor=drift_factor, retry_delay_min=retry_delay_min,
                            retry_delay_max=retry_delay_max, max_ttl=max_ttl)
        # The transport checks the node list; it opens no connection before first use,
        # so nothing leaks if anything below raises.
        self._transport = self._open_transport(nodes, settings.node_timeout)
        self._core = RedlockCore(self._transport.addresses, settings, clock)
        self._multi_core = MultiCore(self._core)
        self._telemetry = Telemetry.create(settings.namespace, self._core.n, self._core.quorum,
                                           tracer_provider, meter_provider)
        self._sleep = sleep
        self._lines: LocalLines[Any, Any] = LocalLines(self._new_event, self._new_turn)
        self._reentrant: dict[tuple[str, Hashable], LockState] = {}
        self._reentrant_mutex = threading.Lock()
        self._background: set[Any] = set()  # asyncio keeps only weak refs to tasks

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
        with handle._mutex:
            handle._states[owner] = state
        if handle.auto_extend:
            handle._start_watchdog(state, owner)
        return handle

    # -- reentrancy: per (resource, owner) across this manager's handles -------

    def _reenter(self, resource: str, owner: Hashable) -> LockState | None:
        """Re-enter a lock this owner (thread/task) already holds, without any I/O."""
        with self._reentrant_mutex:
            state = self._reentrant.get((resource, owner))
            if state is None:
                return None
            if state.status != Status.HELD:
                del self._reentrant[(resource, owner)]
                return None
        state.check()  # re-entering a lock whose validity ran out must not pass silently
        with state.mutex:
            state.depth += 1
        return state

    def _register_reentrant(self, state: LockState, owner: Hashable) -> None:
        with self._reentrant_mutex:
            self._reentrant[(state.resource, owner)] = state

    def _forget_reentrant(self, state: LockState) -> None:
        with self._reentrant_mutex:
            for key in [k for k, v in self._reentrant.items() if v is state]:
                del self._reentrant[key]


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
        self.auto_extend = bool(auto_extend)
        self.on_lost = on_lost
        self.reentrant = bool(reentrant)
        self.last_failure: LockNotAcquired | None = None
        self._states: dict[Hashable, LockState] = {}
        self._watchdog_stops: dict[LockState, Wakeable] = {}
        self._mutex = threading.Lock()

    def _owner_key(self) -> Hashable:
        acting_for = _ACTING_FOR.get()
        if acting_for is not None:  # inside on_lost: the handle shows the lost acquisition
            return acting_for
        return self._manager._current_owner()

    # -- the flows the shells drive -------------------------------------------

    def _acquire_flow(self, blocking: bool | None, timeout: float | None) -> Protocol[bool]:
        owner = self._owner_key()
        blocking = self.blocking if blocking is None else bool(blocking)
        timeout = self.timeout if timeout is None else validate_timeout(timeout)
        if self._reenter(owner):
            return True
        result = yield from self._core.acquire(self.resource, self.ttl, blocking=blocking,
                                               timeout=timeout)
        state = self._finish_acquire(result, owner)
        if state is None:
            return False
        if self.auto_extend:
            self._start_watchdog(state, owner)
        return True

    def _release_flow(self) -> Protocol[None]:
        state = self._prepare_release(self._owner_key())
        if state is None:
            return
        stop = self._watchdog_stops.pop(state, None)
        if stop is not None:
            stop.set()
        self._manager._forget_reentrant(state)
        try:
            yield from self._core.release(state)
        finally:
            self._manager._lines.notify(self._core.keys.channel(self.resource))

    def _extend_flow(self, ttl: float | None) -> Protocol[None]:
        state = self._held()
        ttl = self.ttl if ttl is None else self._core.settings.check_ttl(ttl)
        yield from self._core.extend_or_lose(state, ttl)

    def _start_watchdog(self, state: LockState, owner: Hashable) -> None:
        stop = self._watchdog_stops[state] = self._manager._new_event()
        self._manager._spawn(observe_watchdog(self._manager._telemetry,
                                              self._watchdog_flow(state, owner, stop),
                                              self, state),
                             f"redlock-watchdog:{self.resource}")

    def _observed(self, op: str, protocol: Protocol[T]) -> Protocol[T]:
        """The protocol, wrapped for OpenTelemetry when something records (§11.5)."""
        return observe(self._manager._telemetry, op, protocol, self,
                       self._core.amnesia.health)

    def _watchdog_flow(self, state: LockState, owner: Hashable,
                       stop: Wakeable) -> Protocol[None]:
        try:
            lost = yield from self._core.watchdog(state, stop)
        except Exception:
            # The watchdog itself failed: the holder must not go on believing.
            logger.exception("redlock.watchdog_crashed", resource=self.resource)
            lost = state.mark_lost("the auto-extend watchdog crashed")
        self._watchdog_stops.pop(state, None)
        if not lost:
            return
        self._manager._forget_reentrant(state)
        if self.on_lost is None:
            return
        # The callback runs in the watchdog's thread or task, not in the owner's: let
        # the handle's token/lost/check() answer for the owner's acquisition in there.
        acting = _ACTING_FOR.set(owner)
        try:
            yield Invoke(self.on_lost, (self,))
        except Exception:
            logger.exception("redlock.on_lost_failed", resource=self.resource)
        finally:
            _ACTING_FOR.reset(acting)

    # -- bookkeeping -------------------------------------------------------------

    def _reenter(self, owner: Hashable) -> bool:
        """True when the owner re-entered (no I/O); raises if it may not nest."""
        if self.reentrant:
            state = self._manager._reenter(self.resource, owner)
            if state is not None:
                with self._mutex:
                    self._states[owner] = state
                return True
        with self._mutex:
            state = self._states.get(owner)
        if state is not None and state.status == Status.HELD:
            raise AlreadyHeld(
                f"this owner already holds {self.resource!r} through this handle: release it"
                " first, or create the lock with reentrant=True to nest",
                resource=self.resource)
        return False

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
        with self._mutex:
            self._states[owner] = result.state
        if self.reentrant:
            self._manager._register_reentrant(result.state, owner)
        return result.state

    def _prepare_release(self, owner: Hashable) -> LockState | None:
        """The state to release on the nodes, or None (nested re-entry, or already done)."""
        with self._mutex:
            state = self._states.get(owner)
        if state is None:
            raise NotHeld(f"{self.resource!r} is not held by this owner through this handle",
                          resource=self.resource)
        with state.mutex:
            if state.depth > 1:
                state.depth -= 1
                return None
        return state if state.status == Status.HELD else None

    def _entered_failure(self) -> LockNotAcquired:
        return self.last_failure or LockNotAcquired(
            f"could not acquire {self.resource!r}", resource=self.resource)

    # -- the caller's own acquisition -------------------------------------------

    def _current(self) -> LockState | None:
        with self._mutex:
            return self._states.get(self._owner_key())

    def _held(self) -> LockState:
        state = self._current()
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
        """True while the caller holds the lock and its validity has not run out."""
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
        state = self._held()
        with state.mutex:
            if state.depth > 1:
                raise RedlockError(
                    f"{self.resource!r} is re-entered ({state.depth} levels): export it"
                    " from the outermost level only", resource=self.resource)
        value = export_state(state, self._core.keys.namespace)
        with state.mutex:
            if state.status != Status.HELD:  # lost meanwhile (the watchdog)
                state.check()
            state.status = Status.HANDED_OVER
        stop = self._watchdog_stops.pop(state, None)
        if stop is not None:
            stop.set()
        self._manager._forget_reentrant(state)
        return value

    def __repr__(self) -> str:
        state = self._current()
        status = "unlocked" if state is None else state.status
        return f"<{type(self).__name__} {self.resource!r} ttl={self.ttl:g}s {status}>"
