"""The sync client's connections: the library's own sockets (docs/design.md §2.4).
:func:`open_connection` connects (TCP, Unix socket, TLS, a Sentinel's master) and logs in within
the connect budget; a :class:`Connection` never waits for a reply: :func:`receive` returns a whole
reply or :data:`NOTHING`, so a reply half received holds up no other node's."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import time
from typing import Any

from redlock._io import resp
from redlock._io.endpoint import Endpoint
from redlock._io.failures import LoginRefused, NoReply, ProtocolError, Unreachable

#: What :func:`receive` returns while a whole reply is not there yet.
NOTHING: Any = object()


class Connection:
    """One open connection: its socket, its reply parser, and what the transport keeps
    about it (identified: IDENTIFY was answered on it, docs/design.md §4.4, and on a
    cluster master the server run it reaches; when it was last given back; whether
    ``select()`` just found it readable)."""

    __slots__ = ("identified", "idle_since", "readable", "reader", "run", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self.reader = resp.Reader()
        self.identified = False
        self.run: str | None = None  # the server's run, once identified (a cluster master's)
        self.idle_since = 0.0
        self.readable = False  # select() just said so: the next recv needs no look first

    @property
    def closed(self) -> bool:
        return self.sock is None

    def close(self) -> None:
        """Close the socket (a TLS socket without its close_notify: nothing waits)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def fileno(self) -> int:
        """(For ``select``.) -1 once closed."""
        sock = self.sock
        return -1 if sock is None else sock.fileno()


