"""The lock manager's part that the sync and asyncio clients share: all but waiting
and socket I/O.

:class:`ManagerBase` holds the settings, the algorithm (:class:`RedlockCore`), the
local lines, the renewal loop and the reentrancy registry, and makes handles
(:mod:`redlock._client.handles`). The shells (:mod:`redlock.client`, :mod:`redlock.aio`) add
only a transport, a driver and how they wait.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from redlock import _fork
from redlock._client.decorator import F, make_decorator
from redlock._client.handles import LockBase, MultiLockBase
from redlock._client.lines import LocalLines, Ticket
from redlock._client.telemetry import Telemetry, record_renewal
from redlock._core import inspect as _inspect
from redlock._core.algorithm import RedlockCore
from redlock._core.handover import Handover, as_handover
from redlock._core.handover import adopt as adopt_handover
from redlock._core.renewals import Renewals
from redlock._core.requests import Protocol, Sleep, Wakeable
from redlock._core.rules import Settings, validate_resource
from redlock._core.state import LockState, Status
from redlock._io.wakeups import WakeRegistry, Watch
from redlock._observe.log import get_logger

logger = get_logger("redlock.nodes")

H = TypeVar("H", bound=LockBase[Any])
MH = TypeVar("MH", bound=MultiLockBase[Any])


class ManagerBase(Generic[H, MH]):
    """A distributed lock manager over N independent Redis masters.

    Args:
        nodes: URLs (``redis://host:port``, ``rediss://user:pass@host:port``) or
            redis-py clients (``Sentinel.master_for(service)`` clients too, named
            ``sentinel:<service>``), one per independent master, in any collection (a
            list, a tuple, a set: the order of a set is arbitrary, and node names in
            errors follow it). An odd N is best. Redis Cluster clients are refused.
        namespace: key prefix; keys are ``{namespace}:{{resource}}:lock`` / ``:fence``.
        node_timeout: seconds a request waits for the nodes' replies; unset, it adapts
            to each node's measured round-trip time (twice the estimate of the
            quorum-th fastest node, at least 50 ms, at most a fifth of the TTL), from
            loopback to cross-region. A request ends earlier once its replies decide
            it (a quorum granted, or can no longer grant); late replies are read in
            the background.
        connect_timeout: seconds a new connection may take to connect and handshake.
            It is opened in the background: a request waits for it only until its
            own deadline, and the connection joins the pool when ready.
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
    _multi_handle_class: type[MH]
    _asynchronous = False  # the asyncio shell's handles are awaited

    def __init__(
        self,
        nodes: Iterable[Any],
        *,
        namespace: str = "redlock",
        node_timeout: float | None = None,
        connect_timeout: float = 1.0,
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
                            connect_timeout=connect_timeout,
                            drift_factor=drift_factor, retry_delay_min=retry_delay_min,
                            retry_delay_max=retry_delay_max, max_ttl=max_ttl,
                            outage_timeout=outage_timeout)
        # The transport checks the node list; it opens no connection before first use,
        # so nothing leaks if anything below raises.
        self._transport = self._open_transport(nodes, settings.connect_timeout)
        self._core = RedlockCore(self._transport.addresses, settings, clock)
        self._telemetry = Telemetry.create(settings.namespace, self._core.n, self._core.quorum,
                                           tracer_provider, meter_provider)
        self._sleep = sleep
        self._closing = self._new_event()  # set by close(): background work ends
        self._start_process_state()
        self._generation = _fork.generation  # a forked child rebuilds on first use

    def _start_process_state(self) -> None:
        """What lives in one process only: the transport's wiring, the local lines, the
        reentrancy registry, the renewal loop, the release listener, the background
        maintenance and their events and thread locks (rebuilt in a forked child)."""
        self._transport.round_trips = self._core.round_trips
        self._transport.identify = self._core.amnesia.identify_call
        self._transport.identified = self._core.amnesia.identified
        self._lines: LocalLines[Any, Any] = LocalLines(self._new_event, self._new_turn)
        # Per owner (a thread or task, held weakly: a finished one takes its entries
        # along), the acquisitions it may re-enter, by resource.
        self._reentrant: weakref.WeakKeyDictionary[Any, dict[str, LockState]] = (
            weakref.WeakKeyDictionary())
        self._reentrant_mutex = threading.Lock()
        self._background: set[Any] = set()  # asyncio keeps only weak refs to tasks
        self._maintaining = False
        self._maintenance_runner: Any = None  # its thread or task, awaited by close()
        self._maintenance_news = self._new_event()  # a node newly needs it; close()
        self._maintenance_mutex = threading.Lock()
        # Releases anywhere wake waiters here (docs/design.md §6): the subscriptions are
        # opened when a blocking acquire first waits.
        self._wakeups = WakeRegistry(changed=lambda: self._listener and self._listener.poke())
        self._listener: Any = None
        self._renewals = Renewals(self._core, self._new_event,
                                  lambda loop: self._spawn(loop, "redlock-renewals"),
                                  self._notify_lost,
                                  functools.partial(record_renewal, self._telemetry),
                                  closing=self._closing)

    def _in_this_process(self) -> None:
        """Called first by every driven call and by close(): in a process forked since the
        manager was last used, rebuild what belongs to one process (redlock/_fork.py)."""
        if self._generation != _fork.generation:
            with _fork.rebuilding:
                if self._generation != _fork.generation:
                    self._after_fork()
                    self._generation = _fork.generation

    def _after_fork(self) -> None:
        """In a forked child (redlock/_fork.py): own connections, lines, renewals and
        listener; the parent's acquisitions stay the parent's (its renewal loop keeps
        renewing them there, and the child neither renews nor releases them)."""
        closed = self._closing.is_set()
        self._closing = self._new_event()
        if closed:
            self._closing.set()
        else:  # the parent's transport is the parent's: the child never touches its sockets
            _fork.keep_forever(self._transport)
            self._transport = self._open_transport(self._transport.items,
                                                   self._core.settings.connect_timeout)
        self._core.after_fork()
        self._start_process_state()

    # -- what each shell provides ----------------------------------------------

    def _open_transport(self, nodes: Iterable[Any], connect_timeout: float) -> Any:
        raise NotImplementedError

    def _new_event(self) -> Wakeable:
        raise NotImplementedError

    def _new_turn(self) -> Any:
        raise NotImplementedError

    def _current_owner(self) -> Hashable:
        raise NotImplementedError

    def _spawn(self, protocol: Protocol[None], name: str) -> Any:
        """Run a protocol in the background; returns its thread, or task."""
        raise NotImplementedError

    def _open_listener(self) -> Any:
        """The release listener of the shell's flavour (see :mod:`redlock._io.wakeups`)."""
        raise NotImplementedError

    # -- waiting for a release (used by the shells' waits) ---------------------

    def _watch_releases(self, request: Sleep, ticket: Ticket[Any]) -> float:
        """From an acquire call's first wait to its end (:meth:`_end_call`), a release
        on the request's channels wakes it (``ticket.wake``). Returns how long to wait:
        the patient wait once releases on every channel are heard."""
        if (ticket.watch is None and ticket.wake is not None and request.channels
                and not self._closing.is_set()):
            ticket.watch = self._wakeups.watch(request.channels, request.waiter, ticket.wake,
                                               since=ticket.since)
            with self._maintenance_mutex:  # one listener, even when threads race here
                if self._listener is None:
                    self._listener = self._open_listener()
                listener = self._listener
            listener.ensure_running()
        if ticket.watch is not None and request.patient is not None and all(
                self._wakeups.live(channel) for channel in request.channels):
            return request.patient
        return request.seconds

    def _end_call(self, ticket: Ticket[Any]) -> None:
        """A driven call is over: leave the local line, stop watching for releases."""
        self._lines.leave(ticket)
        if isinstance(ticket.watch, Watch):
            self._wakeups.unwatch(ticket.watch)
            ticket.watch = None

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

    def lock_many(
        self,
        resources: Iterable[str],
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_extend: bool = False,
        on_lost: Callable[[MH], object] | None = None,
    ) -> MH:
        """One lock over several resources, all or nothing, with a token per resource;
        no deadlock between overlapping sets (docs/design.md §11.2). Nothing is sent
        until it is acquired; the options are :meth:`lock`'s (not reentrant)."""
        return self._multi_handle_class(self, resources, ttl, blocking=blocking,
                                        timeout=timeout, auto_extend=auto_extend,
                                        on_lost=on_lost)

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
        handle._hold(state, owner)
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

    # -- background maintenance of the nodes (redlock/_amnesia.py) --------------

    def _maintain(self) -> None:
        """Start judging restarted nodes and repairing amnesiac ones in the background
        (never on an acquire's path), unless nothing needs it; if it runs already and a
        node newly needs it, wake it (it may be waiting for another node's repair)."""
        if not self._core.amnesia.needs_maintenance() or self._closing.is_set():
            return
        with self._maintenance_mutex:
            if self._maintaining:
                if self._core.amnesia.health.news:
                    self._maintenance_news.set()
                return
            self._maintaining = True
        self._maintenance_runner = self._spawn(self._maintenance_flow(),
                                               "redlock-maintenance")

    def _close_grace(self) -> float:
        """How long close() lets a running maintenance finish its step: a repair cut
        short would leave its claim on the node (30 repair_timeouts), and no other
        client could repair that node meanwhile."""
        return 2 * self._core.settings.repair_timeout

    def _maintenance_flow(self) -> Protocol[None]:
        try:
            yield from self._core.amnesia.maintenance(self._closing, self._maintenance_news)
        except Exception:
            logger.exception("redlock.maintenance_crashed")
        finally:
            with self._maintenance_mutex:
                self._maintaining = False

    def _notify_released(self, state: LockState) -> None:
        """Wake this manager's local waiters for what ``state`` held, unless the
        release's own message does (a subscribed channel: the message wakes the first
        in the nodes' line, wherever it waits; waking the first local waiter as well
        would cost an attempt whenever that is not the same waiter)."""
        line = self._core.line(state.resources)
        if len(state.resources) > 1 or not self._wakeups.live(line):
            self._lines.notify(line)  # a set's local line has no channel of its own
        if len(state.resources) > 1:  # waiters for a single resource of the set, too
            for resource in state.resources:
                channel = self._core.keys.channel(resource)
                if not self._wakeups.live(channel):
                    self._lines.notify(channel)

    def _notify_lost(self, state: LockState, handles: list[Any]) -> None:
        """The renewals lost ``state``: tell each handle, each in a thread/task of its own
        (a slow callback must not hold up the renewal of other locks)."""
        for handle in handles:
            if handle.on_lost is not None:
                self._spawn(handle._lost_flow(state), f"redlock-on-lost:{state.resource}")
