"""The sync transport: parallel requests to N nodes from one thread, on one route (docs/design.md
§2.4).

Scatter: each node's calls written with one write on a connection from its stack of idle ones;
gather: one ``select`` over the sockets, each reply parsed as its bytes come. A request returns
once its replies are in, or decide it (the stragglers' grace, :class:`~redlock._io.wire.Gathering`),
or at its deadline, leaving the rest to the drainer (:mod:`redlock._io.sync_drainer`). Everything
else is a branch of this route: new connections opened in the background
(:mod:`redlock._io.sync_connect`), NOSCRIPT, replies half received, an interruption (every
connection is left in the pool, with the drainer, or closed), and on a cluster node, calls
routed to the master of their hash slot and redirects followed (:mod:`redlock._io.routing`):
every per-connection list is indexed by *target*, a node or a cluster node's master."""

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
    ask,
    has_input,
    open_connection,
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
from redlock._io.routing import UNROUTED, Routes, slot_map_command
from redlock._io.sync_connect import CONNECTS_PER_TARGET, Connect, Connector, given
from redlock._io.sync_drainer import SyncDrainer
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
    Exchange,
    Gathering,
    Packing,
    Silence,
    exchanges_of,
    fill_pending,
    follow,
    run_of,
    with_run,
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

# The connections of a request still opening: its Connect, or None while it waits for a
# free slot (or a connection given back).
Connecting = list[tuple[Exchange, Connect | None]]
# A request's exchanges to write later (a hash slot migrating: TRYAGAIN), with when.
Later = list[tuple[float, Exchange]]


