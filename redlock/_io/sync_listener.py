"""The sync client's release listener: one subscription connection per node, all read
by one thread (a release's messages from N nodes arrive together: one wake-up reads
them all), started when a blocking acquire first waits and stopped after a while with
nothing to listen to (docs/design.md §6; what to subscribe to and whom a message wakes
is decided in :mod:`redlock._io.wakeups`). Connections are opened by short-lived helper
threads, so a node that is slow to answer holds up no other node's messages.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock._io import resp, wakeups
from redlock._io.sync_exchange import recv_available, tls_pending

# The longest the thread sleeps in select: it notices close(), a ping to send and
# lingering channels to drop at least this often.
_TICK = 1.0


class _Node:
    """One node's subscription connection, as the listener thread sees it."""

    __slots__ = ("conn", "connecting", "delay", "reader", "refused", "retry_at",
                 "subscription")

    def __init__(self, subscription: wakeups.NodeSubscription) -> None:
        self.subscription = subscription
        self.conn: Any = None
        # Its replies, parsed from the socket's bytes (redis-py reads only the handshake).
        self.reader: Any = None
        self.connecting = False  # a helper thread is opening the connection
        self.retry_at = 0.0
        self.delay = wakeups.RECONNECT_MIN
        self.refused = False  # its ACL refuses SUBSCRIBE: left alone


class SyncReleaseListener:
    """Subscription connections to every node, for one manager, read by one thread."""

    def __init__(self, pools: Sequence[redis.ConnectionPool], addresses: Sequence[str],
                 connect_timeout: float, registry: wakeups.WakeRegistry) -> None:
        self._pools = pools
        self._addresses = addresses
        self._connect_timeout = connect_timeout
        self._registry = registry
        self._nodes = [_Node(wakeups.NodeSubscription(i, registry)) for i in range(len(pools))]
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
                for command in node.subscription.commands(wanted):
                    node.conn.send_command(*command, check_health=False)
            except Exception:
                self._lost(node)
        live = [n for n in self._nodes if n.conn is not None]
        readable: list[Any] = []
        with contextlib.suppress(OSError, TypeError, ValueError):  # closed under us: next round
            readable, _, _ = select.select([self._poke_r, *(n.conn._sock for n in live)],
                                           [], [], _TICK)
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
        found it readable (or TLS holds decrypted bytes above it), and parsed here:
        everything buffered was parsed in the round that read it."""
        try:
            sock = node.conn._sock
            while sock in readable or tls_pending(sock):
                data = recv_available(sock)  # (raises once the node closed it)
                if data is None:  # half a TLS record: the rest comes with a later round
                    break
                node.reader.feed(data)
                while (message := node.reader.gets()) is not False:
                    if isinstance(message, resp.ReplyError):
                        raise redis.ResponseError(str(message))
                    node.subscription.heard(message, wake)
                readable = ()
            if node.subscription.silent():
                raise redis.TimeoutError("the subscription connection stopped answering")
        except redis.ResponseError as exc:  # SUBSCRIBE refused: an ACL
            self._registry.refused(node.subscription.node,
                                   self._addresses[node.subscription.node], exc)
            node.refused = True
            self._lost(node)
        except Exception:  # broken or silent: reconnect, subscribe again
            self._lost(node)

    def _open(self, node: _Node) -> None:
        """Open the node's connection in a helper thread; the listener picks it up."""
        index = node.subscription.node
        conn = wakeups.subscription_connection(self._registry, index, self._addresses[index],
                                       self._pools[index], self._connect_timeout,
                                       self._connect_timeout, Retry(NoBackoff(), 0))
        if conn is None:
            node.refused = True
            return
        node.connecting = True

        def connect() -> None:
            try:
                conn.connect()
            except Exception:
                _disconnect(conn)
                node.retry_at = time.monotonic() + node.delay
                node.delay = min(2 * node.delay, wakeups.RECONNECT_MAX)
            else:
                node.delay = wakeups.RECONNECT_MIN
                if self._closed:
                    _disconnect(conn)
                else:
                    node.reader = resp.Reader()
                    node.conn = conn
            finally:
                node.connecting = False
                self.poke()

        threading.Thread(target=connect, name="redlock-listener-connect", daemon=True).start()

    @staticmethod
    def _lost(node: _Node) -> None:
        node.subscription.lost()
        if node.conn is not None:
            _disconnect(node.conn)
            node.conn = None


def _disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.disconnect()
