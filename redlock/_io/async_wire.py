"""The asyncio transport's connections at the protocol level (docs/design.md §2.4).

redis-py opens a connection (TCP or TLS, AUTH/HELLO, SELECT, client name); then
:class:`Wire` takes its transport over (``set_protocol``): a request's commands are
written with one ``transport.write`` per node, and replies are parsed in
``data_received`` as the bytes arrive and handed, in order, to whoever is owed the next
one (``Sink``: an exchange's calls, a release written behind an acquire). No task, no
stream read and no await per command: a request is one future and one timer however
many nodes it asks. redis-py's own stream protocol is still told when the connection is
lost, so that its ``disconnect()`` finds it closed.
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

from redlock._io import resp

Sink = Callable[[object], None]  # given one reply (or the error that ended the wire)


def _ignore(_reply: object) -> None:
    pass


IGNORE: Sink = _ignore


class Wire(asyncio.Protocol):
    """A redis-py asyncio connection whose socket the transport reads and writes."""

    def __init__(self, conn: Any, node: int) -> None:
        self.conn = conn
        self.node = node
        self.lane: str | None = None  # the lane it goes back to when free
        transport = conn._writer.transport
        self.transport = transport
        self.sock = transport.get_extra_info("socket")
        self._stream_protocol = transport.get_protocol()
        self.reader = resp.Reader()
        self.sinks: deque[Sink] = deque()
        self.alive = True
        self.identified = False  # IDENTIFY was answered on it (docs/design.md §4.4)
        self.freed_at = 0.0  # when it last became idle (time.monotonic())
        # Called once no reply is owed any more (the wire is free) or when it broke.
        self.on_free: Callable[[Wire], None] | None = None
        self.on_broken: Callable[[Wire], None] | None = None
        buffered = getattr(conn._reader, "_buffer", None)
        if buffered:  # (none after a handshake; kept if there were)
            self.reader.feed(bytes(buffered))
            buffered.clear()
        transport.set_protocol(self)

    # -- writing ---------------------------------------------------------------------

    def send(self, data: bytes, sink: Sink, count: int) -> None:
        """Write ``data``, whose ``count`` replies go to ``sink`` in order."""
        if not self.alive or self.transport.is_closing():
            raise RedisConnectionError("Connection closed by server.")
        self.transport.write(data)
        if count == 1:
            self.sinks.append(sink)
        else:
            self.sinks.extend([sink] * count)

    # -- reading (asyncio.Protocol) --------------------------------------------------

    def data_received(self, data: bytes) -> None:
        reader, sinks = self.reader, self.sinks
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # a protocol error: the stream cannot be trusted
                self.abort(exc)
                return
            if reply is False:
                break
            if not sinks:  # a reply nobody asked for: the stream cannot be trusted
                self.abort(InvalidResponse("a reply nobody asked for"))
                return
            sinks.popleft()(resp.as_result(reply) if isinstance(reply, resp.ReplyError)
                            else reply)
        if not sinks and self.alive and self.on_free is not None:
            self.on_free(self)

    def eof_received(self) -> bool:
        self._broken(RedisConnectionError("Connection closed by server."))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(RedisConnectionError(
            f"Connection lost: {exc}" if exc else "Connection closed by server."))
        protocol = self._stream_protocol
        if protocol is not None:  # redis-py's disconnect() waits for its stream to close
            self._stream_protocol = None
            protocol.connection_lost(exc)

    def pause_writing(self) -> None:  # the commands are small; the buffer takes them
        pass

    def resume_writing(self) -> None:
        pass

    # -- the end -----------------------------------------------------------------------

    def hand_back(self) -> None:
        """Give the connection back to redis-py's stream protocol (before redis-py closes
        it: its close then runs as on any connection of its own, TLS shutdown included).
        Whoever is still owed a reply gets a ConnectionError."""
        self._broken(RedisConnectionError("Connection closed by the client."))
        protocol = self._stream_protocol
        if protocol is not None and not self.transport.is_closing():
            self._stream_protocol = None
            self.transport.set_protocol(protocol)

    def abort(self, error: BaseException) -> None:
        """Close at once; whoever is owed a reply gets ``error``."""
        self._broken(error)
        self.transport.abort()

    def _broken(self, error: BaseException) -> None:
        if not self.alive:
            return
        self.alive = False
        sinks = self.sinks
        while sinks:
            sinks.popleft()(error)
        if self.on_broken is not None:
            self.on_broken(self)

    def readable(self) -> bool:
        """Bytes in the socket the event loop has not handed over yet (a busy loop), or
        the socket is closed: a reply that arrived, or an idle connection the server
        closed."""
        if not self.alive:
            return True
        if self.sock is None:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


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
