"""What the asyncio transport keeps per request and node (see
:mod:`redlock._io.async_transport`): one node's exchange of one request
(:class:`Exchange`), the slots for new connections to a node and who waits for them
(:class:`Slots`), and a request's replies gathered as its exchanges finish
(:class:`Gathering`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from redlock._core.requests import Call, Decision, Replies
from redlock._io import resp
from redlock._io.failures import answered, is_noscript
from redlock._io.wire import (
    PENDING,
    Silence,
    acquire_keys,
    late_sendable,
    render,
)
from redlock._scripts import lock as scripts

# New connections opening at once per node: a hung node (it accepts TCP, never answers
# the handshake) does not collect sockets. An exchange that needs a connection beyond
# this waits for a slot, or for a connection another exchange gives back, within its
# budget: it never fails at once, so a healthy node under a burst of concurrent requests
# serves them all (failing at once, as a cap did, lost auto-extended locks under load).
# See Slots for who is served first.
OPENING_PER_NODE = 16


class Exchange:
    """One node's calls of one request, and what came back: its replies are handed to
    it in order by the connection (:class:`redlock._io.async_wire.Wire`) as they are
    parsed (``take``), and it tells ``on_done`` once each call has its result."""

    __slots__ = ("calls", "done", "heard", "indexes", "lane", "late", "next", "node",
                 "on_done", "over", "probed", "replies", "results", "sent_at", "started",
                 "unknown", "wire")

    def __init__(self, node: int, replies: Replies, lane: str | None = None) -> None:
        self.node = node
        # The request's replies while it waits (None once it is over): what the exchange
        # learns of the server (its identity, a round trip) goes there at once, for the
        # request's early decision.
        self.replies: Replies | None = replies
        self.lane = lane  # its request's lane of connections (None: the shared ones)
        self.indexes: list[int] = []
        self.calls: list[Call] = []
        self.results: list[object] = []  # one per call (PENDING until read), see broadcast
        self.started = 0.0  # when its request began: its budget (connect_timeout) counts
        self.sent_at = 0.0
        self.over = False  # the request stopped waiting for it
        self.wire: Any = None  # the connection it talks on, once it has one
        self.probed = False  # IDENTIFY went first: the first reply is the identity
        self.next = 0  # the position of the next reply
        self.unknown: list[int] = []  # answered NOSCRIPT: sent again with the body
        self.done = False
        self.heard = False  # the node replied, or failed it other than by a timeout
        self.late: Any = None  # its Late entry (a release goes behind its acquires)
        self.on_done: Callable[[Exchange], None] | None = None

    def take(self, reply: object) -> None:
        """The next reply of its calls (an error that ended the connection: every call
        still without a result gets it)."""
        wire = self.wire
        if not wire.alive and isinstance(reply, BaseException):
            self.fail(reply)
            return
        self.heard = True
        if self.probed:  # IDENTIFY's reply: among the request's at once (early decision)
            self.probed = False
            # An error (a server still loading its data: LOADING) identifies nothing: the
            # connection is asked again on its next request (docs/design.md §4.4).
            wire.identified = not isinstance(reply, BaseException)
            if self.replies is not None:
                self.replies.identities[self.node] = reply
            return
        position = self.next
        self.next = position + 1
        if position == 0 and self.replies is not None:
            self.replies.round_trips[self.node] = time.monotonic() - self.sent_at
        if is_noscript(reply):
            self.unknown.append(position)
        else:
            self.results[position] = reply
        if self.next < len(self.calls):
            return
        if not self.unknown:
            self.finish()
            return
        try:  # SCRIPT FLUSH since: send the bodies
            wire.send(resp.pack([render(self.calls[i], evalsha=False) for i in self.unknown]),
                      self.take_resent, len(self.unknown))
        except Exception as exc:
            self.fail(exc)

    def take_resent(self, reply: object) -> None:
        if not self.wire.alive and isinstance(reply, BaseException):
            self.fail(reply)
            return
        self.results[self.unknown.pop(0)] = reply
        if not self.unknown:
            self.finish()

    def fail(self, exc: BaseException) -> None:
        """Every call still without a result gets ``exc``; the exchange is done."""
        self.heard = self.heard or answered(exc)
        self.results = [exc if r is PENDING else r for r in self.results]
        self.finish()

    def finish(self) -> None:
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
        return self.wire is None and not self.needless() and all(
            call.script is scripts.RELEASE for call in self.calls)

    def copy_into(self, replies: Replies) -> None:
        """The replies read so far into the request's replies (what is still unread stays
        PENDING there)."""
        for index, result in zip(self.indexes, self.results, strict=True):
            if result is not PENDING:
                replies[index] = result

    def reply_waiting(self) -> bool:
        """Its next reply is already here (in the socket) but the event loop has not
        handed it to the exchange yet."""
        return self.wire is not None and self.wire.readable()


class Slots:
    """The new connections opening to one node (at most OPENING_PER_NODE at once), and
    the exchanges waiting to open one. A freed slot, or a connection given back, wakes
    one waiter, in this order: requests still waiting that hold locks (extends, releases,
    and the rest that is not an acquire), then acquires still waiting, then requests
    that are over. A holder must not queue behind a burst of new acquires: the first of
    200 auto-extended locks renewed while the other 199 were still being acquired, and
    its renewal waited for their connections until its validity ran out. An acquire
    whose request is over stops waiting: it would send nothing."""

    def __init__(self) -> None:
        self.free = OPENING_PER_NODE
        # The waiters in arrival order (dicts: one leaves in O(1)). ``droppable``: those
        # that send nothing once their request is over (acquires), the only ones
        # wake_over looks at. A hung node collects a final release per request, each
        # waiting out its budget (connect_timeout), and scanning them all at every
        # request's end was most of the client's time (BENCHMARKS.md, "Issue 21: silent
        # stragglers").
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
    """The deadlines of one transport's requests waiting on one event loop, behind one
    timer: armed for the earliest, it wakes the requests whose deadline passed and is
    armed again for the next. A timer per request cost a handle, a heap push among the
    loop's cancelled timers and a cancel, on every request, though almost every request
    is answered long before its deadline."""

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


class Gathering:
    """The replies of one request as its exchanges finish, its deadline, and the future
    that wakes the request when there is something to do: every exchange is done, a
    first request learnt its timeout, or the deadline (one timer). A decision (early
    quorum) wakes nobody: it moves the deadline to the stragglers' grace, and the
    request wakes when they are in or that is over (one task step less per request)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, replies: Replies,
                 enough: Decision | None, started: float, deadline: float,
                 deadlines: Deadlines, exchanges: dict[int, Exchange],
                 silence: Silence) -> None:
        self.loop = loop
        self.deadlines = deadlines  # its transport's timer on this loop
        self.exchanges = exchanges  # per node
        self.silence = silence  # its transport's: the nodes that stopped answering
        self.replies: Replies | None = replies
        self.enough = enough
        self.left = 0  # exchanges not finished
        self.decided = 0.0  # when the replies decided the request
        self.learn = 0  # wake the request once this many nodes answered (Broadcast.learn)
        self.started = started
        self.deadline = deadline
        self.wake: asyncio.Future[None] = loop.create_future()
        self.armed = False

    def decides(self) -> bool:
        return self.enough is not None and self.replies is not None and self.enough(
            self.replies, self.replies.identities)

    def decide(self) -> bool:
        """Decided (again, as a straggler finishes): the stragglers get as long again as
        the decision took (all of a healthy cluster's replies come in together), no
        longer, and nothing once they are all silent (then True: nothing is left to
        wait for; see Silence.until)."""
        now = time.monotonic()
        self.decided = self.decided or now
        self.deadline = min(self.deadline, self.silence.until(self.started, self.decided, now, [
            exchange.node for exchange in self.exchanges.values() if not exchange.done]))
        return self.deadline <= now

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
            self.silence.heard(exchange.node)
        if self.replies is None:  # the request is over: it copied what it could use
            return
        exchange.copy_into(self.replies)
        if self.wake.done():
            return
        if self.left == 0 or (self.learn and len(self.replies.round_trips) >= self.learn):
            self.wake.set_result(None)
        elif self.decided or self.decides():
            if self.decide():
                self.wake.set_result(None)
            elif self.armed:  # the request waits: at the new deadline now
                self.arm()
