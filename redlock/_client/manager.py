"""The lock manager's part both clients share: everything but the flavour's transport,
listener, executor and backend, which the shells (:mod:`redlock.client`, :mod:`redlock.aio`)
name, with the public methods that block or await."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Generic, TypeVar

from redlock import _fork
from redlock._client import environment
from redlock._client.decorator import F, make_decorator
from redlock._client.handles import LockBase, MultiLockBase
from redlock._client.registry import Registry
from redlock._client.renewer import Renewer
from redlock._client.renewer import unavailable as renewer_unavailable
from redlock._client.telemetry import Telemetry, record_renewal
from redlock._client.waiting_room import WaitingRoom
from redlock._core.algorithm import RedlockCore
from redlock._core.amnesia.maintenance import maintenance
from redlock._core.handover import Handover, as_handover
from redlock._core.handover import adopt as adopt_handover
from redlock._core.renewals import Renewals
from redlock._core.requests import Flow
from redlock._core.settings import DEFAULT_MAX_TTL, Keys, Settings
from redlock._core.state import LockState
from redlock._io.endpoint import clusters, endpoints, labels, portable
from redlock._io.wakeups import WakeRegistry
from redlock._observe.log import get_logger

logger = get_logger("redlock.nodes")


class _Rebuilding:
    """Held while a manager rebuilds itself in a forked child (two threads of the child
    may use it first at once); made anew in every child, where a parent thread may
    have held it at the fork (redlock/_fork.py)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def after_fork(self) -> None:
        self.lock = threading.Lock()


_rebuilding = _Rebuilding()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_rebuilding.after_fork)


H = TypeVar("H", bound=LockBase)
MH = TypeVar("MH", bound=MultiLockBase)


@dataclass(frozen=True)
class Hooks:
    """A test's clock and sleep (docs/design.md §11.6; given by
    :func:`redlock.testing.manager`, never by the public constructor).

    ``clock``: a monotonic clock in seconds, read for every validity, deadline and backoff; with
    another than ``time.monotonic`` the renewals run in this process (the renewer process keeps
    ``time.monotonic``: redlock/_client/renewer.py, ``unavailable()``). ``sleep``: how the executor
    waits (a coroutine function for asyncio), honoured for every wait but one a signal ends; None:
    the real waits, in the local turns where a release wakes the first waiter."""

    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Any] | None = None


M = TypeVar("M", bound="ManagerBase[Any, Any]")


def with_hooks(cls: type[M], nodes: Iterable[Any], hooks: Hooks, options: Mapping[str, Any]) -> M:
    """A manager of class ``cls``, built as ``cls(nodes, **options)`` builds it but with
    a test's ``hooks``: the one way to a clock or sleep of one's own."""
    manager = cls.__new__(cls)
    manager._hooks = hooks  # read by __init__, before anything is built
    cls.__init__(manager, nodes, **options)
    return manager


