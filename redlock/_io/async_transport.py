"""The asyncio transport (docs/design.md §2.4): a node with an open connection gets its
commands written at once, in the caller's task, its replies parsed as they arrive by the
connection's protocol (:mod:`redlock._io.async_wire`); a node without one gets a task that
opens one, then does the same. The request returns once its replies decide it or at its
deadline; the exchanges it did not wait for (or that a cancellation left) go on within the
connection's budget (``connect_timeout``), so the connection is kept, and an acquire still
unanswered gets its release written behind it (:mod:`redlock._io.wire`).

Per request and target (a node, or a cluster node's master: :mod:`redlock._io.routing`) an
:class:`Exchange`, per request a :class:`Gathering`, per target the :class:`Slots` for new
connections, per event loop one timer for every request's deadline (:class:`Deadlines`). A
cluster node's calls go to the master of their hash slot; redirects are followed as new
exchanges of the request."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from redlock._core.requests import Broadcast, Call, CommandArg, Replies
from redlock._io import resp, wire
from redlock._io.async_wire import IGNORE, Wire, open_wire, readable_wires
from redlock._io.endpoint import Endpoint
from redlock._io.failures import CLOSED, NoReply, NotSent, Unreachable, as_failure, map_failures
from redlock._io.routing import UNROUTED, Routes, slot_map_command
from redlock._io.wire import (
    ASKING,
    DONE,
    FRESH,
    IDENTIFIED,
    NOT_AWAITED,
    PENDING,
    RESEND,
    SENT_LATE,
    SERVER_PROBE,
    Late,
    LateConnections,
    Packing,
    Refusals,
    Silence,
    acquire_keys,
    exchanges_of,
    fill_pending,
    follow,
    late_sendable,
    render,
    run_of,
    with_run,
)
from redlock._scripts import lock as scripts

T = TypeVar("T")

# At a request's deadline, a reply may already sit in a socket or a stream buffer that a
# busy event loop has not got round to (a coroutine doing CPU work delays every callback):
# that reply arrived in time. Before calling the node late, the request lets the loop run
# this many more turns while such replies wait to be read.
_LAST_TURNS = 8


async def within(awaitable: Awaitable[T], timeout: float) -> T:
    """``asyncio.wait_for`` without its extra Task per call: ``asyncio.timeout`` (3.11+)
    cancels the current task in place."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)  # pragma: no cover (3.10)


