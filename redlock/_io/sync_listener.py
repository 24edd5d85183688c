"""The sync client's release listener (docs/design.md §6.4): one subscription connection per
node, all read by one thread (a release's messages from N nodes arrive together: one wake-up
reads them all); connections opened by short-lived helper threads, so a slow node holds up no
other's messages. What to subscribe to and whom to wake: :mod:`redlock._io.wakeups`."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from redlock._io import connection, resp, wakeups
from redlock._io.connection import NOTHING, Connection
from redlock._io.endpoint import Endpoint
from redlock._io.failures import NoReply

# The longest the thread sleeps in select: it notices close(), a ping to send and
# lingering channels to drop at least this often.
_TICK = 1.0


class _Node:
    """One node's subscription connection, as the listener thread sees it."""

    __slots__ = ("conn", "connecting", "delay", "refused", "retry_at", "subscription")

    def __init__(self, subscription: wakeups.NodeSubscription) -> None:
        self.subscription = subscription
        self.conn: Connection | None = None
        self.connecting = False  # a helper thread is opening the connection
        self.retry_at = 0.0
        self.delay = wakeups.RECONNECT_MIN
        self.refused = False  # its ACL refuses SUBSCRIBE: left alone


class SyncReleaseListener:
    """Subscription connections to every node, for one manager, read by one thread."""

    def __init__(self, endpoints: Sequence[Endpoint], addresses: Sequence[str],
                 connect_timeout: float, registry: wakeups.WakeRegistry) -> None:
        self._endpoints = endpoints
        self._addresses = addresses
        self._connect_timeout = connect_timeout
        self._registry = registry
        self._nodes = [_Node(wakeups.NodeSubscription(i, registry)) for i in range(len(endpoints))]
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._poke_r, self._poke_w = socket.socketpair()  # a byte here wakes the thread
        self._poke_r.setblocking(False)
        self._poke_w.setblocking(False)
        self._closed = False

    def ensure_running(self) -> None:
        with self._mutex:
            if self._closed or self._thread is not None:
                return
            thread = self._thread = threading.Thread(target=self._run, name="redlock-listener",
                                                     daemon=True)
        # Started outside the lock: starting a thread waits for it, and no lock of ours is
        # held across a wait (under gevent a waiting greenlet holding it stops everyone).
        thread.start()

    def poke(self) -> None:
        """Wake the thread (the wanted channels changed, or a connection is ready)."""
        with contextlib.suppress(OSError):  # full (a poke is pending already) or closed
            self._poke_w.send(b"x")

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            thread = self._thread
        self.poke()
        if thread is not None:
            thread.join(2 * _TICK)
        self._poke_r.close()
        self._poke_w.close()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                if all(n.subscription.idle() or n.refused for n in self._nodes) and \
                        self._stop_if_idle():
                    return
                self._serve()
        finally:
            for node in self._nodes:
                self._lost(node)

    def _stop_if_idle(self) -> bool:
        """Stop (True) unless a wait came meanwhile. Under the mutex, against
        ensure_running: a wait that comes after this starts a new thread."""
        with self._mutex:
            if self._registry.wanted():
                return False
            self._thread = None
            return True

    def _serve(self) -> None:
        """One round: connect what is down, subscribe what is wanted, read what came."""
        now = time.monotonic()
        wanted = self._registry.wanted()
        for node in self._nodes:
            if node.refused:
                continue
            if node.conn is None:
                node.subscription.check_idle(wanted)
                if not node.connecting and now >= node.retry_at:
                    self._open(node)
                continue
            try:
                commands = node.subscription.commands(wanted)
                if commands:
                    connection.send(node.conn, resp.pack(commands))
            except Exception:
                self._lost(node)
        live = [n for n in self._nodes if n.conn is not None]
        readable: list[Any] = []
        with contextlib.suppress(OSError, TypeError, ValueError):  # closed under us: next round
            socks: list[Any] = [self._poke_r, *(n.conn.sock for n in live if n.conn)]
            readable, _, _ = select.select(socks, [], [], _TICK)
            if self._poke_r in readable:
                with contextlib.suppress(OSError):
                    self._poke_r.recv(4096)
        # The waiters woken by what this round read wake once, after the last message
        # (several nodes' messages of one release often come together).
        wake: list[Any] = []
        for node in live:
            self._read(node, wake, readable)
        for event in dict.fromkeys(wake):
            event.set()

    def _read(self, node: _Node, wake: list[Any], readable: Sequence[Any]) -> None:
        """What came on the node's connection: read from its socket only when select
        found it readable (or bytes wait above it), and parsed here."""
        conn = node.conn
        assert conn is not None
        try:
            if conn.sock in readable or connection.buffered(conn):
                conn.readable = conn.sock in readable
                while (message := connection.receive(conn)) is not NOTHING:
                    if isinstance(message, resp.ReplyError):  # SUBSCRIBE refused: an ACL
                        self._registry.refused(node.subscription.node,
                                               self._addresses[node.subscription.node], message)
                        node.refused = True
                        self._lost(node)
                        return
                    node.subscription.heard(message, wake)
            if node.subscription.silent():
                raise NoReply("the subscription connection stopped answering")
        except Exception:  # broken or silent: reconnect, subscribe again
            self._lost(node)

    def _open(self, node: _Node) -> None:
        """Open the node's connection in a helper thread; the listener picks it up."""
        endpoint = self._endpoints[node.subscription.node]
        node.connecting = True

        def connect() -> None:
            try:
                conn = connection.open_connection(endpoint, self._connect_timeout)
            except Exception:
                node.retry_at = time.monotonic() + node.delay
                node.delay = min(2 * node.delay, wakeups.RECONNECT_MAX)
            else:
                node.delay = wakeups.RECONNECT_MIN
                if self._closed:
                    conn.close()
                else:
                    node.conn = conn
            finally:
                node.connecting = False
                self.poke()

        threading.Thread(target=connect, name="redlock-listener-connect", daemon=True).start()

    @staticmethod
    def _lost(node: _Node) -> None:
        node.subscription.lost()
        if node.conn is not None:
            node.conn.close()
            node.conn = None