class SyncTransport:
    """Connections to each node, and scatter/gather over them."""

    def __init__(self, endpoints: Sequence[Endpoint], addresses: Sequence[str],
                 connect_timeout: float, identify: tuple[CommandArg, ...] | None = None) -> None:
        # ``identify``: the command sent first on every new connection (IDENTIFY, docs/
        # design.md §4.4); its reply is returned with the request's (Replies.identities).
        self.identify = identify
        self._probe = resp.pack_one(identify) if identify is not None else None
        self.endpoints = list(endpoints)
        self.addresses = list(addresses)
        # Connecting and logging in are bounded by this (and so is a send that cannot
        # proceed); reads carry each request's own deadline.
        self.connect_timeout = connect_timeout
        self._mutex = threading.Lock()
        # The targets: the nodes, then cluster nodes' masters as they are found (_grow).
        self._routes = Routes(self.endpoints, self._grow)
        self._mapping: set[threading.Thread] = set()  # hash slot maps being read again
        targets = self._routes.endpoints
        self._acks = [endpoint.replica_acks for endpoint in targets]
        n = len(targets)
        self._silence = Silence(n)  # the targets that stopped answering
        # Replies owed on connections nobody waits on any more; queued final releases.
        self._drainer = SyncDrainer(n, connect_timeout, give_back=self._give_back,
                                    discard=_discard, silence=self._silence)
        self._connector = Connector(targets, connect_timeout, self._silence,
                                    self._connected_late)
        # Per target, the idle connections: a stack, so that those a burst opened stay at
        # its bottom, where the shrink looks (_put_idle); push and pop need no lock.
        self._idle: list[list[Connection]] = [[] for _ in range(n)]
        self._shrinking = threading.Lock()
        # Lanes (Broadcast.lane): per lane and target, its connections, kept aside.
        self._lanes: dict[str, list[list[Connection]]] = {}
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
            routes = self._routes
            if self._drainer.late.total:  # releases go behind unanswered acquires of
                self._drainer.trail_releases(request, routes.target_of)  # their lock value
            started = time.monotonic()
            if routes.clustered:  # each cluster node's hash slot map, read if unknown
                unknown, stale = routes.unread(request.calls)
                for node in unknown:  # (within the request's deadline: a failure leaves
                    self._read_map(node, started + request.timeout)  # its calls unrouted)
                if stale:
                    self._refresh()
            replies = Replies([PENDING] * len(request.calls))
            exchanges = exchanges_of(request.calls, replies, request.lane, Exchange,
                                     request.timeout, routes)
            gathering = Gathering(request, replies, started, started + request.timeout,
                                  self._silence)
            waiting: dict[Any, Exchange] = {}  # socket -> the exchange owed replies on it
            connecting: Connecting = []
            try:
                packing = self._scatter(request, exchanges, waiting, connecting)
                if waiting or connecting:
                    self._gather(gathering, exchanges, waiting, connecting, packing,
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
                    conn = idle[exchange.target].pop()
                except IndexError:  # (another thread may take the last one: no look first)
                    conn = None
                if conn is not None and conn.sock is None:
                    conn = self._take_idle(exchange.target)
            elif exchange.target != UNROUTED:
                conn = self._take_idle(exchange.target, lane)
            if conn is None:
                self._open(exchange, connecting)
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
                    exchange.conn = self._take_idle(exchange.target, lane, check=True)
                    if exchange.conn is None:
                        self._open(exchange, connecting)
                        continue
                self._send(exchange, packing, waiting)
        return packing

    def _open(self, exchange: Exchange, connecting: Connecting) -> None:
        """The exchange's connection, opening (a cluster node's call whose hash slot has
        no known master fails instead)."""
        if exchange.target == UNROUTED:
            exchange.fail(Unreachable(self._routes.unrouted(exchange.node)))
            return
        connecting.append((exchange, self._connector.connect(
            exchange.target, anyway=exchange.lane is not None)))

    def _start(self, exchange: Exchange, packing: Packing, waiting: dict[Any, Exchange],
               connecting: Connecting) -> None:
        """An exchange that joins its request late (a redirect followed): written on an
        idle connection of its target, or on one opening."""
        if exchange.target != UNROUTED:
            exchange.conn = self._take_idle(exchange.target, exchange.lane, check=True)
        if exchange.conn is None:
            self._open(exchange, connecting)
        else:
            self._send(exchange, packing, waiting)
    def _send(self, exchange: Exchange, packing: Packing, waiting: dict[Any, Exchange]) -> None:
        conn = exchange.conn
        if exchange.routed and conn.run is not None:  # (a cluster master's: P3.1a)
            exchange.calls = with_run(exchange.calls, conn.run)
        # A new connection: identify the server first, and send script bodies (the
        # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
        data = packing.calls(exchange.calls, conn.identified)
        acks = self._acks[exchange.target]
        if acks:  # a grant counts once replicas have it (docs/design.md §11.3)
            data += exchange.replicated(acks)
        if exchange.ask:  # a hash slot being imported: its master serves the next command
            exchange.asking = True
            data = ASKING + data
        if not conn.identified:
            probe = SERVER_PROBE if exchange.routed else self._probe
            if probe is not None:
                exchange.probed = True
                data = probe + data
        exchange.sent_at = _WRITING
        try:
            send(conn, data)
        except Exception as exc:
            self._failed(exchange, exc)
            return
        exchange.sent_at = now = time.monotonic()
        self._silence.owed(exchange.target, now)
        waiting[conn.sock] = exchange

    def _gather(self, gathering: Gathering, exchanges: list[Exchange],
                waiting: dict[Any, Exchange], connecting: Connecting, packing: Packing,
                failed: bool) -> None:
        """Read the replies as they arrive until they are in, or the request's deadline
        (moved by its decision: the stragglers' grace; see Gathering). ``failed``: some
        node's calls failed already (their write). Calls a cluster redirected join as new
        ``exchanges`` (written at once, or ``later``)."""
        finished = failed
        later: Later = []
        try:
            while True:
                if connecting and self._connected(connecting, waiting, packing):
                    finished = True
                if later:
                    finished = self._due(later, packing, waiting, connecting) or finished
                if (not waiting and not connecting and not later) or self._closed:
                    return  # (closed: close() waits for it; what is unread is lost)
                now = time.monotonic()
                left = gathering.deadline - now
                if left <= 0:
                    # A reply already in a socket came in time, even if this thread (many
                    # threads, one GIL) is only now looking: read what is there, then stop.
                    self._last_reads(waiting)
                    return
                poll = _CONNECTING_POLL if connecting else _CLOSE_NOTICED
                if later:
                    poll = min(poll, max(min(at for at, _ in later) - now, 0.0))
                if waiting:
                    # Wake for a reply, or every few ms while a connection is still opening,
                    # and to notice close(). A reply still incomplete is read on only when
                    # more of it arrived: it never holds up the other nodes' replies.
                    try:
                        ready, _, _ = select.select(list(waiting), [], [], min(left, poll))
                    except (OSError, TypeError, ValueError):  # a socket closed under us
                        ready = list(waiting)  # (reading each says why)
                    for sock in ready:
                        exchange = waiting[sock]
                        if self._read(exchange):
                            del waiting[sock]
                            finished = True
                            if exchange.redirected:
                                self._follow(exchange, gathering, exchanges, later, packing,
                                             waiting, connecting)
                elif connecting and connecting[0][1] is not None:
                    connecting[0][1].ready.wait(min(left, poll))
                else:
                    time.sleep(min(left, poll))
                if finished and (waiting or connecting or later):
                    if gathering.learn:  # a first request: its timeout from its own replies
                        gathering.learnt()
                    if gathering.enough is not None:  # decided: the stragglers' grace
                        gathering.decide(lambda: [e.target for e in waiting.values()]
                                         + [e.target for e, _ in connecting]
                                         + [e.target for _, e in later])
                finished = False
        finally:
            for _, exchange in later:  # (never written: it ran nowhere)
                exchange.fail(NotSent("its hash slot was migrating (TRYAGAIN) until the"
                                      " request's deadline"))

    def _follow(self, exchange: Exchange, gathering: Gathering, exchanges: list[Exchange],
                later: Later, packing: Packing, waiting: dict[Any, Exchange],
                connecting: Connecting) -> None:
        """A cluster redirected some of the exchange's calls: they go again, as new
        exchanges of the request (redlock._io.wire.follow)."""
        now = time.monotonic()
        for at, follower in follow(exchange, self._routes, Exchange, now, gathering.deadline):
            exchanges.append(follower)
            if at <= now:
                self._start(follower, packing, waiting, connecting)
            else:
                later.append((at, follower))
        if self._routes.stale():
            self._refresh()

    def _due(self, later: Later, packing: Packing, waiting: dict[Any, Exchange],
             connecting: Connecting) -> bool:
        """The exchanges due now are written; True when one failed at once."""
        now = time.monotonic()
        due = [item for item in later if item[0] <= now]
        failed = False
        for item in due:
            later.remove(item)
            self._start(item[1], packing, waiting, connecting)
            failed = failed or item[1].done
        return failed

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
                    if exchange.routed:
                        conn.run = run_of(reply) if conn.identified else None
                    self._connector.refusals.connected(exchange.target)  # it answered
                reply = receive_buffered(conn)
        except Exception as exc:
            self._failed(exchange, exc)
            return True
        self._silence.heard(exchange.target)
        self._give_back(exchange.target, conn, exchange.lane)
        return True

    def _failed(self, exchange: Exchange, exc: Exception) -> None:
        """Writing or reading the exchange's calls failed: they get ``exc``; closed. On a
        new connection that never answered, as if the connection had failed (Refusals: a
        host that accepts and resets is refusing)."""
        exchange.fail(exc)
        self._silence.failed(exchange.target, exc)
        if self._routes.clustered and self._routes.lost(exchange.target):
            self._refresh()  # (a cluster's master failing over)
        if not exchange.conn.identified:
            self._connector.refusals.failed(exchange.target, exc, time.monotonic())
        exchange.conn.close()

    def _connected(self, connecting: Connecting, waiting: dict[Any, Exchange],
                   packing: Packing) -> bool:
        """The request's connections still opening: those open now are written on, those
        that failed fail their calls (True when one did), and one waiting for a slot gets
        a connection given back meanwhile, or a slot."""
        for position, (exchange, attempt) in enumerate(connecting):
            if attempt is None:
                conn = self._take_idle(exchange.target, check=True)
                connecting[position] = (exchange, given(exchange.target, conn)
                                        if conn is not None
                                        else self._connector.connect(exchange.target))
        failed = False
        for item in [c for c in connecting if c[1] is not None and c[1].ready.is_set()]:
            exchange, attempt = item
            assert attempt is not None
            if attempt.conn is None:
                connecting.remove(item)
                exchange.fail(attempt.error or Unreachable("connection failed"))
                if self._routes.clustered and self._routes.lost(exchange.target):
                    self._refresh()
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
                exchange = waiting[sock]
                if self._read(exchange):
                    del waiting[sock]
                    if exchange.redirected:  # no time to follow: the redirect is the reply
                        now = time.monotonic()
                        follow(exchange, self._routes, Exchange, now, now)
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
                queued = self._drainer.queue(exchange.target, exchange.calls)
                fill_pending(exchange.indexes, replies, SENT_LATE if queued else NotSent(
                    f"no connection: {CONNECTS_PER_TARGET} were still opening"))
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
                self._give_back(exchange.target, conn, exchange.lane)
            elif exchange.sent_at == _WRITING:  # interrupted while writing: unusable
                exchange.fail(Unreachable("interrupted while writing"))
                conn.close()
            else:  # decided without it, timed out or interrupted: the rest is read late
                fill_pending(exchange.indexes, replies, NOT_AWAITED if decided else NoReply(
                    f"no reply within {waited * 1000:.0f} ms"))
                self._drainer.keep(exchange.target, conn, exchange.calls, exchange.owed())

    # -- cluster nodes ---------------------------------------------------------------

    def _read_map(self, node: int, until: float) -> None:
        """Read cluster node ``node``'s hash slot map (one reading at a time: another
        thread's is waited for, within ``until``), from its masters or the server it was
        given as, whichever answers first."""
        routes = self._routes
        reading = routes.reading[node]
        if not reading.acquire(timeout=max(until - time.monotonic(), 0.0)):
            return
        try:
            if not routes.to_read(node):  # read meanwhile
                return
            for source, left in routes.readings(node, until, self.connect_timeout):
                if self._closed:
                    return
                try:
                    conn = open_connection(source, left)
                    try:
                        reply = ask(conn, slot_map_command(), time.monotonic() + left)
                    finally:
                        conn.close()
                except Exception as exc:  # (the next source; the calls say why if none)
                    reply = exc
                if routes.answered(node, source, reply):
                    return
        finally:
            reading.release()

    def _refresh(self) -> None:
        """The stale hash slot maps read again in a thread of their own (one at a time),
        within the connect budget; requests go on with the owners MOVED named."""
        with self._mutex:
            if self._mapping or self._closed:
                return
            stale = self._routes.remap_due()
            if not stale:
                return
            thread = threading.Thread(target=self._refreshing, args=(stale,),
                                      name="redlock-slot-map", daemon=True)
            self._mapping.add(thread)
        thread.start()

    def _refreshing(self, stale: list[int]) -> None:
        try:
            for node in stale:
                self._read_map(node, time.monotonic() + self.connect_timeout)
        finally:
            with self._mutex:
                self._mapping.discard(threading.current_thread())

    def _grow(self, endpoint: Endpoint) -> None:
        """A cluster node's master was found: a target more (Routes calls this under its
        lock, after appending ``endpoint`` to the targets and before routing to it)."""
        self._idle.append([])
        self._acks.append(endpoint.replica_acks)
        self._silence.grow()
        self._connector.grow()
        self._drainer.grow()
        with self._mutex:
            for stacks in self._lanes.values():
                stacks.append([])

    # -- connections ---------------------------------------------------------------

    def _take_idle(self, target: int, lane: str | None = None, *,
                   check: bool = False) -> Connection | None:
        """An open connection from the target's stack (or the lane's; the first time, one
        from the stack), without connecting: None if there is none. ``check``: and with
        nothing to read in it (see _scatter, which looks at all of a request's at once)."""
        if lane is not None:
            with self._mutex:
                kept = self._lanes.setdefault(lane, [[] for _ in self._routes.endpoints])[target]
                while kept:
                    conn = kept.pop()
                    if conn.sock is not None:
                        return conn
        stack = self._idle[target]
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
        conn, target = attempt.conn, attempt.target
        assert conn is not None  # (told only of an attempt that connected)
        if not attempt.late or self._closed:
            self._give_back(target, conn)
            return
        self._drainer.send(target, conn, attempt.late)

    def _give_back(self, target: int, conn: Connection, lane: str | None = None) -> None:
        """A connection back to its target's stack (first carrying the target's queued
        releases) or its lane; closed instead once the manager is. Ones unused for
        IDLE_KEPT_FOR close."""
        if self._closed:
            conn.close()
            return
        if lane is not None:
            with self._mutex:
                stacks = self._lanes.setdefault(lane, [[] for _ in self._routes.endpoints])
                stacks[target].append(conn)
            return
        drainer = self._drainer
        if drainer.queued[target]:
            calls = drainer.take_queued(target)
            if calls:
                drainer.send(target, conn, calls)
                return
        stack = self._idle[target]
        now = conn.idle_since = time.monotonic()
        stack.append(conn)
        try:
            oldest = stack[0]
        except IndexError:  # taken meanwhile
            return
        if now - oldest.idle_since > IDLE_KEPT_FOR:
            self._shrink(target, now)

    def _shrink(self, target: int, now: float) -> None:
        stale = []
        stack = self._idle[target]
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
        with self._mutex:
            threads += list(self._mapping)
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
