"""What the sync transport keeps per request and node (see :mod:`redlock._io.sync_transport`):
a request's calls for one node (a :class:`Group`, sent on one connection, pipelined),
a connection being opened for it in the background (:class:`Connect`), and the socket
I/O of the hot path: packed commands written to the socket, replies parsed from it with
:mod:`redlock._io.resp` (redis-py built the connection; its command layer is bypassed).
"""

from __future__ import annotations

import select
import ssl
import threading
import time
from typing import Any

import redis

from redlock._core.requests import Broadcast, Call
from redlock._io import resp
from redlock._io.wire import PENDING


class Group:
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


def by_node(request: Broadcast) -> list[Group]:
    """A request's calls, grouped by node (in the order of their first call)."""
    found: dict[int, Group] = {}
    for index, call in enumerate(request.calls):
        group = found.get(call.node)
        if group is None:
            group = found[call.node] = Group(call.node, request.lane)
        group.indexes.append(index)
        group.calls.append(call)
    return list(found.values())


def reader(conn: Any) -> Any:
    """The reply parser of ``conn``'s current socket (a new one for a new socket)."""
    sock = conn._sock
    kept = getattr(conn, "_redlock_reader", None)
    if kept is None or kept[0] is not sock:
        kept = conn._redlock_reader = (sock, resp.Reader())
    return kept[1]


def buffered(conn: Any) -> bool:
    """Bytes already taken from the socket and not yet read as replies (no system call)."""
    sock = conn._sock
    if sock is None:
        return True
    kept = getattr(conn, "_redlock_reader", None)
    if kept is not None and kept[0] is sock and kept[1].has_data():
        return True
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def has_input(conn: Any) -> bool:
    """Something to read: a reply already parsed from the socket's bytes, or bytes in the
    socket (or a broken connection: reading it says why)."""
    sock = conn._sock
    if sock is None:
        return True
    kept = getattr(conn, "_redlock_reader", None)
    if kept is not None and kept[0] is sock and kept[1].has_data():
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def send(conn: Any, data: bytes) -> None:
    """Write ``data`` to ``conn``'s socket (bounded by its socket timeout: the connect
    budget); a failure closes the connection, as redis-py's own send does."""
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection is closed")
    try:
        sock.sendall(data)
    except TimeoutError as exc:
        conn.disconnect()
        raise redis.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc


def read_one(conn: Any, deadline: float) -> object:
    """One reply of ``conn`` by ``deadline`` (redis.TimeoutError: not there yet, what
    was read is kept for the next read); an error reply is returned, not raised."""
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection is closed")
    parser = reader(conn)
    if not hasattr(conn, "_redlock_readable"):
        conn._redlock_readable = False
    while True:
        reply = parser.gets()
        if reply is not False:
            return resp.as_result(reply)
        left = deadline - time.monotonic()
        if left <= 0:
            left = 0.0005  # a reply arriving now still counts (as redis-py's own read)
        try:
            if conn._redlock_readable:  # select() just said so: no second look
                conn._redlock_readable = False
            elif not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                readable, _, _ = select.select([sock], [], [], left)
                if not readable:
                    raise redis.TimeoutError("Timeout reading from socket")
            data = sock.recv(65536)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError) as exc:
            raise redis.TimeoutError("Timeout reading from socket") from exc
        except (OSError, ValueError) as exc:
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
        if not data:
            raise redis.ConnectionError("Connection closed by server.")
        parser.feed(data)


def is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the socket itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._sock


def given(node: int, conn: Any) -> Connect:
    """A connection found idle while waiting for a slot: as if opened for this request."""
    attempt = Connect(node)
    attempt.conn = conn
    attempt.ready.set()
    return attempt


class Connect:
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
