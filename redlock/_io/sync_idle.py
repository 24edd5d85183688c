"""The sync transport's open connections between requests (see
:mod:`redlock._io.sync_transport`): per node, a stack of connections.

The stacks shrink: a connection that sat on its stack longer than :data:`IDLE_KEPT_FOR`
(a burst of threads opened it, and it is over) is closed when a request gives another
back to its node. The stack is last in, first out, so the ones nobody needs any more
stay at its bottom, where the shrink looks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from redlock._io.connection import Connection, has_input
from redlock._io.connection import with_input as _with_input
from redlock._io.wire import FRESH

#: Seconds a connection may wait on its node's stack unused before it is closed.
IDLE_KEPT_FOR = 30.0


class IdleConnections:
    """Per node, the open connections waiting for the next request (thread-safe: a
    push and a pop at the top are single list operations; a shrink takes a lock)."""

    def __init__(self, node_count: int, discard: Callable[[int, Connection], None]) -> None:
        self._discard = discard  # (node, connection): closed
        self._stacks: list[list[Connection]] = [[] for _ in range(node_count)]
        self._shrinking = threading.Lock()

    def count(self, node: int) -> int:
        return len(self._stacks[node])

    def take(self, node: int, *, check: bool = True) -> Connection | None:
        """An open connection (None if there is none: never connects). ``check``: and
        nothing to read in it (one the server closed while it sat idle, or that has
        bytes nobody asked for, is closed and the next one tried)."""
        stack = self._stacks[node]
        while stack:
            try:
                conn = stack.pop()
            except IndexError:  # another thread took the last one
                break
            if conn.sock is not None and not (check and has_input(conn)):
                return conn
            self._discard(node, conn)
        return None

    def pop(self, node: int) -> Connection | None:
        """The node's last connection given back, as it is (None if there is none)."""
        try:
            return self._stacks[node].pop()
        except IndexError:
            return None

    def push_back(self, nodes: list[int], conns: list[Connection]) -> None:
        """Connections popped from ``nodes`` and not used, back as they were."""
        for node, conn in zip(reversed(nodes), reversed(conns), strict=True):
            self._stacks[node].append(conn)

    def put(self, node: int, conn: Connection) -> None:
        """``conn`` waits for the next request; ones unused too long are closed."""
        stack = self._stacks[node]
        now = conn.idle_since = time.monotonic()
        stack.append(conn)
        try:
            oldest = stack[0]
        except IndexError:  # taken meanwhile
            return
        if now - oldest.idle_since > IDLE_KEPT_FOR:
            self._shrink(node, now)

    def _shrink(self, node: int, now: float) -> None:
        stale = []
        stack = self._stacks[node]
        with self._shrinking:  # one at a time; requests push and pop the top meanwhile
            while True:
                try:
                    if now - stack[0].idle_since <= IDLE_KEPT_FOR:
                        break
                    # (Should another thread take the last one between the look and
                    # the pop, and put one back, that idle one is closed: it is unused.)
                    stale.append(stack.pop(0))
                except IndexError:
                    break
        for conn in stale:
            self._discard(node, conn)

    def close(self) -> None:
        """Close every connection kept."""
        for node, stack in enumerate(self._stacks):
            while stack:
                self._discard(node, stack.pop())


def with_input(conns: list[Connection]) -> list[Connection]:
    """Of idle connections about to be reused, those with something to read: the server
    closed it while it sat idle (it restarted), or sent what nobody asked for. One
    ``select`` for all; not for one given back less than
    :data:`~redlock._io.wire.FRESH` ago."""
    now = time.monotonic()
    return _with_input([conn for conn in conns if now - conn.idle_since >= FRESH])
