"""The sync transport: parallel requests to N nodes from one thread.

Parallel means parallel on one thread: a request's commands are written to every
node first (scatter), then the replies are read as they arrive (gather, ``select``
over the sockets), so N nodes cost one round trip, not N; the request ends as soon
as its replies decide it (early quorum) or at its deadline. What is left unread is
read in the background (see :mod:`redlock._io.wire`). A node without an open
connection is connected in the background with its own budget (``connect_timeout``):
the request waits for it only until its own deadline, and a hung node that accepts
TCP but never answers the handshake costs one node timeout, not the connect budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from redlock._core.requests import Broadcast, CommandArg, Replies, learnt_deadline
from redlock._io import resp
from redlock._io.connection import (
    NOTHING,
    Connection,
    has_input,
    receive,
    send,
    wait_readable,
)
from redlock._io.endpoint import Endpoint
from redlock._io.failures import (
    CLOSED,
    NoReply,
    NotSent,
    Unreachable,
    as_failure,
    is_noscript,
    map_failures,
)
from redlock._io.sync_connect import CONNECTS_PER_NODE, Connect, Connector, given
from redlock._io.sync_drainer import SyncDrainer
from redlock._io.sync_exchange import Group, by_node
from redlock._io.sync_idle import IdleConnections, with_input
from redlock._io.sync_warm import WarmPath
from redlock._io.wire import (
    NOT_AWAITED,
    PENDING,
    SENT_LATE,
    Packing,
    Silence,
    fill_pending,
)

# A request under way notices close() within this (it ends, and close() waits for it).
_CLOSE_NOTICED = 0.05
# At the deadline, how long reading the replies that are already arriving may take: a
# thread starved of the GIL (the switch interval is 5 ms, and dozens of threads wait)
# needs more than the read itself.
_LAST_READ = 0.05


class SyncTransport:
    """Connections to each node, and scatter/gather over them."""

    def __init__(self, endpoints: Sequence[Endpoint], addresses: Sequence[str],
                 connect_timeout: float,
                 identify: tuple[CommandArg, ...] | None = None) -> None:
        # ``identify``: the command sent first on every new connection (IDENTIFY, docs/
        # design.md §4.4); its reply is returned with the request's (Replies.identities).
        self.identify = identify
        self.endpoints = list(endpoints)
        self.addresses = list(addresses)
        # Connecting and logging in are bounded by this (and so is a send that cannot
        # proceed); reads carry each request's own deadline.
        self.connect_timeout = connect_timeout
        n = len(self.endpoints)
        # Replies owed on connections nobody waits on any more; queued final releases.
        self._silence = Silence(n)  # the nodes that stopped answering
        self._drainer = SyncDrainer(n, connect_timeout, give_back=self._give_back,
                                    discard=self._discard, silence=self._silence)
        self._connector = Connector(self.endpoints, connect_timeout, self._silence,
                                    self._hand_back)
        # Lanes (redlock._core.requests.Broadcast.lane): per lane and node, its connections,
        # kept aside.
        self._lanes: dict[str, list[list[Connection]]] = {}
        # Per node, open connections between requests.
        self._idle = IdleConnections(n, self._discard)
        self._warm = WarmPath(self._idle, self._silence, self._give_back, self._failed)
        self._mutex = threading.Lock()
        self._closed = False
        self._under_way: set[object] = set()  # requests under way (see broadcast)
        self._idle_now = threading.Condition(self._mutex)

    # -- a request ---------------------------------------------------------------

    def broadcast(self, request: Broadcast) -> Replies:
        """Every call's reply or exception (NOT_AWAITED for those the request was
        decided without). Calls for one node share one connection and one write."""
        # close() waits for the requests under way. Without a lock (a set's add and
        # discard are atomic; this runs twice per acquire+release): close() sets _closed,
        # then waits for the set to empty, so a request added after that look sees
        # _closed, and one that ends after it wakes close().
        me = object()
        under_way = self._under_way
        under_way.add(me)
        try:
            if self._closed:  # a thread or background flow racing the manager's close
                return Replies([as_failure(Unreachable(CLOSED))] * len(request.calls))
            return self._broadcast(request)
        finally:
            under_way.discard(me)
            if self._closed and not under_way:
                with self._mutex:
                    self._idle_now.notify_all()

    def _broadcast(self, request: Broadcast) -> Replies:
        if self._drainer.any():
            self._drainer.trail_releases(request)
        started = time.monotonic()
        deadline = started + request.timeout
        replies = Replies([PENDING] * len(request.calls))
        sent: list[Group] = []
        warm = self._warm.take(request)  # the usual request (redlock/_io/sync_warm.py)
        if warm is not None:  # what it leaves unfinished is finished as below
            try:
                deadline = self._warm.exchange(request, warm, replies, started, deadline, sent)
            except BaseException:
                self._unfinished(request, replies, sent, [])
                raise
            if not sent:  # (nearly always: every reply is in)
                map_failures(replies)
                return replies
            return self._finish(request, replies, sent, [], started, deadline,
                                Packing(request))
        # Nodes without an open connection: opening one in the background, or (None)
        # waiting for a free slot to open one, or for a connection given back.
        connecting: list[tuple[Group, Connect | None]] = []
        packing = Packing(request)
        try:  # scatter: nodes with an open connection at once
            for group, conn in self._idle_connections(by_node(request)):
                if conn is not None:
                    self._send(group, conn, replies, sent, packing)
                else:
                    connecting.append((group, self._connector.connect(
                        group.node, anyway=group.lane is not None)))
        except BaseException:
            self._unfinished(request, replies, sent, connecting)
            raise
        return self._finish(request, replies, sent, connecting, time.monotonic(), deadline,
                            packing)

    def _finish(self, request: Broadcast, replies: Replies, sent: list[Group],
                connecting: list[tuple[Group, Connect | None]], started: float,
                deadline: float, packing: Packing) -> Replies:
        """The gather, then what is still unfinished (see :meth:`_unfinished`)."""
        try:
            if sent or connecting:
                deadline = self._gather(request, replies, sent, connecting, started, deadline,
                                        packing)
        finally:
            self._unfinished(request, replies, sent, connecting, deadline - started)
        map_failures(replies)  # redis-py errors as the library's (_io/failures.py)
        return replies

    def _unfinished(self, request: Broadcast, replies: Replies, sent: list[Group],
                    connecting: list[tuple[Group, Connect | None]],
                    waited: float | None = None) -> None:
        """A request that ends (its replies in, decided, at its deadline, interrupted):
        a connection still opening joins the pool when it is ready, one with replies
        unread goes to the drainer, the calls without a reply get theirs."""
        decided = request.enough is not None and bool(
            connecting or any(not group.done for group in sent)) and request.enough(
            replies, replies.identities)
        for group, attempt in connecting:  # still connecting: it joins the pool later
            if attempt is None:
                queued = self._drainer.queue(group.node, group.calls)
                fill_pending(group.indexes, replies, SENT_LATE if queued else NotSent(
                    f"no connection: {CONNECTS_PER_NODE} were still opening"))
                continue
            late = self._connector.abandon(attempt, group.calls)
            fill_pending(group.indexes, replies, SENT_LATE if late else NotSent(
                f"still connecting (connect_timeout {self.connect_timeout:g} s)"))
        for group in sent:
            if not group.done:  # decided without it, timed out or interrupted
                unread = (sum(1 for i in group.indexes if replies[i] is PENDING)
                          + (group.probed and group.identity is PENDING)
                          - (len(group.unknown) if not group.resent else 0))
                fill_pending(group.indexes, replies, NOT_AWAITED if decided else NoReply(
                    f"no reply within {(waited or request.timeout) * 1000:.0f} ms"))
                self._drainer.keep(group.node, group.conn, group.calls, unread)

    def _gather(self, request: Broadcast, replies: Replies, sent: list[Group],
                connecting: list[tuple[Group, Connect | None]], started: float,
                deadline: float, packing: Packing) -> float:
        """Read the replies until they are in, decide the request, or its deadline; returns
        the deadline it came to (a first request learns it, a decision moves it)."""
        decided, learning = 0.0, bool(request.learn)
        asked_at = 0  # how many replies were in (or failed) when the decision was asked
        while True:
            if learning:  # a first request: its timeout from its own replies
                learnt = learnt_deadline(request, started, time.monotonic(),
                                         len(replies.round_trips))
                if learnt is not None:
                    learning, deadline = False, min(deadline, learnt)
            for position, (group, attempt) in enumerate(connecting):
                if attempt is None:  # waiting for a slot: a connection given back, or a slot
                    conn = self._idle_connection(group.node)
                    if conn is not None:
                        connecting[position] = (group, given(group.node, conn))
                    else:
                        connecting[position] = (group, self._connector.connect(group.node))
            for item in [c for c in connecting if c[1] is not None and c[1].ready.is_set()]:
                connecting.remove(item)
                group, attempt = item
                assert attempt is not None
                conn = attempt.conn
                if conn is None:
                    fill_pending(group.indexes, replies, attempt.error or Unreachable(
                        "connection failed"))
                else:
                    self._send(group, conn, replies, sent, packing)
            waiting = [g for g in sent if not g.done]
            if (not waiting and not connecting) or self._closed:
                return deadline  # (closed: close() waits for it; what is unread is lost)
            answered = len(replies) - replies.count(PENDING)  # (read, or failed)
            if answered != asked_at and request.enough is not None:
                asked_at = answered  # decided: the stragglers get a grace (Silence.until)
                if decided or request.enough(replies, replies.identities):
                    now = time.monotonic()
                    decided = decided or now
                    deadline = min(deadline, self._silence.until(started, decided, now, [
                        g.node for g in waiting] + [g.node for g, _ in connecting]))
            left = deadline - time.monotonic()
            if left <= 0:
                # A reply already in a socket came in time, even if this thread (many
                # threads, one GIL) is only now looking: read what is there, then stop.
                self._last_reads([g for g in waiting if has_input(g.conn)], replies)
                return deadline
            ready: list[Group] = []
            if waiting:
                # Wake for a reply, or every few ms while a connection is still opening.
                # A group whose reply is still incomplete is read again only when more
                # of it arrived: it never holds up the other nodes' replies.
                ready = _readable(waiting, min(left, 0.002 if connecting
                                                     else _CLOSE_NOTICED))
            else:
                first = connecting[0][1]
                if first is not None:
                    first.ready.wait(min(left, 0.002))
                else:
                    time.sleep(min(left, 0.002))
            for group in ready:
                self._read(group, replies)

    def _last_reads(self, groups: list[Group], replies: Replies) -> None:
        """At the deadline, the groups whose replies were arriving: what of them comes
        within _LAST_READ is read (a thread starved of the GIL needs more than the read
        itself), each group as its bytes come, none waiting for another."""
        until = time.monotonic() + _LAST_READ
        while groups:
            for group in groups:
                self._read(group, replies)
            groups = [g for g in groups if not g.done]
            left = until - time.monotonic()
            if not groups or left <= 0 or self._closed:
                return
            if not _readable(groups, left):
                return

    def _send(self, group: Group, conn: Connection, replies: Replies, sent: list[Group],
              packing: Packing) -> None:
        group.conn = conn
        try:
            # A new connection: identify the server first, and send script bodies (the
            # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
            new = not conn.identified
            data = packing.calls(group.calls, evalsha=not new)
            if new and self.identify is not None:
                group.probed = True
                data = resp.pack_one(self.identify) + data
            send(conn, data)
            group.sent_at = time.monotonic()
            self._silence.owed(group.node, group.sent_at)
            sent.append(group)
        except Exception as exc:
            self._failed(group, replies, exc)

    def _failed(self, group: Group, replies: Replies, exc: Exception) -> None:
        """Writing or reading the group's calls failed: they get ``exc``; closed. On a new
        connection that never answered, as if the connection had failed (Refusals: a
        host that accepts and resets is refusing)."""
        fill_pending(group.indexes, replies, exc)
        group.done = True
        self._silence.failed(group.node, exc)
        if not group.conn.identified:
            self._connector.refusals.failed(group.node, exc, time.monotonic())
        self._discard(group.node, group.conn)

    def _read(self, group: Group, replies: Replies) -> None:
        """Read what has come of the group's replies, without waiting: done, failed (and
        closed), or not complete yet (read on when more arrives; the rest is read in the
        background if the request ends without it)."""
        conn = group.conn
        try:
            if group.probed and group.identity is PENDING:
                identity = receive(conn)
                if identity is NOTHING:
                    return
                group.identity = identity
                # Known now (an error, a server still LOADING: asked again).
                conn.identified = not isinstance(identity, BaseException)
                self._connector.refusals.connected(group.node)  # it answered (Refusals)
                # Among the replies at once: this request's own early decision must not
                # count a restarted node's grant.
                replies.identities[group.node] = group.identity
            for index in group.indexes:
                if replies[index] is not PENDING or index in group.unknown:
                    continue  # read already
                reply = receive(conn)
                if reply is NOTHING:
                    return
                if not group.sampled:
                    group.sampled = True
                    self._silence.heard(group.node)
                    replies.round_trips[group.node] = time.monotonic() - group.sent_at
                if is_noscript(reply):  # SCRIPT FLUSH since: send the body
                    group.unknown.append(index)
                else:
                    replies[index] = reply
            if group.unknown and not group.resent:
                group.send_bodies()
            while group.unknown:
                reply = receive(conn)
                if reply is NOTHING:
                    return
                replies[group.unknown.pop(0)] = reply
        except Exception as exc:
            self._failed(group, replies, exc)
            return
        finally:
            conn.readable = False  # (select()'s word is good for one recv())
        group.done = True
        self._give_back(group.node, conn, group.lane)

    # -- connections ---------------------------------------------------------------

    def _idle_connections(self, groups: list[Group]) -> list[tuple[Group, Connection | None]]:
        """An open connection (or None) for each group's node, as _idle_connection, with
        one readability check for all of them (one system call, not one per node)."""
        picked = [(group, self._idle_connection(group.node, group.lane, check=False))
                  for group in groups]
        unasked = with_input([conn for _, conn in picked if conn is not None])
        if not unasked:
            return picked
        checked = []
        for group, conn in picked:
            if conn is not None and conn in unasked:
                # The server closed it while it sat idle (it restarted), or sent what
                # nobody asked for: nothing is written on it; closed, another is tried.
                self._discard(group.node, conn)
                conn = self._idle_connection(group.node, group.lane)
            checked.append((group, conn))
        return checked

    def _idle_connection(self, node: int, lane: str | None = None, *,
                         check: bool = True) -> Connection | None:
        """An open connection from the pool (or the lane), without connecting (None if
        there is none)."""
        if lane is not None:  # the lane's own; the first time, one from the pool
            with self._mutex:
                kept = self._lanes.setdefault(lane, [[] for _ in self.endpoints])[node]
                while kept:
                    conn = kept.pop()
                    if conn.sock is not None:
                        return conn
        return self._idle.take(node, check=check)

    def _hand_back(self, attempt: Connect) -> None:
        """A connection its request gave up on: its late releases go out on it (read by
        the drainer, which then gives it back), else it joins the pool at once."""
        conn, node = attempt.conn, attempt.node
        assert conn is not None  # (told only of an attempt that connected)
        if not attempt.late or self._closed:
            self._give_back(node, conn)
            return
        self._drainer.send(node, conn, attempt.late)

    def _give_back(self, node: int, conn: Connection, lane: str | None = None) -> None:
        """A connection back to its pool (first carrying the node's queued releases, if
        any), or to its lane; once the manager is closed, closed instead (a request that
        was under way when close() ran must not leave it open)."""
        if lane is not None and not self._closed:
            with self._mutex:
                self._lanes.setdefault(lane, [[] for _ in self.endpoints])[node].append(conn)
            return
        calls = [] if self._closed else self._drainer.take_queued(node)
        if calls:
            self._drainer.send(node, conn, calls)
            return
        if self._closed:
            self._discard(node, conn)
            return
        self._idle.put(node, conn)

    @staticmethod
    def _discard(node: int, conn: Connection | None) -> None:
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection; the drainer and the threads still opening connections
        end before this returns (each within its budget: a close leaves no thread)."""
        with self._mutex:
            self._closed = True
            # Requests under way notice within _CLOSE_NOTICED and end: their sockets
            # must be closed below, not after this returns.
            self._idle_now.wait_for(lambda: not self._under_way,
                                   timeout=2 * self.connect_timeout)
        threads = self._connector.close()  # (a request that ended meanwhile: its too)
        self._drainer.close()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(self.connect_timeout + 0.1)
        self._idle.close()
        with self._mutex:
            lanes, self._lanes = self._lanes, {}
        for stacks in lanes.values():
            for stack in stacks:
                while stack:
                    stack.pop().close()


def _readable(groups: list[Group], wait: float) -> list[Group]:
    """The groups whose connections have bytes to read, waiting up to ``wait`` for one
    (their next recv needs no select() first)."""
    ready = {id(conn) for conn in wait_readable([g.conn for g in groups], wait)}
    return [g for g in groups if id(g.conn) in ready]
