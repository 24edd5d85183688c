"""What the sync transport keeps per request and node (see :mod:`redlock._io.sync_transport`):
a request's calls for one node (a :class:`Group`, sent on one connection, pipelined),
and the socket I/O of the hot path (a connection opened in the background for a request
is :mod:`redlock._io.sync_connect`'s): packed commands written to the socket, replies
parsed from it with :mod:`redlock._io.resp` (redis-py built the connection; its command
layer is bypassed).
"""

from __future__ import annotations

import os
import select
import socket
import ssl
from typing import Any

import redis

from redlock._core.requests import Broadcast, Call
from redlock._io import resp
from redlock._io.wire import PENDING, render


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

    def send_bodies(self) -> None:
        """The calls that answered NOSCRIPT (``unknown``: the server lost its scripts,
        SCRIPT FLUSH or a restart) sent again, with their scripts' bodies (EVAL)."""
        self.resent = True
        by_index = dict(zip(self.indexes, self.calls, strict=True))
        send(self.conn, resp.pack([render(by_index[i], evalsha=False) for i in self.unknown]))


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


#: What :func:`receive` returns while a whole reply is not there yet.
NOTHING: Any = object()


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
    return tls_pending(sock)


def tls_pending(sock: Any) -> bool:
    """TLS: decrypted bytes buffered above the socket (``select`` does not see them)."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def has_input(conn: Any) -> bool:
    """Something to read: bytes taken from the socket and not yet read as replies, or
    bytes in the socket (or a broken connection: reading it says why)."""
    if buffered(conn):
        return True
    try:
        readable, _, _ = select.select([conn._sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def readable_groups(groups: list[Group], wait: float) -> list[Group]:
    """The groups whose sockets have bytes to read, waiting up to ``wait`` for one."""
    try:
        readable, _, _ = select.select([g.conn._sock for g in groups], [], [], wait)
    except (OSError, TypeError, ValueError):  # a socket closed under us
        return groups  # (reading it says why)
    ready = [g for g in groups if g.conn._sock in readable]
    for group in ready:  # its next recv() needs no select() first
        group.conn._redlock_readable = True
    return ready


def send(conn: Any, data: bytes) -> None:
    """Write ``data`` to ``conn``'s socket (bounded by its socket timeout: the connect
    budget); a failure closes the connection, as redis-py's own send does."""
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection is closed")
    try:
        if type(sock) is socket.socket:
            # One system call: sendall() on a socket with a timeout (ours: the connect
            # budget) polls before every send, and a command nearly always fits the
            # socket's buffer at once (what does not is sent by sendall below).
            try:
                written = os.write(sock.fileno(), data)
            except BlockingIOError:
                written = 0
            if written == len(data):
                return
            data = data[written:]
        sock.sendall(data)
    except TimeoutError as exc:
        conn.disconnect()
        raise redis.TimeoutError("Timeout writing to socket") from exc
    except OSError as exc:
        conn.disconnect()
        raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc


def receive(conn: Any) -> object:
    """``conn``'s next reply if the whole of it is there, else :data:`NOTHING`: never
    waits (a reply half received must not hold up the other nodes' replies, nor the
    drainer's other connections). Takes from the socket only what is in it now (at most
    one ``recv``, with no ``select()`` first when ``conn._redlock_readable`` says one
    just found it readable). An error reply is returned, not raised."""
    parser = reader(conn)
    reply = parser.gets()
    if reply is not False:
        return resp.as_result(reply)
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection is closed")
    if getattr(conn, "_redlock_readable", False):  # select() just said so: no second look
        conn._redlock_readable = False
    elif not tls_pending(sock):
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError) as exc:
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
        if not readable:
            return NOTHING
    return _read_more(parser, sock)


def receive_ready(conn: Any) -> object:
    """:func:`receive` of a connection whose socket ``select()`` just found readable."""
    parser = reader(conn)
    reply = parser.gets()
    if reply is not False:
        return resp.as_result(reply)
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection is closed")
    return _read_more(parser, sock)


def _read_more(parser: Any, sock: Any) -> object:
    data = recv_available(sock)
    if data is None:
        return NOTHING
    parser.feed(data)
    reply = parser.gets()
    return NOTHING if reply is False else resp.as_result(reply)


def recv_available(sock: Any) -> bytes | None:
    """What a readable socket holds now (None: nothing whole to decrypt yet). A TLS
    socket is read without waiting: a record half received would otherwise block the
    read for the socket's timeout; what the TLS layer decrypted is taken too."""
    data: bytes
    try:
        if type(sock) is socket.socket:
            # One system call: recv() on a socket with a timeout polls first, and this
            # socket was just found readable (or is looked at without waiting).
            data = os.read(sock.fileno(), 65536)
        elif not isinstance(sock, ssl.SSLSocket):
            data = sock.recv(65536)
        else:
            timeout = sock.gettimeout()
            sock.settimeout(0)
            try:
                data = sock.recv(65536)
                while data and sock.pending():
                    data += sock.recv(65536)
            finally:
                sock.settimeout(timeout)
    except (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
            ssl.SSLWantWriteError, TimeoutError):
        return None
    except (OSError, ValueError) as exc:
        raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
    if not data:
        raise redis.ConnectionError("Connection closed by server.")
    return data


def is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the socket itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._sock
