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

import contextlib
import select
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import NoScriptError
from redis.retry import Retry

from redlock._core.requests import Broadcast, Call, CommandArg, Replies
from redlock._io.nodes import build_pool, check_node_list, node_labels, pool_overrides
from redlock._io.wire import (
    NOT_AWAITED,
    PENDING,
    SENT_LATE,
    STRAGGLER_GRACE_MIN,
    Late,
    LateConnections,
    fill_pending,
    late_sendable,
    render,
)
from redlock._scripts import lock as scripts


class _Group:
    """The calls of one request for one node, sent on one connection (pipelined)."""

    __slots__ = ("calls", "conn", "done", "identity", "indexes", "lane", "node", "probed",
                 "resent", "sampled", "sent_at", "unknown")

    def __init__(self, node: int, lane: str | None = None) -> None:
        self.node = node
        self.lane = lane  # its request's lane of connections (None: the shared ones)
        self.indexes: list[int] = []
        self.calls: list[Call] = []
        self.conn: Any = None
        self.probed = False  # a new connection: the identity probe went first
        self.identity: object = PENDING
        self.done = False
        self.sent_at = 0.0
        self.sampled = False  # its round trip was measured
        self.unknown: list[int] = []  # answered NOSCRIPT: sent again with the body
        self.resent = False


def _groups(request: Broadcast) -> list[_Group]:
    by_node: dict[int, _Group] = {}
    for index, call in enumerate(request.calls):
        group = by_node.get(call.node)
        if group is None:
            group = by_node[call.node] = _Group(call.node, request.lane)
        group.indexes.append(index)
        group.calls.append(call)
    return list(by_node.values())


def _readable(conn: Any) -> bool:
    """Something to read (or a broken connection: reading it says why)."""
    try:
        return bool(conn.can_read(timeout=0))
    except Exception:
        return True


def _is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the socket itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._sock


def _given(node: int, conn: Any) -> _Connect:
    """A connection found idle while waiting for a slot: as if opened for this request."""
    attempt = _Connect(node)
    attempt.conn = conn
    attempt.ready.set()
    return attempt


class _Connect:
    """A connection one request is opening in the background, with its own budget. If
    the request stops waiting, the connection joins the pool when it is ready: the
    next request finds it warm. A request of releases that stopped waiting still has
    them sent on it then (``late``): nothing else would free those keys before their TTL,
    and a release touches only its owner's key (the asyncio transport does the same)."""

    def __init__(self, node: int) -> None:
        self.node = node
        self.ready = threading.Event()
        self.conn: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.late: list[Call] = []  # releases to send once connected (the request is over)
        self.mutex = threading.Lock()


# Connections opening at once per node: a hung node does not collect threads. A request
# that needs one beyond this waits (polling every 2 ms) for a slot, or a connection given
# back, until its deadline: it never fails at once, so a burst of threads on healthy
# nodes (64 threads' first requests, or after a restart) is served.
_CONNECTS_PER_NODE = 16
# A request under way notices close() within this (it ends, and close() waits for it).
_CLOSE_NOTICED = 0.05
# Final releases queued per node for its next free connection, at most.
_QUEUED_PER_NODE = 1024
# At the deadline, how long reading the replies that are already arriving may take: a
# thread starved of the GIL (the switch interval is 5 ms, and dozens of threads wait)
# needs more than the read itself.
_LAST_READ = 0.05