class ManagerBase(Generic[H, MH]):
    """A distributed lock manager over N independent Redis masters.

    Args:
        nodes: URLs (``redis://host:port``, ``rediss://user:pass@host:port``) or
            redis-py clients (``Sentinel.master_for(service)`` clients too, named
            ``sentinel:<service>``), one per independent master, in any collection (a
            list, a tuple, a set: the order of a set is arbitrary, and node names in
            errors follow it). An odd N is best. A Redis Cluster is one node: a
            ``RedisCluster`` client, or a URL with ``?cluster=yes`` (docs/design.md
            §11.4).
        namespace: key prefix; keys are ``{namespace}:{{resource}}:lock`` (and the
            resource's waiting line) and ``{namespace}:node:fence`` (the node's one
            fence counter).
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
        max_ttl: the largest TTL accepted (default 60 s: hold longer with
            ``auto_extend``), and how long a node that lost its data stays out where
            its peers' lease horizons cannot bound it (docs/design.md §4.3.1).
        outage_timeout: a blocking acquire raises :class:`QuorumUnavailable` once the
            cluster has been unavailable (too few nodes answering, not contention) for
            this long, whatever its own timeout; None waits through outages.
        tracer_provider, meter_provider: OpenTelemetry providers to record spans and
            metrics with (needs the ``otel`` extra); by default the global ones, and
            nothing is recorded while those are OpenTelemetry's no-op defaults.
        replica_acks: a grant, commit or renewal on a node counts only once this many
            of the node's replicas have it (``WAIT``, docs/design.md §11.3): for nodes
            with replicas (Sentinel-managed), so that a primary cut off from them counts
            nothing. A node with fewer reachable replicas grants nothing. 0 (default):
            replicas are not asked."""

    _handle_class: type[H]
    _multi_handle_class: type[MH]
    # The flavour's pieces (redlock.client: threads; redlock.aio: asyncio).
    _backend_class: ClassVar[Any]
    _transport_class: ClassVar[Any]
    _listener_class: ClassVar[Any]
    _executor_class: ClassVar[Any]
    _renewer_class: ClassVar[type[Renewer]] = Renewer
    # A test's clock and sleep: the real ones, unless with_hooks() set others.
    _hooks: Hooks = Hooks()

    def __init__(self, nodes: Iterable[Any], *, namespace: str = "redlock",
                 node_timeout: float | None = None, connect_timeout: float = 1.0,
                 drift_factor: float = 0.01, retry_delay_min: float = 0.005,
                 retry_delay_max: float = 0.25, max_ttl: float = DEFAULT_MAX_TTL,
                 outage_timeout: float | None = 5.0, tracer_provider: Any = None,
                 meter_provider: Any = None, replica_acks: int = 0) -> None:
        settings = Settings(namespace=namespace, node_timeout=node_timeout,
                            connect_timeout=connect_timeout, drift_factor=drift_factor,
                            retry_delay_min=retry_delay_min, retry_delay_max=retry_delay_max,
                            max_ttl=max_ttl, outage_timeout=outage_timeout,
                            replica_acks=replica_acks)
        self._backend = self._backend_class()
        # The nodes, checked at the call site: where each is and how to log in (docs/
        # design.md §2.4). The transport opens no connection before first use, so nothing
        # leaks if anything below raises.
        self._endpoints = [replace(endpoint, replica_acks=settings.replica_acks)
                           for endpoint in endpoints(nodes)]
        self._addresses = labels(self._endpoints)
        self._transport = self._open_transport(settings)
        self._core = RedlockCore(self._addresses, settings, environment.real(self._hooks.clock),
                                 clusters(self._endpoints))
        self._telemetry = Telemetry.create(settings.namespace, self._core.n, self._core.quorum,
                                           tracer_provider, meter_provider)
        self._sleep = self._hooks.sleep
        self._closing = self._backend.new_event()  # set by close(): background work ends
        self._registry = Registry(self._core, self._telemetry, self._backend.current_owner,
                                  self._drive, self._spawn_flow)
        self._start_process_state()
        self._generation = _fork.generation  # a forked child rebuilds on first use

    def _open_transport(self, settings: Settings) -> Any:
        identify = Keys(settings.namespace).identify_command()
        return self._transport_class(self._endpoints, self._addresses,
                                     settings.connect_timeout, identify)

    def _open_listener(self, wakeups: WakeRegistry) -> Any:
        return self._listener_class(self._endpoints, self._addresses,
                                    self._core.settings.connect_timeout, wakeups)

    def _start_process_state(self) -> None:
        """What lives in one process only: the waiting room (local turns, release
        listener), the renewal loop, the reentrancy map, the background maintenance,
        the executor, and their events and thread locks (rebuilt in a forked child)."""
        backend = self._backend
        self._room = WaitingRoom(self._core, backend.new_event, backend.new_turn,
                                 self._open_listener, self._closing)
        self._maintaining = False
        self._maintenance_runner: Any = None  # its thread or task, awaited by close()
        self._maintenance_news = backend.new_event()  # a node newly needs it; close()
        self._maintenance_mutex = threading.Lock()
        self._executor = self._executor_class(self._transport, self._room, self._core,
                                              self._maintain, self._sleep)
        self._registry.start_process(self._open_renewals(), self._room.released,
                                     self._room.watch_every, backend.new_event, self._closing)

    def _open_renewals(self) -> Renewer | Renewals:
        """Where the renewal loop runs (docs/design.md §5.2): in the renewer, a process of the
        manager's own (bridged by the loop in this process while it starts); where that cannot run,
        in this process (and the first auto-extended lock says why)."""
        observe = functools.partial(record_renewal, self._telemetry)
        why = renewer_unavailable(self._core.clock)
        if why is None and not portable(self._endpoints):
            why = ("a node's settings cannot be sent to another process (a credential"
                   " provider of the application's own that does not pickle)")
        if why is not None:
            new_event, start_loop, lost = self._renewal_runner()
            return Renewals(self._core, new_event, start_loop, lost, observe,
                            closing=self._closing, in_process=why)

        def bridge(elsewhere: Callable[[LockState], bool],
                   dropped: Callable[[LockState], None]) -> Renewals:
            new_event, start_loop, lost = self._renewal_runner()

            def bridge_lost(state: LockState, handles: list[Any]) -> None:
                dropped(state)
                lost(state, handles)
            return Renewals(self._core, new_event, start_loop, bridge_lost, observe,
                            closing=self._closing, elsewhere=elsewhere)

        telemetry = self._telemetry
        return self._renewer_class(
            self._endpoints, self._core.settings, self._renewal_lost, observe,
            lambda: telemetry is not None and telemetry.instruments() is not None, bridge,
            functools.partial(self._core.membership.adopt, learnt=False))

    def _renewal_lost(self, state: LockState, handles: list[Any]) -> None:
        """The renewer lost ``state`` (told from its message thread): its handles are
        told as the flavour tells them."""
        self._registry.lost(state, handles)

    def _renewal_runner(self) -> tuple[Callable[[], Any], Callable[[Flow[None]], Any],
                                       Callable[[LockState, list[Any]], None]]:
        """How the renewal loop runs: the event that wakes it, how it is started (returns
        its thread or task) and who is told of a loss. Here the flavour's own way, in
        the background like the rest of its work (the asyncio client's differs)."""
        return (self._backend.new_event,
                lambda loop: self._spawn_flow(loop, "redlock-renewals"), self._registry.lost)

    def _drive(self, flow: Flow[Any]) -> Any:
        """Run a flow to its end (asyncio: an awaitable of its end) by the executor. (The
        shells' own, for the handles' calls, do the same.)"""
        self._in_this_process()
        return self._executor.drive(flow)

    def _spawn_flow(self, flow: Flow[None], name: str) -> Any:
        """Run a flow in the background, in a thread or task; returns it."""
        return self._backend.spawn(lambda: self._drive(flow), name)

    def _in_this_process(self) -> None:
        """Called first by every driven call and by close(): in a process forked since the
        manager was last used, rebuild what belongs to one process (redlock/_fork.py)."""
        if self._generation != _fork.generation:
            with _rebuilding.lock:
                if self._generation != _fork.generation:
                    self._after_fork()
                    self._generation = _fork.generation

    def _after_fork(self) -> None:
        """In a forked child (redlock/_fork.py): own connections, local turns, renewals and
        listener; the parent's acquisitions stay the parent's (its renewal loop keeps
        renewing them there, and the child neither renews nor releases them)."""
        closed = self._closing.is_set()
        self._backend = self._backend_class()
        self._closing = self._backend.new_event()
        if closed:
            self._closing.set()
        else:  # the parent's transport is the parent's: the child never touches its sockets
            _fork.keep_forever(self._transport)
            self._transport = self._open_transport(self._core.settings)
        self._core.after_fork()
        self._registry.current_owner = self._backend.current_owner
        self._start_process_state()

    # -- public ----------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' addresses, in the order given."""
        return self._core.addresses

    @property
    def quorum(self) -> int:
        """How many nodes make a majority: N // 2 + 1."""
        return self._core.quorum

    def lock(self, resource: str, ttl: float = 10.0, *, blocking: bool = True,
             timeout: float | None = None, auto_extend: bool = False,
             on_lost: Callable[[H], object] | None = None, reentrant: bool = False) -> H:
        """A lock handle for ``resource``; nothing is sent until it is acquired.

        Every duration is in seconds: ``ttl`` (default 10 s; at most the manager's ``max_ttl``) is
        how long the lock lives on the nodes unless extended, ``timeout`` the overall deadline of a
        blocking acquire (None: no deadline). A value of 1000 or more was probably meant in
        milliseconds and raises a :class:`DurationWarning` (``ttl=1000`` is 16.7 minutes;
        ``ttl=1.0`` is one second). ``blocking=False`` makes acquires a single attempt;
        ``auto_extend`` renews the lock in the background while held, ``on_lost`` is called once if
        that fails; ``reentrant`` lets the same thread (task) nest acquisitions."""
        return self._handle_class(self._registry, resource, ttl, blocking=blocking, timeout=timeout,
                                  auto_extend=auto_extend, on_lost=on_lost, reentrant=reentrant)

    def lock_many(self, resources: Iterable[str], ttl: float = 10.0, *, blocking: bool = True,
                  timeout: float | None = None, auto_extend: bool = False,
                  on_lost: Callable[[MH], object] | None = None) -> MH:
        """One lock over several resources, all or nothing, with a token per resource;
        no deadlock between overlapping sets (docs/design.md §11.2). Nothing is sent
        until it is acquired; the options are :meth:`lock`'s (not reentrant)."""
        return self._multi_handle_class(self._registry, resources, ttl, blocking=blocking,
                                        timeout=timeout, auto_extend=auto_extend, on_lost=on_lost)

    def locked(self, resource: str | Callable[..., str], ttl: float = 10.0, *,
               blocking: bool = True, timeout: float | None = None, auto_extend: bool = False,
               on_lost: Callable[[H], object] | None = None, reentrant: bool = False,
               pass_lock: str | None = None) -> Callable[[F], F]:
        """Decorator: each call of the function runs while holding ``resource``.

        ``resource`` is a name, or a function of the call's arguments that returns one
        (``lambda order_id, **_: f"order:{order_id}"``: one lock per order). The other
        options are :meth:`lock`'s. A lock that cannot be had raises
        :class:`LockNotAcquired` (like ``with lock:``) and the function does not run.
        ``pass_lock="held"`` hands the held lock to the function as the keyword argument
        ``held`` (declare it, e.g. ``*, held: Lock | None = None``) to read its token,
        extend it or check it. Recursive functions need ``reentrant=True``.

        ``Redlock.locked`` takes plain functions, ``AsyncRedlock.locked`` coroutine
        functions; the other kind, and generator functions, raise ``TypeError`` here."""
        options = {"ttl": ttl, "blocking": blocking, "timeout": timeout,
                   "auto_extend": auto_extend, "on_lost": on_lost, "reentrant": reentrant}
        return make_decorator(self, resource, options, pass_lock,
                              asynchronous=self._backend_class.asynchronous)

    def _adopt_flow(self, handover: Handover | Mapping[str, Any] | str | bytes,
                    auto_extend: bool, on_lost: Callable[[H], object] | None) -> Flow[H]:
        """Take over an exported acquisition (docs/design.md §5.6) in a new handle that
        the calling owner (thread or task) holds."""
        value = as_handover(handover)
        handle = self._handle_class(self._registry, value.resource, value.ttl,
                                    auto_extend=auto_extend, on_lost=on_lost)
        owner = handle._owner_key()
        state = yield from adopt_handover(self._core, value)
        handle._hold(state, owner)
        if handle.auto_extend:
            self._registry.renewals.add(state, handle)
        return handle

    # -- background maintenance of the nodes (redlock/_core/amnesia/) -----------

    def _maintain(self) -> None:
        """Start judging restarted nodes and repairing amnesiac ones in the background
        (never on an acquire's path), unless nothing needs it; if it runs already and a
        node newly needs it, wake it (it may be waiting for another node's repair)."""
        if self._core.amnesia.health.quiet() or self._closing.is_set():
            return
        with self._maintenance_mutex:
            if self._maintaining:
                if self._core.amnesia.health.news:
                    self._maintenance_news.set()
                return
            self._maintaining = True
        self._maintenance_runner = self._spawn_flow(self._maintenance_flow(),
                                                    "redlock-maintenance")

    def _stop_background(self) -> tuple[Any, ...]:
        """The start of close(): the maintenance and the renewal loop are told to stop (after the
        current step, or round); returns their threads or tasks to wait for (None: not running)."""
        self._in_this_process()  # in a forked child: nothing of the parent's is closed
        self._closing.set()
        self._maintenance_news.set()  # a waiting maintenance stops at once
        self._room.wakeups.wake_all()  # so do the calls waiting for a release
        renewals = self._registry.renewals
        renewals.stop()  # and so does the renewal loop, after its current round
        return self._maintenance_runner, renewals.runner

    def _close_grace(self) -> float:
        """How long close() lets a running maintenance finish its step: a repair cut
        short would leave its claim on the node (30 repair_timeouts), and no other
        client could repair that node meanwhile."""
        return 2 * self._core.settings.repair_timeout

    def _maintenance_flow(self) -> Flow[None]:
        health = self._core.amnesia.health
        try:
            yield from maintenance(self._core.amnesia, self._closing, self._maintenance_news)
        except Exception:
            logger.exception("redlock.maintenance_crashed")
        finally:
            with self._maintenance_mutex:
                self._maintaining = False
                # Ended with work left (it crashed, or a node newly needed it as it ended): the
                # next call's end starts it again (the executors look at ``news`` only).
                if health.pending() and not self._closing.is_set():
                    health.news = True

