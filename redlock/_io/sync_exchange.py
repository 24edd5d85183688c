"""What the sync transport keeps per request and node (see :mod:`redlock._io.sync_transport`):
a request's calls for one node (a :class:`Group`, sent on one connection, pipelined).
The socket I/O is :mod:`redlock._io.connection`'s."""

from __future__ import annotations

from redlock._core.requests import Broadcast, Call
from redlock._io import resp
from redlock._io.connection import Connection, send
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
        # (Set when its calls are sent; a group is read only after.)
        self.conn: Connection = None  # type: ignore[assignment]
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
