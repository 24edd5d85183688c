"""The sync transport's new connections (see :mod:`redlock._io.sync_transport`): each opened in a
thread of its own, with its own budget (``connect_timeout``), so that a request waits for it only
until its own deadline and a hung node that accepts TCP but never answers the handshake costs one
node timeout, not the connect budget. At most :data:`CONNECTS_PER_TARGET` open at once per target; a
target that refused a moment ago fails at once (:class:`~redlock._io.wire.Refusals`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from redlock._core.requests import Call
from redlock._io.connection import Connection, open_connection
from redlock._io.endpoint import Endpoint
from redlock._io.wire import Refusals, Silence, late_sendable
from redlock._scripts import lock as scripts

# Connections opening at once per target, so that a hung target does not collect threads; a
# request beyond this waits for a slot or a connection given back (never fails at once).
CONNECTS_PER_TARGET = 16


def given(target: int, conn: Connection) -> Connect:
    """A connection found idle while waiting for a slot: as if opened for this request."""
    attempt = Connect(target)
    attempt.conn = conn
    attempt.ready.set()
    return attempt


class Connect:
    """A connection one request is opening in the background, with its own budget. If the
    request stops waiting, it joins the pool when ready, its final releases sent on it
    first (``late``, :func:`~redlock._io.wire.late_sendable`)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.ready = threading.Event()
        self.conn: Connection | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.late: list[Call] = []  # releases to send once connected (the request is over)
        self.mutex = threading.Lock()

    def abandon(self, calls: Sequence[Call]) -> bool:
        """Its request gives up on it: ``calls`` are kept to send once connected if they
        are all final releases (:func:`~redlock._io.wire.late_sendable`). True when the
        connection is open already (to be handed back now, not when ready)."""
        with self.mutex:
            self.abandoned = True
            self.late = list(calls) if calls and all(
                call.script is scripts.RELEASE and late_sendable(call) for call in calls) else []
            return self.ready.is_set() and self.conn is not None


class Connector:
    """Opens one transport's new connections, each in a thread of its own (see the module's doc);
    ``connected_late(attempt)`` takes a connection whose request gave up on it once it is open."""

    def __init__(self, endpoints: list[Endpoint], connect_timeout: float, silence: Silence,
                 connected_late: Callable[[Connect], None]) -> None:
        self._endpoints = endpoints
        self._connect_timeout = connect_timeout
        self._silence = silence  # its transport's: which nodes answer
        self.refusals = Refusals(len(endpoints))  # the nodes refusing connections
        self._connected_late = connected_late
        self._connects = [0] * len(endpoints)  # opening now, per target
        self._opening: set[threading.Thread] = set()  # their threads (close() joins them)
        self._mutex = threading.Lock()
        self._closed = False

    def grow(self) -> None:
        """One more target (its endpoint appended to the shared list already)."""
        self.refusals.grow()
        with self._mutex:
            self._connects.append(0)

    def connect(self, target: int, *, anyway: bool = False) -> Connect | None:
        """A connection to ``target`` opening in the background for one request (None when
        too many are opening already: the target is slow to accept or to handshake;
        ``anyway``: a lane's, which does not wait for a slot; or once closed)."""
        attempt = Connect(target)
        refused = self.refusals.refusing(target, time.monotonic())
        if refused is not None:  # it failed a moment ago: fails the same way, at once
            attempt.error = refused
            attempt.ready.set()
            return attempt

        def run() -> None:
            try:
                # (Not cleared of its refusals yet: that takes a reply, see SyncTransport)
                attempt.conn = open_connection(self._endpoints[target], self._connect_timeout)
            except Exception as exc:
                attempt.error = exc
                self._silence.failed(target, exc)
                self.refusals.failed(target, exc, time.monotonic())
            finally:
                with self._mutex:
                    self._connects[target] -= 1
            with attempt.mutex:
                attempt.ready.set()
                abandoned = attempt.abandoned
            if abandoned and attempt.conn is not None:
                self._connected_late(attempt)  # warm, for the next request
            with self._mutex:
                self._opening.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="redlock-connect", daemon=True)
        with self._mutex:
            if self._closed or (self._connects[target] >= CONNECTS_PER_TARGET and not anyway):
                return None  # (closed: close() has collected the threads it waits for)
            self._connects[target] += 1
            self._opening.add(thread)
        thread.start()
        return attempt

    def abandon(self, attempt: Connect, calls: Sequence[Call]) -> bool:
        """The request gives up on the connection: to the pool now, or when ready (with
        ``calls`` sent on it first if they are all final releases: True)."""
        if attempt.abandon(calls):
            self._connected_late(attempt)
        return bool(attempt.late)

    def close(self) -> list[threading.Thread]:
        """No new connection from now on; the threads still opening one (to join)."""
        with self._mutex:
            self._closed = True
            return list(self._opening)