def open_connection(endpoint: Endpoint, timeout: float) -> Connection:
    """A new connection to ``endpoint``, logged in; within ``timeout`` seconds (every
    later send is bounded by it too). Raises :class:`Unreachable`, :class:`NoReply` or
    :class:`LoginRefused` (the node's words)."""
    until = time.monotonic() + timeout
    host, port = endpoint.host, endpoint.port
    if endpoint.sentinels is not None:
        host, port = master_of(endpoint, timeout)
    try:
        if endpoint.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(endpoint.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((host, port), timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if endpoint.tls is not None:
            context = endpoint.tls.context()
            try:
                sock = context.wrap_socket(sock, server_hostname=None if endpoint.path else host)
            except BaseException:
                sock.close()
                raise
    except TimeoutError as exc:
        raise NoReply(f"Timeout connecting to {where(endpoint, host, port)}") from exc
    except OSError as exc:
        raise Unreachable(f"Error {exc.errno} connecting to {where(endpoint, host, port)}."
                          f" {os.strerror(exc.errno) if exc.errno else exc}.") from exc
    conn = Connection(sock)
    try:
        commands = handshake(endpoint)
        if commands:
            send(conn, resp.pack(commands))
            for command in commands:
                reply = _wait_reply(conn, until)
                if isinstance(reply, resp.ReplyError):
                    raise LoginRefused(f"{reply!s} (to {command[0]})")
    except BaseException:
        conn.close()
        raise
    return conn


def handshake(endpoint: Endpoint) -> list[tuple[Any, ...]]:
    """The commands that log in to the node: AUTH, SELECT, CLIENT SETNAME (each if set),
    else PING. A connection is open once the server answered them: a host whose kernel
    accepts connections for a server that does not answer (stopped, hung) gives none,
    and nothing is written to it (docs/design.md §2.4)."""
    commands: list[tuple[Any, ...]] = []
    credentials = endpoint.credentials()
    if credentials:
        commands.append(("AUTH", *credentials))
    if endpoint.db:
        commands.append(("SELECT", endpoint.db))
    if endpoint.client_name:
        commands.append(("CLIENT", "SETNAME", endpoint.client_name))
    return commands or [("PING",)]


def where(endpoint: Endpoint, host: str, port: int) -> str:
    """The node as an error message names it."""
    return f"unix:{endpoint.path}" if endpoint.path else f"{host}:{port}"


def ask(conn: Connection, command: tuple[Any, ...], until: float) -> object:
    """``command``'s reply on a connection nothing else is written on (a cluster node's
    hash slot map), waiting for it until ``until``."""
    send(conn, resp.pack_one(command))
    return _wait_reply(conn, until, " ".join(map(str, command)))


def _wait_reply(conn: Connection, until: float, what: str = "the handshake") -> object:
    """The next reply, waiting for it until ``until`` (the handshake's and ask's)."""
    while True:
        reply = receive(conn)
        if reply is not NOTHING:
            return reply
        left = until - time.monotonic()
        if left <= 0:
            raise NoReply(f"Timeout reading the reply to {what}")
        wait_readable([conn], left)


def master_of(endpoint: Endpoint, timeout: float) -> tuple[str, int]:
    """The master the endpoint's sentinels name now (redis-py's public Sentinel API, its
    sentinels' sockets bounded by ``timeout`` and closed after)."""
    import redis.sentinel  # (only where a node is Sentinel-managed)

    sentinels = endpoint.sentinels
    assert sentinels is not None
    options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if sentinels.password is not None:
        options["password"] = sentinels.password
    if sentinels.username is not None:
        options["username"] = sentinels.username
    manager = redis.sentinel.Sentinel(list(sentinels.hosts), sentinel_kwargs=options)
    try:
        host, port = manager.discover_master(sentinels.service)
    except Exception as exc:
        raise Unreachable(f"no master for {sentinels.service!r} from its sentinels: {exc}"
                          ) from exc
    finally:
        for client in manager.sentinels:
            with contextlib.suppress(Exception):
                client.close()
    return str(host), int(port)


# -- the hot path's socket I/O -------------------------------------------------------------


def send(conn: Connection, data: bytes) -> None:
    """Write ``data`` (bounded by the socket's timeout: the connect budget); a failure
    closes the connection."""
    sock = conn.sock
    if sock is None:
        raise Unreachable("the connection is closed")
    try:
        if type(sock) is socket.socket:
            # One system call: sendall() on a socket with a timeout polls before every
            # send, and a command nearly always fits the socket's buffer at once.
            try:
                written = os.write(sock.fileno(), data)
            except BlockingIOError:
                written = 0
            if written == len(data):
                return
            data = data[written:]
        sock.sendall(data)
    except TimeoutError as exc:
        conn.close()
        raise NoReply("Timeout writing to socket") from exc
    except OSError as exc:
        conn.close()
        raise Unreachable(f"Error while writing to socket: {exc}") from exc


def receive(conn: Connection) -> object:
    """The next reply if the whole of it is there, else :data:`NOTHING`: never waits. Takes from
    the socket only what is in it now (at most one ``recv``, with no ``select()`` first when
    ``conn.readable`` says one just found it readable). An error reply is returned, not raised."""
    reply = _parsed(conn)
    if reply is not False:
        return reply
    sock = conn.sock
    if sock is None:
        raise Unreachable("the connection is closed")
    if conn.readable:  # select() just said so: no second look
        conn.readable = False
    elif not tls_pending(sock):
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError) as exc:
            raise Unreachable(f"Error while reading from socket: {exc}") from exc
        if not readable:
            return NOTHING
    return _read_more(conn, sock)


def receive_ready(conn: Connection) -> object:
    """:func:`receive` of a connection whose socket ``select()`` just found readable: a
    whole reply already taken from the socket, else what one read brings (one
    ``os.read`` for a plain socket), parsed; :data:`NOTHING` while no whole reply is
    there. Written out flat: it runs for every reply a request reads."""
    reader = conn.reader
    try:
        reply = reader.gets()
    except Exception as exc:  # bytes that are no reply: the stream cannot be trusted
        conn.close()
        raise ProtocolError(str(exc)) from exc
    if reply is not False:
        return reply
    sock = conn.sock
    if sock is None:
        raise Unreachable("the connection is closed")
    if type(sock) is socket.socket:
        try:
            data = os.read(sock.fileno(), 65536)
        except (BlockingIOError, InterruptedError):
            return NOTHING
        except (OSError, ValueError) as exc:
            raise Unreachable(f"Error while reading from socket: {exc}") from exc
        if not data:
            raise Unreachable("Connection closed by server.")
    else:
        found = recv_available(sock)
        if found is None:
            return NOTHING
        data = found
    reader.feed(data)
    try:
        reply = reader.gets()
    except Exception as exc:
        conn.close()
        raise ProtocolError(str(exc)) from exc
    return NOTHING if reply is False else reply


def receive_buffered(conn: Connection) -> object:
    """The next reply if it was taken from the socket already, else :data:`NOTHING`: no
    system call (a read that took several replies at once)."""
    reply = _parsed(conn)
    return NOTHING if reply is False else reply


def _parsed(conn: Connection) -> object:
    try:
        return conn.reader.gets()
    except Exception as exc:  # bytes that are no reply: the stream cannot be trusted
        conn.close()
        raise ProtocolError(str(exc)) from exc


def _read_more(conn: Connection, sock: Any) -> object:
    data = recv_available(sock)
    if data is None:
        return NOTHING
    conn.reader.feed(data)
    reply = _parsed(conn)
    return NOTHING if reply is False else reply


def recv_available(sock: Any) -> bytes | None:
    """What a readable socket holds now (None: nothing whole to decrypt yet). A TLS
    socket is read without waiting: a record half received would otherwise block the
    read for the socket's timeout; what the TLS layer decrypted is taken too."""
    data: bytes
    try:
        if type(sock) is socket.socket:
            data = os.read(sock.fileno(), 65536)  # one system call: just found readable
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
        raise Unreachable(f"Error while reading from socket: {exc}") from exc
    if not data:
        raise Unreachable("Connection closed by server.")
    return data


def tls_pending(sock: Any) -> bool:
    """TLS: decrypted bytes buffered above the socket (``select`` does not see them)."""
    return isinstance(sock, ssl.SSLSocket) and sock.pending() > 0


def buffered(conn: Connection) -> bool:
    """Bytes already taken from the socket and not yet read as replies, or a closed
    connection (reading it says so): no system call."""
    sock = conn.sock
    if sock is None:
        return True
    return conn.reader.has_data() or tls_pending(sock)


def has_input(conn: Connection) -> bool:
    """Something to read: bytes taken and not yet read as replies, or bytes in the socket
    (or a broken connection: reading it says why)."""
    if buffered(conn):
        return True
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)  # type: ignore[type-var]
    except (OSError, ValueError, TypeError):
        return True
    return bool(readable)


def wait_readable(conns: list[Connection], wait: float) -> list[Connection]:
    """The connections with something to read (or closed), waiting up to ``wait`` for
    one; those found readable need no second look before their next ``recv``."""
    try:
        socks: list[Any] = [c.sock for c in conns]
        readable, _, _ = select.select(socks, [], [], wait)
    except (OSError, TypeError, ValueError):  # a socket closed under us: reading says why
        return conns
    ready = [c for c in conns if c.sock in readable]
    for conn in ready:
        conn.readable = True
    return ready


def with_input(conns: list[Connection]) -> list[Connection]:
    """Of connections about to be reused, those with something to read (one ``select``
    for all): the server closed it while it sat idle, or sent what nobody asked for."""
    if not conns:
        return []
    try:
        socks: list[Any] = [c.sock for c in conns]
        readable, _, _ = select.select(socks, [], [], 0)
    except (OSError, TypeError, ValueError):
        return conns
    return [c for c in conns if c.sock in readable or buffered(c)]
