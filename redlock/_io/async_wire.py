"""The asyncio client's connections: the library's own (docs/design.md §2.4), opened with the
event loop's public API. A :class:`Wire` is the connection's protocol: commands written with one
``transport.write`` per node, replies parsed in ``data_received`` and handed in order to whoever is
owed the next (``Sink``). No task, stream read or await per command."""

from __future__ import annotations

import asyncio
import os
import select
import socket
from collections import deque
from collections.abc import Callable

from redlock._io import resp
from redlock._io.connection import handshake, master_of, where
from redlock._io.endpoint import Endpoint
from redlock._io.failures import LoginRefused, NoReply, ProtocolError, Unreachable

Sink = Callable[[object], None]  # given one reply (or the error that ended the wire)


def _ignore(_reply: object) -> None:
    pass


IGNORE: Sink = _ignore


class Wire(asyncio.Protocol):
    """One connection to a node, read and written by the transport."""

    def __init__(self, target: int) -> None:
        self.target = target  # a node, or a cluster node's master (redlock._io.routing)
        self.lane: str | None = None  # the lane it goes back to when free
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.reader = resp.Reader()
        self.sinks: deque[Sink] = deque()
        self.alive = True
        self.identified = False  # IDENTIFY was answered on it (docs/design.md §4.4)
        self.run: str | None = None  # the server's run, once identified (a cluster master's)
        self.freed_at = 0.0  # when it last became idle (time.monotonic())
        # Called once no reply is owed any more (the wire is free) or when it broke.
        self.on_free: Callable[[Wire], None] | None = None
        self.on_broken: Callable[[Wire], None] | None = None
        # A subscription's: what arrives without being asked for (its messages).
        self.messages: Sink | None = None
        self.closed: asyncio.Future[None] | None = None  # done once the transport closed
        self.error: BaseException | None = None  # what ended it

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no subclass)
        self.sock = transport.get_extra_info("socket")
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        reader, sinks = self.reader, self.sinks
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # bytes that are no reply: the stream cannot be trusted
                self.abort(ProtocolError(str(exc)))
                return
            if reply is False:
                break
            if sinks:
                sinks.popleft()(reply)
            elif self.messages is not None:
                self.messages(reply)
            else:  # a reply nobody asked for: the stream cannot be trusted
                self.abort(ProtocolError("a reply nobody asked for"))
                return
        if not sinks and self.alive and self.on_free is not None:
            self.on_free(self)

    def eof_received(self) -> bool:
        self._broken(Unreachable("Connection closed by server."))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(Unreachable(
            f"Connection lost: {exc}" if exc else "Connection closed by server."))
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:  # the commands are small; the buffer takes them
        pass

    def resume_writing(self) -> None:
        pass

    # -- writing -----------------------------------------------------------------------

    def send(self, data: bytes, sink: Sink, count: int) -> None:
        """Write ``data``, whose ``count`` replies go to ``sink`` in order."""
        transport = self.transport
        if not self.alive or transport is None or transport.is_closing():
            raise Unreachable("Connection closed by server.")
        transport.write(data)
        if count == 1:
            self.sinks.append(sink)
        else:
            self.sinks.extend([sink] * count)

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Close after what is written went out (a TLS connection with its shutdown);
        whoever is still owed a reply gets a ConnectionError."""
        self._broken(Unreachable("Connection closed by the client."))
        if self.transport is not None:
            self.transport.close()

    def abort(self, error: BaseException) -> None:
        """Close at once; whoever is owed a reply gets ``error``."""
        self._broken(error)
        if self.transport is not None:
            self.transport.abort()

    def _broken(self, error: BaseException) -> None:
        if not self.alive:
            return
        self.alive = False
        self.error = error
        sinks = self.sinks
        while sinks:
            sinks.popleft()(error)
        if self.on_broken is not None:
            self.on_broken(self)

    def readable(self) -> bool:
        """Bytes in the socket the event loop has not handed over yet (a busy loop), or the socket
        is closed: a reply that arrived, or an idle connection the server closed."""
        if not self.alive:
            return True
        if self.sock is None:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


async def open_wire(endpoint: Endpoint, target: int, timeout: float) -> Wire:
    """A new connection to ``endpoint``, logged in. The caller bounds the wait by
    ``timeout`` (the connect budget); cancelled, it leaves nothing open. Raises
    :class:`Unreachable` or :class:`LoginRefused` (the node's words)."""
    loop = asyncio.get_running_loop()
    host, port = endpoint.host, endpoint.port
    if endpoint.sentinels is not None:
        # (redis-py's public Sentinel API is blocking: a thread, within the budget)
        host, port = await asyncio.to_thread(master_of, endpoint, timeout)
    context = endpoint.tls.context() if endpoint.tls is not None else None
    try:
        if endpoint.path:
            _, wire = await loop.create_unix_connection(
                lambda: Wire(target), endpoint.path, ssl=context,
                server_hostname="" if context is not None else None)
        else:
            _, wire = await loop.create_connection(lambda: Wire(target), host, port, ssl=context)
            if endpoint.keepalive and wire.sock is not None:
                wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except OSError as exc:
        if isinstance(exc, TimeoutError):
            raise NoReply(f"Timeout connecting to {where(endpoint, host, port)}") from exc
        raise Unreachable(f"Error {exc.errno} connecting to {where(endpoint, host, port)}."
                          f" {os.strerror(exc.errno) if exc.errno else exc}.") from exc
    try:
        commands = handshake(endpoint)
        if commands:
            replies: list[object] = []
            done = loop.create_future()

            def take(reply: object) -> None:
                replies.append(reply)
                if len(replies) == len(commands) and not done.done():
                    done.set_result(None)

            wire.send(resp.pack(commands), take, len(commands))
            await done
            for command, reply in zip(commands, replies, strict=True):
                if isinstance(reply, BaseException) and not isinstance(reply, resp.ReplyError):
                    raise reply
                if isinstance(reply, resp.ReplyError):
                    raise LoginRefused(f"{reply} (to {command[0]})")
    except BaseException:
        wire.abort(Unreachable("the handshake did not complete"))
        raise
    return wire


def readable_wires(wires: list[Wire]) -> set[Wire]:
    """Which of ``wires`` have bytes the loop has not read yet (one system call)."""
    socks = {wire.sock: wire for wire in wires if wire.sock is not None}
    dead = {wire for wire in wires if not wire.alive}
    if not socks:
        return dead
    try:
        readable, _, _ = select.select(list(socks), [], [], 0)
    except (OSError, ValueError):
        return set(wires)
    return dead | {socks[sock] for sock in readable}
