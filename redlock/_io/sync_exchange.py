"""What the sync transport keeps per request and node (see :mod:`redlock._io.sync_transport`):
a request's calls for one node (a :class:`Group`, sent on one connection, pipelined),
and a connection being opened for it in the background (:class:`Connect`).
"""

from __future__ import annotations

import threading
from typing import Any

from redlock._core.requests import Broadcast, Call
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


def has_input(conn: Any) -> bool:
    """Something to read (or a broken connection: reading it says why)."""
    try:
        return bool(conn.can_read(timeout=0))
    except Exception:
        return True


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