class SyncTransport:
    """One connection pool per node, and scatter/gather over raw connections."""

    def __init__(self, nodes: Iterable[str | redis.Redis], connect_timeout: float,
                 identify: tuple[CommandArg, ...] | None = None) -> None:
        # ``identify``: the command sent first on every new connection (IDENTIFY, docs/
        # design.md §4.4); its reply is returned with the request's (Replies.identities).
        self.identify = identify
        # Our reads carry their own timeouts: the pools' socket timeout bounds only the
        # connection's handshake (and a send that cannot proceed), like connecting.
        overrides = pool_overrides(connect_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.Redis, "redis.Redis")
        self.pools: list[redis.ConnectionPool] = [
            build_pool(node, redis.ConnectionPool, parse_url, overrides) for node in items]
        self.addresses = node_labels(items)
        self.items = items  # the nodes as given (a forked child builds its own pools)
        self.connect_timeout = connect_timeout
        self._late: LateConnections[Any] = LateConnections(len(self.pools))
        self._connects = [0] * len(self.pools)  # opening now, per node
        self._opening: set[threading.Thread] = set()  # their threads (close() joins them)
        # Per node, final releases whose request ended before any connection was free:
        # sent on the next connection to that node that is given back (bounded).
        self._queued: list[list[Call]] = [[] for _ in self.pools]
        # Lanes (redlock._core.requests.Broadcast.lane): per lane and node, its connections,
        # checked out of the pool and kept aside.
        self._lanes: dict[str, list[list[Any]]] = {}
        self._mutex = threading.Lock()
        self._drainer: threading.Thread | None = None
        self._closed = False
        self._active = 0  # requests under way (close() waits for them to end)
        self._idle_now = threading.Condition(self._mutex)
        # The call sent first on every new connection, and who is told the replies
        # (node -> reply) before the request's replies are returned (set by the manager).

    # -- a request ---------------------------------------------------------------

    def broadcast(self, request: Broadcast) -> list[object]:
        """Every call's reply or exception (NOT_AWAITED for those the request was
        decided without). Calls for one node share one connection and one write."""
        with self._mutex:
            if self._closed:  # a thread or background protocol racing the manager's close
                return [redis.ConnectionError("the manager is closed")] * len(request.calls)
            self._active += 1  # close() waits for the requests under way
        try:
            return self._broadcast(request)
        finally:
            with self._mutex:
                self._active -= 1
                if not self._active:
                    self._idle_now.notify_all()

    def _broadcast(self, request: Broadcast) -> list[object]:
        if self._late.any():
            self._trail_releases(request)
        deadline = time.monotonic() + request.timeout
        replies = Replies([PENDING] * len(request.calls))
        groups = _groups(request)
        sent: list[_Group] = []
        # Nodes without an open connection: opening one in the background, or (None)
        # waiting for a free slot to open one, or for a connection given back.
        connecting: list[tuple[_Group, _Connect | None]] = []
        try:
            for group in groups:  # scatter: nodes with an open connection at once
                conn = self._idle_connection(group.node, group.lane)
                if conn is not None:
                    self._send(group, conn, replies, sent)
                else:
                    connecting.append((group, self._connect(group.node,
                                                            anyway=group.lane is not None)))
            self._gather(request, replies, sent, connecting, deadline)
        finally:
            decided = request.enough is not None and request.enough(replies,
                                                                    replies.identities)
            for group, attempt in connecting:  # still connecting: it joins the pool later
                if attempt is None:
                    queued = self._queue_late(group.node, group.calls)
                    fill_pending(group.indexes, replies, SENT_LATE if queued else
                                 redis.TimeoutError(
                                     f"no connection: {_CONNECTS_PER_NODE} were still opening"))
                    continue
                late = self._abandon(attempt, group.calls)
                fill_pending(group.indexes, replies, SENT_LATE if late else redis.TimeoutError(
                    f"still connecting (connect_timeout {self.connect_timeout:g} s)"))
            for group in sent:
                if not group.done:  # decided without it, timed out or interrupted
                    unread = (sum(1 for i in group.indexes if replies[i] is PENDING)
                              + (group.probed and group.identity is PENDING)
                              - (len(group.unknown) if not group.resent else 0))
                    fill_pending(group.indexes, replies, NOT_AWAITED if decided else
                               redis.TimeoutError("Timeout reading from socket"))
                    self._keep_late(group, unread)
        return replies

    def _gather(self, request: Broadcast, replies: Replies, sent: list[_Group],
                connecting: list[tuple[_Group, _Connect | None]], deadline: float) -> None:
        started, decided = time.monotonic(), False
        while True:
            if not decided and request.enough is not None and request.enough(
                    replies, replies.identities):
                # Decided: the stragglers get as long again as the decision took (all of
                # a healthy cluster's replies come in together), then no longer.
                decided = True
                now = time.monotonic()
                deadline = min(deadline, now + max(now - started, STRAGGLER_GRACE_MIN))
            for position, (group, attempt) in enumerate(connecting):
                if attempt is None:  # waiting for a slot: a connection given back, or a slot
                    conn = self._idle_connection(group.node)
                    if conn is not None:
                        connecting[position] = (group, _given(group.node, conn))
                    else:
                        connecting[position] = (group, self._connect(group.node))
            for item in [c for c in connecting if c[1] is not None and c[1].ready.is_set()]:
                connecting.remove(item)
                group, attempt = item
                assert attempt is not None
                conn = attempt.conn
                if conn is None:
                    fill_pending(group.indexes, replies, attempt.error or redis.ConnectionError(
                        "connection failed"))
                else:
                    self._send(group, conn, replies, sent)
            waiting = [g for g in sent if not g.done]
            if (not waiting and not connecting) or self._closed:
                return  # (closed: close() waits for this request; what is unread is lost)
            left = deadline - time.monotonic()
            if left <= 0:
                # A reply already in a socket came in time, even if this thread (many
                # threads, one GIL) is only now looking: read what is there, then stop.
                for group in [g for g in waiting if _readable(g.conn)]:
                    self._read(group, replies, time.monotonic() + _LAST_READ)
                return
            ready = [g for g in waiting if _readable(g.conn)]
            if not ready and waiting:
                # Wake for a reply, or every few ms while a connection is still opening.
                wait = min(left, 0.002 if connecting else _CLOSE_NOTICED)
                try:
                    readable, _, _ = select.select([g.conn._sock for g in waiting], [], [],
                                                   wait)
                    ready = [g for g in waiting if g.conn._sock in readable]
                except (OSError, TypeError, ValueError):  # a socket closed under us
                    ready = waiting
            elif not waiting:
                first = connecting[0][1]
                if first is not None:
                    first.ready.wait(min(left, 0.002))
                else:
                    time.sleep(min(left, 0.002))
            for group in ready:
                self._read(group, replies, deadline)

    def _send(self, group: _Group, conn: Any, replies: Replies,
              sent: list[_Group]) -> None:
        group.conn = conn
        try:
            # A new connection: identify the server first, and send script bodies (the
            # server may be new, or restarted: EVALSHA would cost a NOSCRIPT round trip).
            new = _is_new(conn)
            commands = [render(call, evalsha=not new) for call in group.calls]
            if new and self.identify is not None:
                group.probed = True
                commands.insert(0, self.identify)
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            group.sent_at = time.monotonic()
            sent.append(group)
        except Exception as exc:
            fill_pending(group.indexes, replies, exc)
            group.done = True
            self._discard(group.node, conn)

    def _read(self, group: _Group, replies: Replies, deadline: float) -> None:
        """Read the group's replies (they are arriving): done, failed (and closed), or
        not complete at the deadline (the rest is read later, or in the background)."""
        conn = group.conn
        try:
            if group.probed and group.identity is PENDING:
                group.identity = self._read_one(conn, deadline)
                conn._redlock_identified = conn._sock  # this connection is known now
                # Among the replies at once: this request's own early decision must not
                # count a restarted node's grant.
                replies.identities[group.node] = group.identity
            for index in group.indexes:
                if replies[index] is not PENDING or index in group.unknown:
                    continue  # read already, before a timeout
                reply = self._read_one(conn, deadline)
                if not group.sampled:
                    group.sampled = True
                    replies.round_trips[group.node] = time.monotonic() - group.sent_at
                if isinstance(reply, NoScriptError):  # SCRIPT FLUSH since: send the body
                    group.unknown.append(index)
                else:
                    replies[index] = reply
            if group.unknown and not group.resent:
                group.resent = True
                by_index = dict(zip(group.indexes, group.calls, strict=True))
                conn.send_packed_command(conn.pack_commands(
                    [render(by_index[i], evalsha=False) for i in group.unknown]),
                    check_health=False)
            while group.unknown:
                replies[group.unknown[0]] = self._read_one(conn, deadline)
                group.unknown.pop(0)
        except redis.TimeoutError:
            return  # not done: kept (late) if the request ends without it
        except Exception as exc:
            fill_pending(group.indexes, replies, exc)
            group.done = True
            self._discard(group.node, conn)
            return
        group.done = True
        self._give_back(group.node, conn, group.lane)

    @staticmethod
    def _read_one(conn: Any, deadline: float) -> object:
        """One reply; an error reply is returned, not raised (it is that call's result)."""
        try:
            return conn.read_response(timeout=max(deadline - time.monotonic(), 0.0005),
                                      disconnect_on_error=False)
        except redis.ResponseError as exc:
            return exc

    # -- connections ---------------------------------------------------------------

    @staticmethod
    def _has_idle(pool: redis.ConnectionPool) -> bool:
        idle = getattr(pool, "_available_connections", None)
        try:
            newest = idle[-1] if idle else None  # the one get_connection() pops next
        except IndexError:  # another thread took it meanwhile
            return False
        return getattr(newest, "_sock", None) is not None

    def _idle_connection(self, node: int, lane: str | None = None) -> Any:
        """An open connection from the pool (or the lane), without connecting (None if
        there is none)."""
        if lane is not None:  # the lane's own; the first time, one from the pool
            with self._mutex:
                kept = self._lanes.setdefault(lane, [[] for _ in self.pools])[node]
                while kept:
                    conn = kept.pop()
                    if getattr(conn, "_sock", None) is not None:
                        return conn
        pool = self.pools[node]
        if not self._has_idle(pool):
            return None
        try:
            return pool.get_connection()  # may still reconnect if it raced: rare, bounded
        except Exception:
            return None

    def _connect(self, node: int, *, anyway: bool = False) -> _Connect | None:
        """A connection to ``node`` opening in the background for one request (None when
        too many are opening already: the node is slow to accept or to handshake;
        ``anyway``: a lane's, which does not wait for a slot)."""
        attempt = _Connect(node)

        def run() -> None:
            try:
                attempt.conn = self.pools[node].get_connection()
            except Exception as exc:
                attempt.error = exc
            finally:
                with self._mutex:
                    self._connects[node] -= 1
            with attempt.mutex:
                attempt.ready.set()
                abandoned = attempt.abandoned
            if abandoned and attempt.conn is not None:
                self._hand_back(attempt)  # warm, for the next request
            with self._mutex:
                self._opening.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="redlock-connect", daemon=True)
        with self._mutex:
            if self._closed or (self._connects[node] >= _CONNECTS_PER_NODE and not anyway):
                return None  # (closed: close() has collected the threads it waits for)
            self._connects[node] += 1
            self._opening.add(thread)
        thread.start()
        return attempt

    def _abandon(self, attempt: _Connect, calls: list[Call] | None = None) -> bool:
        """The request gives up on the connection: to the pool now, or when ready (with
        ``calls`` sent on it first if they are all final releases: True)."""
        with attempt.mutex:
            attempt.abandoned = True
            late = list(calls or ())
            attempt.late = late if late and all(
                call.script is scripts.RELEASE and late_sendable(call) for call in late) else []
            ready = attempt.ready.is_set()
        if ready and attempt.conn is not None:
            self._hand_back(attempt)
        return bool(attempt.late)

    def _hand_back(self, attempt: _Connect) -> None:
        """A connection its request gave up on: its late releases go out on it (read by
        the drainer, which then gives it back), else it joins the pool at once."""
        conn, node = attempt.conn, attempt.node
        if not attempt.late or self._closed:
            self._give_back(node, conn)
            return
        self._send_late(node, conn, attempt.late)

    def _give_back(self, node: int, conn: Any, lane: str | None = None) -> None:
        """A connection back to its pool (first carrying the node's queued releases, if
        any), or to its lane; once the manager is closed, closed instead (a request that
        was under way when close() ran must not leave it open)."""
        if lane is not None and not self._closed:
            with self._mutex:
                self._lanes.setdefault(lane, [[] for _ in self.pools])[node].append(conn)
            return
        if self._queued[node] and not self._closed:
            with self._mutex:
                calls, self._queued[node] = self._queued[node], []
            if calls:
                self._send_late(node, conn, calls)
                return
        self.pools[node].release(conn)
        if self._closed:
            self._discard(node, conn)

    def _queue_late(self, node: int, calls: list[Call]) -> bool:
        """Queue final releases for the node's next free connection (True), when every
        call is one (see redlock._io.wire.late_sendable)."""
        if not all(call.script is scripts.RELEASE and late_sendable(call) for call in calls):
            return False
        with self._mutex:
            queue = self._queued[node]
            queue.extend(calls)
            del queue[:-_QUEUED_PER_NODE]  # the oldest go first: their keys expire by TTL
        return True

    def _send_late(self, node: int, conn: Any, calls: list[Call]) -> None:
        """Send calls nobody waits for on ``conn``: the drainer reads the replies, then
        gives the connection back."""
        try:
            conn.send_packed_command(conn.pack_commands(
                [render(call, evalsha=False) for call in calls]), check_health=False)
        except Exception:
            self._discard(node, conn)
            return
        self._keep_conn_late(node, conn, calls, len(calls))

    def _discard(self, node: int, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.disconnect()
        with contextlib.suppress(Exception):
            self.pools[node].release(conn)

    # -- late connections (see redlock._io.wire) ---------------------------------

    def _keep_late(self, group: _Group, unread: int) -> None:
        self._keep_conn_late(group.node, group.conn, group.calls, unread)

    def _keep_conn_late(self, node: int, conn: Any, calls: list[Call], unread: int) -> None:
        if getattr(conn, "_sock", None) is None or self._closed:
            self._discard(node, conn)
            return
        evicted = self._late.add(Late(conn, node, calls, unread,
                                      time.monotonic() + self.connect_timeout))
        if evicted is not None:
            self._dispose(evicted, give_back=False)
        with self._mutex:
            drainer = self._drainer
            if self._closed or (drainer is not None and (drainer.ident is None
                                                         or drainer.is_alive())):
                return  # running, or about to start (closed: close() drains what is left)
            drainer = self._drainer = threading.Thread(target=self._drain,
                                                       name="redlock-drain", daemon=True)
        # Started outside the lock: starting a thread waits for it, and no lock of ours is
        # held across a wait (under gevent a waiting greenlet holding it stops everyone).
        drainer.start()

    def _trail_releases(self, request: Broadcast) -> None:
        """Write each release behind the unanswered acquires of the same owner."""
        for call in request.calls:
            for late in self._late.behind(call):
                with late.mutex, contextlib.suppress(Exception):  # the normal release too
                    if late.closed:
                        continue
                    late.conn.send_command(*render(call, evalsha=False), check_health=False)
                    late.outstanding += 1

    def _drain(self) -> None:
        """Read late replies as they arrive; a drained connection goes back to the pool,
        one past its deadline (the node is hung) is closed. Ends when none is left."""
        while not self._closed:
            entries = self._late.entries()
            if not entries:
                with self._mutex:
                    if not self._late.any():
                        self._drainer = None
                        return
                continue
            now = time.monotonic()
            for late in [e for e in entries if e.deadline <= now or e.conn._sock is None]:
                self._dispose(late, give_back=False)  # past its deadline (hung), or broken
            live = [e for e in entries if not e.closed and e.deadline > now
                    and e.conn._sock is not None]
            if not live:
                continue
            with contextlib.suppress(Exception):
                readable, _, _ = select.select([e.conn._sock for e in live], [], [], 0.05)
                for late in (e for e in live if e.conn._sock in readable):
                    self._drain_one(late)

    def _drain_one(self, late: Late[Any]) -> None:
        with late.mutex:
            if late.closed:  # evicted, or past its deadline: no longer ours to read
                return
            try:
                while late.outstanding and late.conn.can_read(timeout=0):
                    late.conn.read_response(timeout=0.05, disconnect_on_error=False)
                    late.outstanding -= 1
            except redis.ResponseError:
                late.outstanding -= 1
            except Exception:
                late.outstanding = -1  # broken: close it
            if late.outstanding > 0:
                return
        self._dispose(late, give_back=late.outstanding == 0)

    def _dispose(self, late: Late[Any], *, give_back: bool) -> None:
        """Done with a late connection: back to the pool (everything read) or closed.
        Whoever marks it closed, under its lock, disposes of it, exactly once: given
        back twice, a connection could be handed to two requests at once, and one would
        read the other's replies (seen: a release got an IDENTIFY reply, another the
        reply of a handshake's CLIENT SETINFO), and the drainer must never read from a
        connection the pool has given to another request since."""
        with late.mutex:
            if late.closed or (give_back and late.outstanding):
                return  # disposed of already; or a release was written behind meanwhile
            late.closed = True
        self._late.remove(late)
        if give_back:
            self._give_back(late.node, late.conn)
        else:
            self._discard(late.node, late.conn)

    def close(self) -> None:
        """Close every connection; the drainer and the threads still opening connections
        end before this returns (each within its budget: a close leaves no thread)."""
        with self._mutex:  # against _connect and _keep_conn_late starting threads
            self._closed = True
            # Requests under way notice within _CLOSE_NOTICED and end: their sockets
            # must be closed below, not after this returns.
            self._idle_now.wait_for(lambda: not self._active, timeout=2 * self.connect_timeout)
            threads = [self._drainer, *self._opening]
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(self.connect_timeout + 0.1)
        for late in self._late.drain():
            self._discard(late.node, late.conn)
        for pool in self.pools:
            pool.disconnect()