async def wait_event(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set or ``seconds`` passed, whichever comes first."""
    if seconds <= 0 or event.is_set():
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await within(event.wait(), seconds)


# New connections opening at once per target, so that a hung one does not collect sockets.
# An exchange beyond this waits for a slot or a connection given back, within its budget:
# never failing at once, a healthy node under a burst serves every request (see Slots).
OPENING_PER_TARGET = 16


class Exchange(wire.Exchange):
    """One node's calls of one request on a :class:`~redlock._io.async_wire.Wire`, which
    hands it their replies in order (:meth:`take_reply`); it tells ``on_done`` once each
    call has its result. It may outlive its request (``over``), within its budget."""

    __slots__ = ("late", "on_done", "over", "started")

    def __init__(self, node: int, replies: Replies | None, index: int, call: Call,
                 lane: str | None = None) -> None:
        super().__init__(node, replies, index, call, lane)
        self.started = 0.0  # when its request began: its budget (connect_timeout) counts
        self.over = False  # the request stopped waiting for it
        self.late: Any = None  # its Late entry (a release goes behind its acquires)
        self.on_done: Callable[[Exchange], None] | None = None

    def take_reply(self, reply: object) -> None:
        """The next reply of its calls (an error that ended the connection: every call
        still without a result gets it)."""
        conn = self.conn
        if not conn.alive and isinstance(reply, BaseException):
            self.fail(reply)
            return
        self.heard = True
        state = self.take(reply)
        if state == DONE:
            if self.on_done is not None:
                self.on_done(self)
        elif state == RESEND:  # SCRIPT FLUSH since: the bodies go
            try:
                conn.send(self.bodies(), self.take_reply, self.resent())
            except Exception as exc:
                self.fail(exc)
        elif state == IDENTIFIED:
            # An error (a server still loading its data: LOADING) identifies nothing: the
            # connection is asked again on its next request (docs/design.md §4.4).
            conn.identified = not isinstance(reply, BaseException)
            if self.routed:
                conn.run = run_of(reply) if conn.identified else None

    def fail(self, exc: BaseException) -> None:
        """Every call still without a result gets ``exc``; the exchange is done."""
        if not self.done:
            super().fail(exc)
            if self.on_done is not None:
                self.on_done(self)

    def finish(self) -> None:
        """Done without (more) replies: nothing was sent, or nothing will be."""
        if not self.done:
            self.done = True
            if self.on_done is not None:
                self.on_done(self)

    def needless(self) -> bool:
        """Its request is over and not all of its calls may be sent late (see
        redlock._io.wire.late_sendable): nothing will be sent."""
        return self.over and not all(late_sendable(call) for call in self.calls)

    def releases_late(self) -> bool:
        """Final releases still waiting for a connection when their request ended: they
        go out once it is open (an extend that did not get through in time failed)."""
        return self.conn is None and not self.needless() and all(
            call.script is scripts.RELEASE for call in self.calls)

    def reply_waiting(self) -> bool:
        """Its next reply is already here (in the socket) but the event loop has not
        handed it to the exchange yet."""
        return self.conn is not None and self.conn.readable()


class Slots:
    """The new connections opening to one target (at most OPENING_PER_TARGET at once), and the
    exchanges waiting to open one. A freed slot, or a connection given back, wakes one waiter:
    first requests still waiting that are no acquire (a holder's renewal must not queue behind a
    burst of new acquires until its validity runs out), then acquires still waiting, then requests
    that are over. An acquire whose request is over stops waiting: it would send nothing."""

    def __init__(self) -> None:
        self.free = OPENING_PER_TARGET
        # The waiters in arrival order (dicts: one leaves in O(1)). ``droppable``: those that send
        # nothing once their request is over (acquires), the only ones wake_over looks at: a hung
        # node collects a final release per request, too many to scan at every request's end.
        self.waiting: dict[asyncio.Future[None], Exchange] = {}
        self.droppable: dict[asyncio.Future[None], Exchange] = {}

    def add(self, exchange: Exchange, future: asyncio.Future[None]) -> None:
        self.waiting[future] = exchange
        if not all(late_sendable(call) for call in exchange.calls):
            self.droppable[future] = exchange

    def remove(self, future: asyncio.Future[None]) -> None:
        self.waiting.pop(future, None)
        self.droppable.pop(future, None)

    @staticmethod
    def _rank(waiter: tuple[asyncio.Future[None], Exchange]) -> int:
        exchange = waiter[1]
        if exchange.over:
            return 2
        return 1 if any(acquire_keys(call) for call in exchange.calls) else 0

    def wake_one(self) -> None:
        if not self.waiting:
            return
        future, _ = min(self.waiting.items(), key=self._rank)  # the earliest of the best
        self.remove(future)
        wake(future)

    def wake_over(self) -> None:
        """Requests ended: their acquires waiting here give up (see Exchange.needless)."""
        for future, _ in [w for w in self.droppable.items() if w[1].needless()]:
            self.remove(future)
            wake(future)


def wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# A loop that ran this late is running late (below: scheduling noise).
LAG_NOTICED = 0.005
# How fast a loop's lateness is forgotten once it runs on time again.
LAG_HALF_LIFE = 1.0


class Deadlines:
    """The deadlines of one transport's requests on one event loop, behind one timer
    armed for the earliest (a timer per request costs every request a handle, a heap push
    and a cancel, though almost all are answered long before their deadline)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: set[Gathering] = set()
        self.timer: asyncio.TimerHandle | None = None
        self.at = float("inf")  # when the timer fires (time.monotonic())
        # How late the loop has run lately (its own work delays every callback): the
        # largest lateness seen, halving every LAG_HALF_LIFE seconds (docs/design.md §2.4).
        self._lag = 0.0
        self._lag_at = 0.0

    def lag(self, now: float) -> float:
        """How late this loop has been running lately, in seconds."""
        lag = self._lag
        if lag:
            lag *= 0.5 ** ((now - self._lag_at) / LAG_HALF_LIFE)
            if lag < LAG_NOTICED:
                lag = self._lag = 0.0
        return lag

    def late(self, seconds: float, now: float) -> None:
        """A callback of this loop ran ``seconds`` after it was due."""
        if seconds >= LAG_NOTICED and seconds > self.lag(now):
            self._lag, self._lag_at = seconds, now

    def add(self, gathering: Gathering) -> None:
        """Wake ``gathering`` at its deadline (again: after its deadline moved earlier)."""
        self.waiting.add(gathering)
        if gathering.deadline < self.at:
            self._arm(gathering.deadline)

    def remove(self, gathering: Gathering) -> None:
        # The timer stays: when it fires with nobody due, it re-arms or stops.
        self.waiting.discard(gathering)

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.at = at
        self.timer = self.loop.call_later(max(at - time.monotonic(), 0.0), self._fire)

    def _fire(self) -> None:
        now, earliest = time.monotonic(), float("inf")
        self.late(now - self.at, now)
        self.timer, self.at = None, float("inf")
        for gathering in list(self.waiting):
            if gathering.deadline <= now:
                self.waiting.discard(gathering)
                wake(gathering.wake)
            elif gathering.deadline < earliest:
                earliest = gathering.deadline
        if earliest != float("inf"):
            self._arm(earliest)


class Gathering(wire.Gathering):
    """The replies of one request as its exchanges finish, and the future that wakes the
    request: every exchange done, a first request's timeout learnt, or the deadline. A
    decision (early quorum) wakes nobody: it moves the deadline to the stragglers' grace
    (one task step less per request)."""

    __slots__ = ("armed", "deadlines", "exchanges", "left", "loop", "wake")

    def __init__(self, loop: asyncio.AbstractEventLoop, request: Broadcast, replies: Replies,
                 started: float, deadline: float, deadlines: Deadlines,
                 exchanges: list[Exchange], silence: Silence) -> None:
        super().__init__(request, replies, started, deadline, silence)
        self.loop = loop
        self.deadlines = deadlines  # its transport's timer on this loop
        self.exchanges = exchanges
        self.left = len(exchanges)  # exchanges not finished
        self.wake: asyncio.Future[None] = loop.create_future()
        self.armed = False

    def stragglers(self) -> Iterable[int]:
        return (exchange.target for exchange in self.exchanges if not exchange.done)

    def arm(self) -> None:
        """Wake the request at its deadline."""
        self.armed = True
        self.deadlines.add(self)

    def disarm(self) -> None:
        if self.armed:
            self.armed = False
            self.deadlines.remove(self)

    def finished(self, exchange: Exchange) -> None:
        self.left -= 1
        if exchange.heard:
            self.silence.heard(exchange.target)
        if self.wake.done():
            return
        if self.left == 0 or (self.learn and len(self.replies.round_trips) >= self.learn):
            self.wake.set_result(None)
        elif self.enough is not None and self.decide(self.stragglers):
            self.wake.set_result(None)  # (every straggler is silent)
        elif self.decided and self.armed:  # the request waits: at the new deadline now
            self.arm()


class AsyncTransport:
    """The nodes' connections; each request's nodes asked concurrently."""

    def __init__(self, endpoints: list[Endpoint], addresses: list[str], connect_timeout: float,
                 identify: tuple[CommandArg, ...] | None = None) -> None:
        self.identify = identify  # sent first on every new connection (§4.4)
        self._probe = resp.pack_one(identify) if identify is not None else None
        self.endpoints = list(endpoints)
        self.addresses = list(addresses)
        self.connect_timeout = connect_timeout  # a connection's budget: open, log in
        # The targets: the nodes, then cluster nodes' masters as they are found (_grow).
        self._routes = Routes(self.endpoints, self._grow)
        self._targets = self._routes.endpoints
        self._acks = [endpoint.replica_acks for endpoint in self._targets]
        count = len(self._targets)
        self._late: LateConnections[Any] = LateConnections(count)
        self._silence = Silence(count)  # the targets that stopped answering
        self._refusals = Refusals(count)  # the targets refusing connections
        self._running: set[asyncio.Task[None]] = set()
        self._slots = [Slots() for _ in range(count)]
        self._idle: list[list[Wire]] = [[] for _ in range(count)]  # per target, open and free
        self._lanes: dict[str, list[list[Wire]]] = {}  # lane -> per target, its connections
        self._wires: set[Wire] = set()  # every open connection (close() closes them)
        self._closed = False
        self._deadlines: Deadlines | None = None  # the requests' timer (on their loop)
        self._reading: dict[int, asyncio.Future[None]] = {}  # hash slot maps being read

    async def broadcast(self, request: Broadcast) -> Replies:
        """Every call's reply or exception (NOT_AWAITED for those the request was
        decided without). Calls for one node share one connection and one write."""
        if self._closed:  # a call, or a background flow, racing the manager's close
            await asyncio.sleep(0)  # (a caller retrying at once must not hold up the loop)
            return Replies([as_failure(Unreachable(CLOSED))] * len(request.calls))
        routes = self._routes
        if routes.clustered:  # each cluster node's hash slot map, read if unknown
            unknown, stale = routes.unread(request.calls)
            until = time.monotonic() + request.timeout
            for node in unknown:  # (within the request's deadline: a failure leaves its
                await self._read_map(node, until)  # calls unrouted)
            if stale:
                self._refresh()
        replies = Replies([PENDING] * len(request.calls))
        exchanges = exchanges_of(request.calls, replies, request.lane, Exchange,
                                 request.timeout, routes)
        if self._late.total:  # releases go behind unanswered acquires of their lock value
            self.write_behind(request)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        deadlines = self._deadlines
        if deadlines is None or deadlines.loop is not loop:
            deadlines = self._deadlines = Deadlines(loop)
        lag = deadlines.lag(started)  # a late loop is not a slow node (§2.4)
        gathering = Gathering(loop, request, replies, started, started + request.timeout + lag,
                              deadlines, exchanges, self._silence)
        packing = Packing(request)
        wires = self._idle_wires(exchanges)  # written here; the others: a task each
        refused: list[tuple[Exchange, BaseException]] = []
        finished = self._follow(gathering) if routes.clustered else gathering.finished
        for exchange in exchanges:
            exchange.started = started
            exchange.on_done = finished
            conn = wires.get(exchange.target)
            if conn is not None:
                self._send(exchange, conn, packing)
                continue
            error = self._refused(exchange, started)
            if error is not None:  # it failed a moment ago: fails the same way, at once
                refused.append((exchange, error))  # (after the others are written)
                continue
            self._open(exchange)
        for exchange, error in refused:
            exchange.fail(error)
        last_turns = _LAST_TURNS
        owed = True  # a request woken late at its deadline gets that time again, once
        try:
            # Not one wake-up per reply: the gathering wakes this task (see Gathering).
            while gathering.left:
                if (not gathering.decided and gathering.left < len(exchanges)
                        and gathering.enough is not None):
                    gathering.decide(gathering.stragglers)
                if gathering.learn:  # a first request: its timeout from its own replies
                    gathering.learnt()
                now = time.monotonic()
                left = gathering.deadline - now
                if left <= 0:
                    # A reply already here but not yet read (a busy loop) came in time.
                    if last_turns and any(exchange.reply_waiting() for exchange
                                          in exchanges if not exchange.done):
                        last_turns -= 1
                        await asyncio.sleep(0)
                        continue
                    # Woken this late by the loop's own work: the exchanges get that
                    # time again, once.
                    if owed and -left >= LAG_NOTICED and not gathering.decided:
                        owed = False
                        deadlines.late(-left, now)
                        lag = max(lag, -left)
                        gathering.deadline = now - left
                        continue
                    break
                if gathering.wake.done():
                    gathering.wake = loop.create_future()
                    continue  # re-check: what woke us may have decided it
                gathering.arm()
                await gathering.wake
        finally:
            gathering.disarm()
            if gathering.left:  # (else every exchange is done: nothing goes on)
                self._end(request, exchanges, replies, gathering.deadline - started, lag)
        for reply in replies:  # (errors as the library's, only when there are some)
            if isinstance(reply, BaseException):
                map_failures(replies)
                break
        return replies

    def _refused(self, exchange: Exchange, now: float) -> BaseException | None:
        """Why the exchange fails at once: its target refused a moment ago, or it is a
        cluster node's call whose hash slot has no known master; else None."""
        if exchange.target == UNROUTED:
            return Unreachable(self._routes.unrouted(exchange.node))
        return self._refusals.refusing(exchange.target, now)

    def _open(self, exchange: Exchange) -> None:
        """A task connects, then writes the exchange."""
        task = asyncio.get_running_loop().create_task(self._exchange(exchange))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    # -- cluster nodes ---------------------------------------------------------------

    def _follow(self, gathering: Gathering) -> Callable[[Exchange], None]:
        """A routed request's exchanges end here: the calls a cluster redirected go again
        as new exchanges of the request (redlock._io.wire.follow), written at once or
        after TRYAGAIN's wait, before the gathering is told."""
        def finished(exchange: Exchange) -> None:
            if exchange.redirected and not self._closed:
                loop = gathering.loop
                now = time.monotonic()
                for at, follower in follow(exchange, self._routes, Exchange, now,
                                           gathering.deadline):
                    follower.started = exchange.started
                    follower.on_done = finished
                    gathering.exchanges.append(follower)
                    gathering.left += 1
                    if at <= now:
                        self._start(follower)
                    else:
                        loop.call_later(at - now, self._start, follower)
                if self._routes.stale():
                    self._refresh()
            gathering.finished(exchange)
        return finished

    def _start(self, exchange: Exchange) -> None:
        """An exchange joining its request late (a redirect followed)."""
        if exchange.done:
            return
        if exchange.over and exchange.needless():  # its request ended meanwhile
            exchange.finish()
            return
        error = self._refused(exchange, time.monotonic())
        if error is not None:
            exchange.fail(error)
            return
        wire = self._kept(exchange.target, exchange.lane, checked=True)
        if wire is None and exchange.lane is not None:
            wire = self._kept(exchange.target, checked=True)
        if wire is not None:
            self._send(exchange, wire)
        else:
            self._open(exchange)

    async def _read_map(self, node: int, until: float) -> None:
        """Read cluster node ``node``'s hash slot map from its masters or the server it was
        given as, whichever answers first (requests of this loop read it one at a time:
        a reading under way is waited for)."""
        routes = self._routes
        reading = self._reading.get(node)
        if reading is not None and not reading.done():
            with contextlib.suppress(Exception):
                await within(asyncio.shield(reading), max(until - time.monotonic(), 0.0))
            return
        reading = self._reading[node] = asyncio.get_running_loop().create_future()
        try:
            for source, left in routes.readings(node, until, self.connect_timeout):
                if self._closed:
                    return
                try:
                    reply = await within(self._ask(source, slot_map_command(), left), left)
                except asyncio.TimeoutError:
                    reply = NoReply(f"no reply to CLUSTER SLOTS within {left * 1000:.0f} ms")
                except Exception as exc:  # (the next source; the calls say why if none)
                    reply = exc
                if routes.answered(node, source, reply):
                    return
        finally:
            reading.set_result(None)

    async def _ask(self, endpoint: Endpoint, command: tuple[Any, ...], timeout: float
                   ) -> object:
        """``command``'s reply on a connection of its own, closed (and waited for) after:
        a cluster node's hash slot map. The caller bounds it (``within``)."""
        wire = await open_wire(endpoint, UNROUTED, timeout)
        self._wires.add(wire)  # (close() closes it too; never given back to a pool)
        reply: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def take(answer: object) -> None:
            if not reply.done():
                reply.set_result(answer)

        try:
            wire.send(resp.pack_one(command), take, 1)
            return await reply
        finally:
            await self._discard(wire)

    def _refresh(self) -> None:
        """The stale hash slot maps read again in a task (at most every REMAP_EVERY),
        within the connect budget; requests go on with the owners MOVED named."""
        stale = [] if self._closed else self._routes.remap_due()
        if not stale:
            return

        async def refresh() -> None:
            for node in stale:
                await self._read_map(node, time.monotonic() + self.connect_timeout)

        task = asyncio.get_running_loop().create_task(refresh(), name="redlock-slot-map")
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _grow(self, endpoint: Endpoint) -> None:
        """A cluster node's master was found: a target more (Routes calls this after
        appending ``endpoint`` to the targets, before routing to it)."""
        self._idle.append([])
        self._acks.append(endpoint.replica_acks)
        self._slots.append(Slots())
        self._silence.grow()
        self._refusals.grow()
        self._late.grow()
        for stacks in self._lanes.values():
            stacks.append([])

    def _end(self, request: Broadcast, exchanges: list[Exchange], replies: Replies,
             waited: float, lag: float) -> None:
        """The request is over: every reply read counts (whether or not the gathering
        was told), one not read never does; the rest goes on in the background."""
        for exchange in exchanges:
            exchange.replies = None  # late exchanges must not write into these replies
        # (Asked only if some exchange is unfinished: what it says is for those.)
        decided = (request.enough is not None
                   and not all(exchange.done for exchange in exchanges)
                   and request.enough(replies, replies.identities))
        for exchange in exchanges:
            exchange.on_done = self._late_done
            if exchange.done:
                continue
            exchange.over = True  # it goes on in the background (see the module's doc)
            if exchange.conn is None:
                self._slots[exchange.target].wake_over()
            else:
                self._late_exchange(exchange)
            # Still waiting for a connection, and nothing of it may go late: never sent.
            unsent = exchange.conn is None and exchange.needless()
            # On a loop that ran late, the wait was not all the node's: said so.
            late = (f" (this event loop ran {lag * 1000:.0f} ms late: its own work delayed"
                    " the replies, not necessarily the node)") if lag else ""
            fill_pending(exchange.indexes, replies,
                         NotSent(f"no connection within {waited * 1000:.0f} ms{late}")
                         if unsent else NOT_AWAITED if decided
                         else SENT_LATE if exchange.releases_late()
                         else NoReply(f"no reply within {waited * 1000:.0f} ms{late}"))

    def _late_exchange(self, exchange: Exchange) -> None:
        """An exchange whose request stopped waiting: a release of the same lock value goes
        behind its acquires, and it has until its budget ends to be answered."""
        if any(acquire_keys(call) for call in exchange.calls):
            exchange.late = Late(exchange.conn, exchange.target, exchange.calls, 0,
                                 exchange.started + self.connect_timeout)
            self._late.add(exchange.late)
        left = exchange.started + self.connect_timeout - time.monotonic()
        asyncio.get_running_loop().call_later(max(left, 0.0), self._expire, exchange)

    def _expire(self, exchange: Exchange) -> None:
        """Its budget is over: a node that has not answered by now is hung; closed (a late
        reply must never be read as the next command's)."""
        if not exchange.done and exchange.conn is not None:
            exchange.conn.abort(NoReply(
                f"no reply within connect_timeout {self.connect_timeout:g} s"))

    def _late_done(self, exchange: Exchange) -> None:
        if exchange.heard:
            self._silence.heard(exchange.target)
        late = exchange.late
        if late is not None:
            late.closed = True  # nothing more may be written behind now
            self._late.remove(late)

    def _send(self, exchange: Exchange, wire: Wire, packing: Packing | None = None) -> None:
        """Write the node's calls on ``wire``; their replies go to the exchange."""
        exchange.conn = wire
        wire.lane = exchange.lane
        if exchange.routed and wire.run is not None:  # (a cluster master's: P3.1a)
            exchange.calls = with_run(exchange.calls, wire.run)
        # A new connection: identify the server first, and send script bodies (the
        # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
        data = (packing or Packing()).calls(exchange.calls, wire.identified)
        acks = self._acks[exchange.target]
        if acks:  # a grant counts once replicas have it (docs/design.md §11.3)
            data += exchange.replicated(acks)
        count = len(exchange.calls) + (exchange.acks > 0)
        if exchange.ask:  # a hash slot being imported: its master serves the next command
            exchange.asking = True
            data = ASKING + data
            count += 1
        probe = SERVER_PROBE if exchange.routed else self._probe
        if not wire.identified and probe is not None:
            exchange.probed = True
            data = probe + data
            count += 1
        try:
            wire.send(data, exchange.take_reply, count)
        except Exception as exc:
            exchange.fail(exc)
            self._discard_soon(wire)
            return
        exchange.sent_at = time.monotonic()
        self._silence.owed(exchange.target, exchange.sent_at)
        if exchange.over:  # sent after its request ended (a late release): its budget
            self._late_exchange(exchange)

    async def _exchange(self, exchange: Exchange) -> None:
        """Connect, then send the node's calls: within the connection's own budget (the
        request may stop waiting long before)."""
        try:
            wire = await within(self._checkout(exchange), self.connect_timeout)
        except Exception as exc:
            if isinstance(exc, asyncio.TimeoutError):  # the node is hung
                exc = NoReply(f"no connection within connect_timeout"
                              f" {self.connect_timeout:g} s")
            self._refusals.failed(exchange.target, exc, time.monotonic())
            exchange.fail(exc)
            if self._routes.clustered and self._routes.lost(exchange.target):
                self._refresh()  # (a cluster's master failing over)
            return
        if wire is None:  # an acquire whose request ended while it waited for a slot
            exchange.finish()
            return
        if exchange.needless():  # connected after its request: nothing to send late
            exchange.finish()  # (redlock._io.wire.late_sendable); the connection is kept
            self._give_back(wire, exchange.lane)
            return
        self._send(exchange, wire)

    async def _checkout(self, exchange: Exchange) -> Wire | None:
        """A connection to the exchange's target: the last one given back, or a new one (see
        Slots); None for an acquire whose request ended while it waited."""
        target = exchange.target
        if exchange.lane is not None:
            # The lane's own connection; the first time, a shared one, which then stays
            # in the lane (opening a new one is slow on a busy event loop).
            wire = self._kept(target, exchange.lane, checked=True)
            if wire is not None:
                return wire
        slots = self._slots[target]
        while True:
            wire = self._kept(target, checked=True)
            if wire is not None:
                return wire
            if exchange.needless():
                return None
            if slots.free > 0:
                slots.free -= 1
                try:
                    wire = await open_wire(self._targets[target], target, self.connect_timeout)
                    return self._wrap(wire)
                finally:
                    slots.free += 1
                    slots.wake_one()
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            slots.add(exchange, future)
            try:
                await future
            finally:
                slots.remove(future)

    def _wrap(self, wire: Wire) -> Wire:
        # (Cleared of its refusals once it answers: _wire_free. A host that accepts and
        # resets is refusing: _broken.)
        self._wires.add(wire)
        wire.on_free = self._wire_free
        wire.on_broken = self._broken
        return wire

    def _broken(self, wire: Wire) -> None:
        if not wire.identified and wire.error is not None:  # it never answered
            self._refusals.failed(wire.target, wire.error, time.monotonic())
        if self._routes.clustered and self._routes.lost(wire.target):
            self._refresh()
        self._discard_soon(wire)

    def _idle_wires(self, exchanges: Iterable[Exchange]) -> dict[int, Wire]:
        """An open connection per target that has one idle, with one readability check for
        all: one the server closed while it sat idle (it restarted), or that has bytes
        nobody asked for, must not carry a request (it is closed; a task opens another)."""
        found = {}
        for exchange in exchanges:
            wire = self._kept(exchange.target, exchange.lane)
            if wire is None and exchange.lane is not None:
                wire = self._kept(exchange.target)
            if wire is not None:
                found[exchange.target] = wire
        # (Not for a connection freed less than FRESH ago: see redlock._io.wire.)
        now = time.monotonic()
        stale = [wire for wire in found.values() if now - wire.freed_at >= FRESH]
        if stale:
            for wire in readable_wires(stale):
                del found[wire.target]
                self._discard_soon(wire)
        return found

    def _wire_free(self, wire: Wire) -> None:
        """Every reply owed on ``wire`` was read: it is free for the next request."""
        if self._refusals.errors[wire.target] is not None:  # it answered (Refusals)
            self._refusals.connected(wire.target)
        if self._closed:
            self._discard_soon(wire)
        else:
            self._give_back(wire, wire.lane)

    def _give_back(self, wire: Wire, lane: str | None = None) -> None:
        """A connection for the next request (of its lane); an exchange waiting for one
        takes it."""
        if lane is not None:
            self._lane(lane)[wire.target].append(wire)
            return
        wire.freed_at = time.monotonic()
        self._idle[wire.target].append(wire)
        self._slots[wire.target].wake_one()

    def _kept(self, target: int, lane: str | None = None, *,
              checked: bool = False) -> Wire | None:
        """An idle connection (of the lane), alive as far as the loop knows; ``checked``:
        and nothing to read in its socket (see _idle_wires, which checks in bulk)."""
        idle = self._idle[target] if lane is None else self._lane(lane)[target]
        while idle:
            wire: Wire = idle.pop()
            if wire.alive and not (checked and wire.readable()):
                return wire
            self._discard_soon(wire)
        return None

    def _lane(self, lane: str) -> list[list[Wire]]:
        found = self._lanes.get(lane)
        if found is None:
            found = self._lanes[lane] = [[] for _ in self._targets]
        return found

    def _discard_soon(self, wire: Wire) -> None:
        """Close a connection (what is written still goes out first)."""
        wire.on_free = wire.on_broken = None
        self._wires.discard(wire)
        wire.close()

    async def _discard(self, wire: Wire) -> None:
        """Close a connection and wait until it is closed (a TLS shutdown included; at
        most connect_timeout), as the manager's close does."""
        wire.on_free = wire.on_broken = None
        self._wires.discard(wire)
        wire.close()
        if wire.closed is not None:
            try:
                await within(asyncio.shield(wire.closed), self.connect_timeout)
            except asyncio.TimeoutError:
                wire.abort(Unreachable("Connection closed by the client."))

    def write_behind(self, request: Broadcast) -> None:  # (see redlock._io.wire)
        """Write each release behind the unanswered acquires of the same lock value."""
        for call in request.calls:
            for late in self._late.behind(call, self._routes.target_of(call)):
                if late.closed:
                    continue
                with contextlib.suppress(Exception):  # the normal release goes out too
                    late.conn.send(resp.pack_one(render(call, evalsha=False)), IGNORE, 1)

    async def close(self) -> None:
        self._closed = True  # nothing new is sent: it would open connections after these
        for task in list(self._running):
            task.cancel()
        for task in list(self._running):
            with contextlib.suppress(BaseException):
                await task
        # Every connection at once, each until closed (an event loop that ends right
        # after would otherwise leave a TLS socket open).
        self._late.drain()
        for stacks in (self._idle, *self._lanes.values()):
            for idle in stacks:
                idle.clear()
        await asyncio.gather(*[self._discard(wire) for wire in list(self._wires)],
                             return_exceptions=True)
