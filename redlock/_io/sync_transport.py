"""The sync transport: parallel requests to N nodes from one thread, on one route (docs/design.md
§2.4).

Scatter: each node's calls written with one write on a connection from its stack of idle ones;
gather: one ``select`` over the sockets, each reply parsed as its bytes come. A request returns
once its replies are in, or decide it (the stragglers' grace, :class:`~redlock._io.wire.Gathering`),
or at its deadline, leaving the rest to the drainer (:mod:`redlock._io.sync_drainer`). Everything
else is a branch of this route: new connections opened in the background
(:mod:`redlock._io.sync_connect`), NOSCRIPT, replies half received, an interruption (every
connection is left in the pool, with the drainer, or closed)."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Sequence
from typing import Any

from redlock._core.requests import Broadcast, CommandArg, Replies
from redlock._io import resp
from redlock._io.connection import (
    NOTHING,
    Connection,
    has_input,
    receive_buffered,
    receive_ready,
    send,
    with_input,
)
from redlock._io.endpoint import Endpoint
from redlock._io.failures import (
    CLOSED,
    NoReply,
    NotSent,
    Unreachable,
    as_failure,
    map_failures,
)
from redlock._io.sync_connect import CONNECTS_PER_NODE, Connect, Connector, given
from redlock._io.sync_drainer import SyncDrainer
from redlock._io.wire import (
    DONE,
    FRESH,
    IDENTIFIED,
    NOT_AWAITED,
    PENDING,
    RESEND,
    SENT_LATE,
    Exchange,
    Gathering,
    Packing,
    Silence,
    exchanges_of,
    fill_pending,
)

#: Seconds a connection may wait on its node's idle stack unused before it is closed (a
#: burst of threads opened it, and the burst is over).
IDLE_KEPT_FOR = 30.0
# A request under way notices close() within this (it ends, and close() waits for it).
_CLOSE_NOTICED = 0.05
# While a connection is opening for a request, how often the request looks at it.
_CONNECTING_POLL = 0.002
# At the deadline, how long reading the replies that are already arriving may take: a
# thread starved of the GIL (the switch interval is 5 ms, and dozens of threads wait)
# needs more than the read itself.
_LAST_READ = 0.05
# sent_at of an exchange whose write was under way (an interruption there leaves its
# connection unusable).
_WRITING = -1.0

# Per node, the connections of a request still opening: its Connect, or None while it
# waits for a free slot (or a connection given back).
Connecting = list[tuple[Exchange, Connect | None]]


class SyncTransport:
    """Connections to each node, and scatter/gather over them."""

    def __init__(self, endpoints: Sequence[Endpoint], addresses: Sequence[str],
                 connect_timeout: float, identify: tuple[CommandArg, ...] | None = None) -> None:
        # ``identify``: the command sent first on every new connection (IDENTIFY, docs/
        # design.md §4.4); its reply is returned with the request's (Replies.identities).
        self.identify = identify
        self._probe = resp.pack_one(identify) if identify is not None else None
        self.endpoints = list(endpoints)
        self._acks = [endpoint.replica_acks for endpoint in self.endpoints]
        self.addresses = list(addresses)
        # Connecting and logging in are bounded by this (and so is a send that cannot
        # proceed); reads carry each request's own deadline.
        self.connect_timeout = connect_timeout
        n = len(self.endpoints)
        self._silence = Silence(n)  # the nodes that stopped answering
        # Replies owed on connections nobody waits on any more; queued final releases.
        self._drainer = SyncDrainer(n, connect_timeout, give_back=self._give_back,
                                    discard=_discard, silence=self._silence)
        self._connector = Connector(self.endpoints, connect_timeout, self._silence,
                                    self._connected_late)
        # Per node, the idle connections: a stack, so that those a burst opened stay at
        # its bottom, where the shrink looks (_put_idle); push and pop need no lock.
        self._idle: list[list[Connection]] = [[] for _ in range(n)]
        self._shrinking = threading.Lock()
        # Lanes (Broadcast.lane): per lane and node, its connections, kept aside.
        self._lanes: dict[str, list[list[Connection]]] = {}
        self._mutex = threading.Lock()
        self._closed = False
        self._under_way: set[object] = set()  # requests under way (see broadcast)
        self._idle_now = threading.Condition(self._mutex)

    # -- a request ---------------------------------------------------------------

    def broadcast(self, request: Broadcast) -> Replies:
        """Every call's reply or exception (NOT_AWAITED for those the request was
        decided without). Calls for one node share one connection and one write."""
        # close() sets _closed, then waits for the requests under way to leave this set (add
        # and discard are atomic: no lock).
        me = object()
        under_way = self._under_way
        under_way.add(me)
        try:
            if self._closed:  # a thread or background flow racing the manager's close
                return Replies([as_failure(Unreachable(CLOSED))] * len(request.calls))
            if self._drainer.late.total:  # releases go behind unanswered acquires of
                self._drainer.trail_releases(request)  # their lock value (sync_drainer.py)
            started = time.monotonic()
            replies = Replies([PENDING] * len(request.calls))
            exchanges = exchanges_of(request.calls, replies, request.lane, Exchange,
                                     request.timeout)
            gathering = Gathering(request, replies, started, started + request.timeout,
                                  self._silence)
            waiting: dict[Any, Exchange] = {}  # socket -> the exchange owed replies on it
            connecting: Connecting = []
            try:
                packing = self._scatter(request, exchanges, waiting, connecting)
                if waiting or connecting:
                    self._gather(gathering, waiting, connecting, packing,
                                 len(waiting) + len(connecting) < len(exchanges))
            except BaseException:  # interrupted (KeyboardInterrupt), or a bug of ours
                self._end(gathering, exchanges, connecting, interrupted=True)
                raise
            if waiting or connecting:  # decided without them, or its deadline
                self._end(gathering, exchanges, connecting, interrupted=False)
        finally:
            under_way.discard(me)
            if self._closed and not under_way:
                with self._mutex:
                    self._idle_now.notify_all()
        for reply in replies:  # (errors as the library's, only when there are some)
            if isinstance(reply, BaseException):
                map_failures(replies)
                break
        return replies

    def _scatter(self, request: Broadcast, exchanges: list[Exchange],
                 waiting: dict[Any, Exchange], connecting: Connecting) -> Packing:
        """Each node's calls written on an idle connection, or a connection opening."""
        lane = request.lane
        idle = self._idle
        packing = Packing(request)
        now = time.monotonic()
        looked: list[Exchange] | None = None  # idle long enough to be looked at (FRESH)
        for exchange in exchanges:
            conn: Connection | None
            if lane is None:  # (_take_idle, the usual case written out)
                try:
                    conn = idle[exchange.node].pop()
                except IndexError:  # (another thread may take the last one: no look first)
                    conn = None
                if conn is not None and conn.sock is None:
                    conn = self._take_idle(exchange.node)
            else:
                conn = self._take_idle(exchange.node, lane)
            if conn is None:
                connecting.append((exchange, self._connector.connect(
                    exchange.node, anyway=lane is not None)))
                continue
            exchange.conn = conn
            if now - conn.idle_since < FRESH:  # its replies were read a moment ago
                self._send(exchange, packing, waiting)
            elif looked is None:
                looked = [exchange]
            else:
                looked.append(exchange)
        if looked is not None:
            # One select for all: a server that closed a connection while it sat idle (it
            # restarted), or sent what nobody asked for: nothing is written on it.
            unasked = with_input([exchange.conn for exchange in looked])
            for exchange in looked:
                if exchange.conn in unasked:
                    exchange.conn.close()
                    exchange.conn = self._take_idle(exchange.node, lane, check=True)
                    if exchange.conn is None:
                        connecting.append((exchange, self._connector.connect(
                            exchange.node, anyway=lane is not None)))
                        continue
                self._send(exchange, packing, waiting)
        return packing

    def _send(self, exchange: Exchange, packing: Packing, waiting: dict[Any, Exchange]) -> None:
        conn = exchange.conn
        # A new connection: identify the server first, and send script bodies (the
        # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
        data = packing.calls(exchange.calls, conn.identified)
        acks = self._acks[exchange.node]
        if acks:  # a grant counts once replicas have it (docs/design.md §11.3)
            data += exchange.replicated(acks)
        if not conn.identified and self._probe is not None:
            exchange.probed = True
            data = self._probe + data
        exchange.sent_at = _WRITING
        try:
            send(conn, data)
        except Exception as exc:
            self._failed(exchange, exc)
            return
        exchange.sent_at = now = time.monotonic()
        self._silence.owed(exchange.node, now)
        waiting[conn.sock] = exchange

    def _gather(self, gathering: Gathering, waiting: dict[Any, Exchange],
                connecting: Connecting, packing: Packing, failed: bool) -> None:
        """Read the replies as they arrive until they are in, or the request's deadline
        (moved by its decision: the stragglers' grace; see Gathering). ``failed``: some
        node's calls failed already (their write)."""
        finished = failed
        while True:
            if connecting and self._connected(connecting, waiting, packing):
                finished = True
            if (not waiting and not connecting) or self._closed:
                return  # (closed: close() waits for it; what is unread is lost)
            left = gathering.deadline - time.monotonic()
            if left <= 0:
                # A reply already in a socket came in time, even if this thread (many
                # threads, one GIL) is only now looking: read what is there, then stop.
                self._last_reads(waiting)
                return
            if waiting:
                # Wake for a reply, or every few ms while a connection is still opening,
                # and to notice close(). A reply still incomplete is read on only when
                # more of it arrived: it never holds up the other nodes' replies.
                try:
                    ready, _, _ = select.select(list(waiting), [], [], min(
                        left, _CONNECTING_POLL if connecting else _CLOSE_NOTICED))
                except (OSError, TypeError, ValueError):  # a socket closed under us
                    ready = list(waiting)  # (reading each says why)
                for sock in ready:
                    exchange = waiting[sock]
                    if self._read(exchange):
                        del waiting[sock]
                        finished = True
            else:
                first = connecting[0][1]
                if first is not None:
                    first.ready.wait(min(left, _CONNECTING_POLL))
                else:
                    time.sleep(min(left, _CONNECTING_POLL))
            if finished and (waiting or connecting):
                if gathering.learn:  # a first request: its timeout from its own replies
                    gathering.learnt()
                if gathering.enough is not None:  # decided: the stragglers' grace
                    gathering.decide(lambda: [e.node for e in waiting.values()]
                                     + [e.node for e, _ in connecting])
            finished = False

    def _read(self, exchange: Exchange) -> bool:
        """Read what has come of the exchange's replies, without waiting; True once it is
        done (every call has its reply) or failed (closed)."""
        conn = exchange.conn
        try:
            reply = receive_ready(conn)
            while True:
                if reply is NOTHING:
                    return False  # the rest when more of it arrives
                state = exchange.take(reply)
                if state == DONE:
                    break
                if state == RESEND:  # SCRIPT FLUSH since: the bodies go
                    send(conn, exchange.bodies())
                elif state == IDENTIFIED:  # (an error, a server still LOADING: asked again)
                    conn.identified = not isinstance(reply, BaseException)
                    self._connector.refusals.connected(exchange.node)  # it answered
                reply = receive_buffered(conn)
        except Exception as exc:
            self._failed(exchange, exc)
            return True
        self._silence.heard(exchange.node)
        self._give_back(exchange.node, conn, exchange.lane)
        return True

    def _failed(self, exchange: Exchange, exc: Exception) -> None:
        """Writing or reading the exchange's calls failed: they get ``exc``; closed. On a
        new connection that never answered, as if the connection had failed (Refusals: a
        host that accepts and resets is refusing)."""
        exchange.fail(exc)
        self._silence.failed(exchange.node, exc)
        if not exchange.conn.identified:
            self._connector.refusals.failed(exchange.node, exc, time.monotonic())
        exchange.conn.close()

    def _connected(self, connecting: Connecting, waiting: dict[Any, Exchange],
                   packing: Packing) -> bool:
        """The request's connections still opening: those open now are written on, those
        that failed fail their calls (True when one did), and one waiting for a slot gets
        a connection given back meanwhile, or a slot."""
        for position, (exchange, attempt) in enumerate(connecting):
            if attempt is None:
                conn = self._take_idle(exchange.node, check=True)
                connecting[position] = (exchange, given(exchange.node, conn)
                                        if conn is not None
                                        else self._connector.connect(exchange.node))
        failed = False
        for item in [c for c in connecting if c[1] is not None and c[1].ready.is_set()]:
            exchange, attempt = item
            assert attempt is not None
            if attempt.conn is None:
                connecting.remove(item)
                exchange.fail(attempt.error or Unreachable("connection failed"))
                failed = True
                continue
            exchange.conn = attempt.conn  # (before it leaves the list: see _end)
            connecting.remove(item)
            self._send(exchange, packing, waiting)
            failed = failed or exchange.done
        return failed

    def _last_reads(self, waiting: dict[Any, Exchange]) -> None:
        """At the deadline, the exchanges whose replies are arriving: what of them comes
        within _LAST_READ is read (a thread starved of the GIL needs more than the read
        itself), each as its bytes come, none waiting for another."""
        arriving = [sock for sock, exchange in waiting.items() if has_input(exchange.conn)]
        until = time.monotonic() + _LAST_READ
        while arriving:
            for sock in arriving:
                if self._read(waiting[sock]):
                    del waiting[sock]
            left = until - time.monotonic()
            arriving = [sock for sock in arriving if sock in waiting]
            if not arriving or left <= 0 or self._closed:
                return
            try:
                arriving, _, _ = select.select(arriving, [], [], left)
            except (OSError, TypeError, ValueError):
                return

    def _end(self, gathering: Gathering, exchanges: list[Exchange], connecting: Connecting,
             *, interrupted: bool) -> None:
        """A request that ends with calls unanswered: a connection still opening joins the
        pool when ready, one with replies owed goes to the drainer, one not written on goes
        back; the calls without a reply get what the request knows of them."""
        replies = gathering.replies
        for exchange in exchanges:  # (every reply read is in the replies already)
            exchange.replies = None
        decided = not interrupted and gathering.enough is not None and gathering.enough(
            replies, replies.identities)
        waited = gathering.deadline - gathering.started
        for exchange, attempt in connecting:  # still connecting: it joins the pool later
            if attempt is None:
                queued = self._drainer.queue(exchange.node, exchange.calls)
                fill_pending(exchange.indexes, replies, SENT_LATE if queued else NotSent(
                    f"no connection: {CONNECTS_PER_NODE} were still opening"))
                continue
            late = self._connector.abandon(attempt, exchange.calls)
            fill_pending(exchange.indexes, replies, SENT_LATE if late else NotSent(
                f"still connecting (connect_timeout {self.connect_timeout:g} s)"))
        still = {id(exchange) for exchange, _ in connecting}
        for exchange in exchanges:
            conn = exchange.conn
            if exchange.done or conn is None or id(exchange) in still:
                continue
            if not exchange.sent_at:  # taken and never written on (interrupted)
                self._give_back(exchange.node, conn, exchange.lane)
            elif exchange.sent_at == _WRITING:  # interrupted while writing: unusable
                exchange.fail(Unreachable("interrupted while writing"))
                conn.close()
            else:  # decided without it, timed out or interrupted: the rest is read late
                fill_pending(exchange.indexes, replies, NOT_AWAITED if decided else NoReply(
                    f"no reply within {waited * 1000:.0f} ms"))
                self._drainer.keep(exchange.node, conn, exchange.calls, exchange.owed())

    # -- connections ---------------------------------------------------------------

    def _take_idle(self, node: int, lane: str | None = None, *,
                   check: bool = False) -> Connection | None:
        """An open connection from the node's stack (or the lane's; the first time, one
        from the stack), without connecting: None if there is none. ``check``: and with
        nothing to read in it (see _scatter, which looks at all of a request's at once)."""
        if lane is not None:
            with self._mutex:
                kept = self._lanes.setdefault(lane, [[] for _ in self.endpoints])[node]
                while kept:
                    conn = kept.pop()
                    if conn.sock is not None:
                        return conn
        stack = self._idle[node]
        while stack:
            try:
                conn = stack.pop()
            except IndexError:  # another thread took the last one
                break
            if conn.sock is not None and not (check and has_input(conn)):
                return conn
            conn.close()
        return None

    def _connected_late(self, attempt: Connect) -> None:
        """A connection its request gave up on: its late releases go out on it (read by
        the drainer, which then gives it back), else it joins the pool at once."""
        conn, node = attempt.conn, attempt.node
        assert conn is not None  # (told only of an attempt that connected)
        if not attempt.late or self._closed:
            self._give_back(node, conn)
            return
        self._drainer.send(node, conn, attempt.late)

    def _give_back(self, node: int, conn: Connection, lane: str | None = None) -> None:
        """A connection back to its node's stack (first carrying the node's queued releases)
        or its lane; closed instead once the manager is. Ones unused for IDLE_KEPT_FOR close."""
        if self._closed:
            conn.close()
            return
        if lane is not None:
            with self._mutex:
                self._lanes.setdefault(lane, [[] for _ in self.endpoints])[node].append(conn)
            return
        drainer = self._drainer
        if drainer.queued[node]:
            calls = drainer.take_queued(node)
            if calls:
                drainer.send(node, conn, calls)
                return
        stack = self._idle[node]
        now = conn.idle_since = time.monotonic()
        stack.append(conn)
        try:
            oldest = stack[0]
        except IndexError:  # taken meanwhile
            return
        if now - oldest.idle_since > IDLE_KEPT_FOR:
            self._shrink(node, now)

    def _shrink(self, node: int, now: float) -> None:
        stale = []
        stack = self._idle[node]
        with self._shrinking:  # one at a time; requests push and pop the top meanwhile
            while True:
                try:
                    if now - stack[0].idle_since <= IDLE_KEPT_FOR:
                        break
                    # (Should another thread take the last one between the look and
                    # the pop, and put one back, that idle one is closed: it is unused.)
                    stale.append(stack.pop(0))
                except IndexError:
                    break
        for conn in stale:
            conn.close()

    def close(self) -> None:
        """Close every connection; the drainer and the threads still opening connections
        end before this returns (each within its budget: a close leaves no thread)."""
        with self._mutex:
            self._closed = True
            # Requests under way notice within _CLOSE_NOTICED and end: their sockets
            # must be closed below, not after this returns.
            self._idle_now.wait_for(lambda: not self._under_way, timeout=2 * self.connect_timeout)
        threads = self._connector.close()  # (a request that ended meanwhile: its too)
        self._drainer.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(self.connect_timeout + 0.1)
        with self._mutex:
            lanes, self._lanes = self._lanes, {}
        for stacks in (self._idle, *lanes.values()):
            for stack in stacks:
                while stack:
                    stack.pop().close()


def _discard(_node: int, conn: Connection) -> None:
    conn.close()
