"""What the asyncio transport keeps per request and node (see
:mod:`redlock._io.async_transport`): one node's exchange of one request
(:class:`Exchange`), the slots for new connections to a node and who waits for them
(:class:`Slots`), and a request's replies gathered as its exchanges finish
(:class:`Gathering`).
"""

from __future__ import annotations

import asyncio
import select
from typing import Any

from redlock._core.requests import Call, Decision, Replies
from redlock._io.wire import PENDING, acquire_keys, late_sendable
from redlock._scripts import lock as scripts

# New connections opening at once per node: a hung node (it accepts TCP, never answers
# the handshake) does not collect sockets. An exchange that needs a connection beyond
# this waits for a slot, or for a connection another exchange gives back, within its
# budget: it never fails at once, so a healthy node under a burst of concurrent requests
# serves them all (failing at once, as a cap did, lost auto-extended locks under load).
# See Slots for who is served first.
OPENING_PER_NODE = 16


def is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the stream itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._writer


def readable_while_idle(conn: Any) -> bool:
    """An idle connection with something to read: the server closed it (EOF), or sent
    what nobody asked for. Either way it must not carry a request."""
    writer = getattr(conn, "_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class Exchange:
    """One node's calls of one request, and what came back."""

    __slots__ = ("calls", "conn", "indexes", "lane", "node", "over", "replies", "results",
                 "sent_at")

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
        self.sent_at = 0.0
        self.over = False  # the request stopped waiting for it
        self.conn: Any = None  # the connection it talks on, once it has one

    def needless(self) -> bool:
        """Its request is over and not all of its calls may be sent late (see
        redlock._io.wire.late_sendable): nothing will be sent."""
        return self.over and not all(late_sendable(call) for call in self.calls)

    def releases_late(self) -> bool:
        """Final releases still waiting for a connection when their request ended: they
        go out once it is open (an extend that did not get through in time failed)."""
        return self.conn is None and not self.needless() and all(
            call.script is scripts.RELEASE for call in self.calls)

    def copy_into(self, replies: Replies) -> None:
        """The replies read so far into the request's replies (what is still unread stays
        PENDING there)."""
        for index, result in zip(self.indexes, self.results, strict=True):
            if result is not PENDING:
                replies[index] = result

    def reply_waiting(self) -> bool:
        """Its next reply is already here (in the socket or the stream's buffer) but the
        event loop has not handed it to the exchange yet."""
        conn = self.conn
        if conn is None:
            return False
        reader = getattr(conn, "_reader", None)
        if reader is not None and getattr(reader, "_buffer", None):
            return True
        return readable_while_idle(conn)


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
        self.waiting: list[tuple[Exchange, asyncio.Future[None]]] = []

    @staticmethod
    def _rank(waiter: tuple[Exchange, asyncio.Future[None]]) -> int:
        exchange = waiter[0]
        if exchange.over:
            return 2
        return 1 if any(acquire_keys(call) for call in exchange.calls) else 0

    def wake_one(self) -> None:
        if not self.waiting:
            return
        first = min(self.waiting, key=self._rank)  # the earliest of the best rank
        self.waiting.remove(first)
        if not first[1].done():
            first[1].set_result(None)

    def wake_over(self) -> None:
        """Requests ended: their acquires waiting here give up (see Exchange.needless)."""
        for exchange, future in [w for w in self.waiting if w[0].needless()]:
            self.waiting.remove((exchange, future))
            if not future.done():
                future.set_result(None)


class Gathering:
    """The replies of one request as its exchanges finish (their done callbacks), and
    the future that wakes the request when there is something to decide."""

    def __init__(self, loop: asyncio.AbstractEventLoop, replies: Replies,
                 enough: Decision | None) -> None:
        self.replies: Replies | None = replies
        self.enough = enough
        self.left = 0  # exchanges not finished
        self.decided = False
        self.learn = 0  # wake the request once this many nodes answered (Broadcast.learn)
        self.wake: asyncio.Future[None] = loop.create_future()

    def decides(self) -> bool:
        return self.enough is not None and self.replies is not None and self.enough(
            self.replies, self.replies.identities)

    def finished(self, exchange: Exchange, _task: object) -> None:
        self.left -= 1
        if self.replies is None:  # the request is over: it copied what it could use
            return
        exchange.copy_into(self.replies)
        if not self.wake.done() and (
                self.left == 0 or (not self.decided and self.decides())
                or (self.learn and len(self.replies.round_trips) >= self.learn)):
            self.wake.set_result(None)
