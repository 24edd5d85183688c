"""The sync transport's background reader (see :mod:`redlock._io.wire`): one thread reads the
replies still owed on connections whose request ended, then gives them back (or closes them past
their deadline). Releases go behind unanswered acquires of their lock value (``trail_releases``);
final releases that found no free connection wait for the next one given back (``queue``)."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from redlock._core.requests import Broadcast, Call
from redlock._io import resp
from redlock._io.connection import NOTHING, Connection, receive
from redlock._io.connection import send as send_bytes
from redlock._io.wire import Late, LateConnections, Silence, late_sendable, render
from redlock._scripts import lock as scripts

# Final releases queued per target for its next free connection, at most.
_QUEUED_PER_TARGET = 1024
# The drainer's longest wait: in select() for replies, or for a late connection to come.
_IDLE_WAIT = 0.05

ConnHandler = Callable[[int, Connection], None]  # (target, connection)


class SyncDrainer:
    """Late connections of one transport, and the thread that drains them."""

    def __init__(self, count: int, connect_timeout: float, *, give_back: ConnHandler,
                 discard: ConnHandler, silence: Silence) -> None:
        self._connect_timeout = connect_timeout  # how long owed replies are waited for
        self._give_back = give_back  # to the pool (after sending any queued releases)
        self._discard = discard  # closed
        self._silence = silence  # its transport's: which nodes answer
        # (Both read by the transport on every request: ``late.total``, ``queued[target]``.)
        self.late: LateConnections[Connection] = LateConnections(count)
        # Per target, final releases whose request ended before any connection was free:
        # sent on the next connection to that target that is given back (bounded).
        self.queued: list[list[Call]] = [[] for _ in range(count)]
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._work = threading.Event()  # a late connection was added (wakes the drainer)
        self._closed = False

    # -- final releases without a connection ---------------------------------------

    def grow(self) -> None:
        """One more target (redlock._io.routing.Routes)."""
        self.late.grow()
        with self._mutex:
            self.queued.append([])

    def queue(self, target: int, calls: Sequence[Call]) -> bool:
        """Queue final releases for the target's next free connection (True), when every
        call is one (see redlock._io.wire.late_sendable)."""
        if not all(call.script is scripts.RELEASE and late_sendable(call) for call in calls):
            return False
        with self._mutex:
            queue = self.queued[target]
            queue.extend(calls)
            del queue[:-_QUEUED_PER_TARGET]  # the oldest go first: their keys expire by TTL
        return True

    def take_queued(self, target: int) -> list[Call]:
        """The target's queued releases, for a connection being given back to send."""
        with self._mutex:
            calls, self.queued[target] = self.queued[target], []
        return calls

    def send(self, target: int, conn: Connection, calls: Sequence[Call]) -> None:
        """Send calls nobody waits for on ``conn``: the drainer reads the replies, then
        gives the connection back."""
        try:
            send_bytes(conn, resp.pack([render(call, evalsha=False) for call in calls]))
        except Exception:
            self._discard(target, conn)
            return
        self.keep(target, conn, calls, len(calls))

    # -- connections with replies owed -----------------------------------------------

    def keep(self, target: int, conn: Connection, calls: Sequence[Call], unread: int) -> None:
        """``conn`` owes ``unread`` replies to ``calls``: read them in the background."""
        if conn.sock is None or self._closed:
            self._discard(target, conn)
            return
        evicted = self.late.add(Late(conn, target, calls, unread,
                                      time.monotonic() + self._connect_timeout))
        if evicted is not None:
            self._dispose(evicted, give_back=False)
        self._work.set()
        with self._mutex:
            thread = self._thread
            if self._closed or (thread is not None and (thread.ident is None
                                                        or thread.is_alive())):
                return  # running, or about to start (closed: close() drains what is left)
            thread = self._thread = threading.Thread(target=self._drain,
                                                     name="redlock-drain", daemon=True)
        # Started outside the lock: starting a thread waits for it, and no lock of ours is
        # held across a wait (under gevent a waiting greenlet holding it stops everyone).
        thread.start()

    def trail_releases(self, request: Broadcast, route: Callable[[Call], int]) -> None:
        """Write each release behind the unanswered acquires of the same lock value
        (``route``: a call's target)."""
        for call in request.calls:
            for late in self.late.behind(call, route(call)):
                with late.mutex, contextlib.suppress(Exception):  # the normal release too
                    if late.closed:
                        continue
                    send_bytes(late.conn, resp.pack([render(call, evalsha=False)]))
                    late.outstanding += 1

    def _drain(self) -> None:
        """Read late replies as they arrive; a drained connection goes back to the pool,
        one past its deadline (the target is hung) is closed. Ends when none is left.
        Never spins: it waits in select() for replies, or on ``_work`` (set by keep())
        while no connection is there to read."""
        while not self._closed:
            self._work.clear()
            entries = self.late.entries()
            if not entries:
                with self._mutex:
                    if not self.late.total:
                        self._thread = None
                        return
                self._work.wait(_IDLE_WAIT)  # one being added: it sets _work
                continue
            now = time.monotonic()
            for late in [e for e in entries if e.deadline <= now or e.conn.sock is None]:
                self._dispose(late, give_back=False)  # past its deadline (hung), or broken
            live = [e for e in entries if not e.closed and e.deadline > now
                    and e.conn.sock is not None]
            if not live:  # all disposed of (or being so by another thread): look again
                self._work.wait(_IDLE_WAIT)
                continue
            wait = min(_IDLE_WAIT, max(0.0, min(e.deadline for e in live) - now))
            try:
                socks: list[Any] = [e.conn.sock for e in live]
                readable, _, _ = select.select(socks, [], [], wait)
            except (OSError, TypeError, ValueError):  # a socket closed under us: each
                for late in live:                     # is read, and its read says why
                    self._drain_one(late, readable=False)
                continue
            for late in [e for e in live if e.conn.sock in readable]:
                self._drain_one(late, readable=True)

    def _drain_one(self, late: Late[Connection], *, readable: bool) -> None:
        """Read what has come of a late connection's replies, without waiting (a reply
        half received must not hold up the other late connections); ``readable``:
        select() just found its socket readable."""
        with late.mutex:
            if late.closed:  # evicted, or past its deadline: no longer ours to read
                return
            late.conn.readable = readable
            try:
                while late.outstanding > 0:
                    if receive(late.conn) is NOTHING:  # (an error reply counts: read)
                        break
                    late.outstanding -= 1
                    self._silence.heard(late.target)
            except Exception as exc:
                late.outstanding = -1  # broken: close it
                self._silence.failed(late.target, exc)
            finally:
                late.conn.readable = False
            if late.outstanding > 0:
                return
        self._dispose(late, give_back=late.outstanding == 0)

    def _dispose(self, late: Late[Connection], *, give_back: bool) -> None:
        """Done with a late connection: back to the pool (everything read) or closed, exactly
        once, by whoever marks it closed under its lock: given back twice, it could serve two
        requests at once, each reading the other's replies."""
        with late.mutex:
            if late.closed or (give_back and late.outstanding):
                return  # disposed of already; or a release was written behind meanwhile
            late.closed = True
        self.late.remove(late)
        if give_back:
            self._give_back(late.target, late.conn)
        else:
            self._discard(late.target, late.conn)

    def close(self) -> None:
        """Stop the drainer (it ends within one select) and close what it still held."""
        with self._mutex:  # against keep() starting a thread
            self._closed = True
            thread = self._thread
        self._work.set()
        if thread is not None and thread is not threading.current_thread():
            # keep() may have made the thread and not started it yet (it starts it
            # outside the lock): wait for the start, a join before it raises. Once
            # started the thread sees _closed and ends within one select.
            until = time.monotonic() + self._connect_timeout + 0.1
            while thread.ident is None and time.monotonic() < until:
                time.sleep(0.001)
            if thread.ident is not None:
                thread.join(max(0.0, until - time.monotonic()))
        for late in self.late.drain():
            self._discard(late.target, late.conn)
