"""The sync transport: parallel requests to N nodes from one thread.

Parallel means parallel on one thread: a request's commands are written to every
node first (scatter), then the replies are read against one shared deadline
(gather), so N nodes cost one round trip and one node timeout at most, not N.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import NoScriptError
from redis.retry import Retry

from redlock._node_config import build_pool, check_node_list, node_labels, pool_overrides
from redlock._protocol import Broadcast, Call
from redlock._transport import ParkedAcquires, render

_UNREAD: object = object()  # a reply slot not filled yet (None is a real reply)


class _Group:
    """The calls of one request for one node, sent on one connection (pipelined)."""

    __slots__ = ("calls", "conn", "identity", "indexes", "node", "probed")

    def __init__(self, node: int) -> None:
        self.node = node
        self.indexes: list[int] = []
        self.calls: list[Call] = []
        self.conn: Any = None
        self.probed = False  # a new connection: the identity probe went first
        self.identity: object = _UNREAD

    @property
    def one_acquire(self) -> bool:
        """An acquire alone on its connection: the kind that is parked when unanswered."""
        return len(self.calls) == 1 and ParkedAcquires.wants(self.calls[0])


def _is_new(conn: Any) -> bool:
    """A connection (re)opened since the server was last identified on it: redis-py
    reconnects under us, so the socket itself is what was identified."""
    return getattr(conn, "_redlock_identified", None) is not conn._sock


def _groups(request: Broadcast) -> list[_Group]:
    by_node: dict[int, _Group] = {}
    for index, call in enumerate(request.calls):
        group = by_node.get(call.node)
        if group is None:
            group = by_node[call.node] = _Group(call.node)
        group.indexes.append(index)
        group.calls.append(call)
    return list(by_node.values())


class SyncTransport:
    """One connection pool per node, and scatter/gather over raw connections."""

    def __init__(self, nodes: Iterable[str | redis.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.Redis, "redis.Redis")
        self.pools: list[redis.ConnectionPool] = [
            build_pool(node, redis.ConnectionPool, parse_url, overrides) for node in items]
        self.addresses = node_labels(items)
        self._parked: ParkedAcquires[Any] = ParkedAcquires(len(self.pools))
        # The call sent first on every new connection, and who is told the replies
        # (node -> reply) before the request's replies are returned (set by the manager).
        self.identify: Callable[[int], Call] | None = None
        self.identified: Callable[[dict[int, object]], None] = lambda _: None

    def broadcast(self, request: Broadcast) -> list[object]:
        """Every call's reply or exception. Calls for one node share one connection
        and one write (a pipeline); all nodes are written to before any is read."""
        if self._parked.any():
            self._trail_releases(request)
        deadline = time.monotonic() + request.timeout
        replies: list[object] = [_UNREAD] * len(request.calls)
        pending: list[_Group] = []
        groups = _groups(request)
        try:
            # Scatter. A node with an idle open connection costs a write; a node that
            # needs a new connection (first use, or after a timeout closed it) may take
            # up to a node timeout to connect and handshake (a hung node accepts TCP but
            # never answers AUTH / CLIENT SETINFO). Those connect in parallel, so k hung
            # nodes cost one node timeout, not k.
            slow: list[_Group] = []
            for group in groups:
                if self._has_idle_connection(self.pools[group.node]):
                    self._connect_and_send(group, replies, pending)
                else:
                    slow.append(group)
            if len(slow) == 1:
                self._connect_and_send(slow[0], replies, pending)
            elif slow:
                self._connect_in_parallel(slow, replies, pending)
            while pending:  # gather against one deadline
                group = pending[0]
                parked = self._read(group, replies, deadline)
                pending.pop(0)
                if not parked:
                    self.pools[group.node].release(group.conn)
        finally:
            for group in pending:  # interrupted: these replies will never be read
                if not self._park(group):
                    self._discard(group.node, group.conn)
        identities = {g.node: g.identity for g in groups if g.identity is not _UNREAD}
        if identities:
            self.identified(identities)
        return replies

    def _park(self, group: _Group) -> bool:
        """Keep the connection of an unanswered acquire; False if it is not one."""
        if not group.one_acquire or getattr(group.conn, "_sock", None) is None:
            return False
        evicted = self._parked.park(group.calls[0], group.conn)
        if evicted is not None:
            self._discard(group.node, evicted)
        return True

    def _trail_releases(self, request: Broadcast) -> None:
        """Write each release behind the unanswered acquires of the same owner, then
        close those connections (the FIN follows the release; the node runs both)."""
        for call in request.calls:
            for conn in self._parked.take_for(call):
                with contextlib.suppress(Exception):  # the normal release still runs
                    conn.send_command(*render(call, evalsha=False), check_health=False)
                self._discard(call.node, conn)

    def _discard(self, node: int, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.disconnect()
        with contextlib.suppress(Exception):
            self.pools[node].release(conn)

    @staticmethod
    def _has_idle_connection(pool: redis.ConnectionPool) -> bool:
        """True when the pool can hand out an already open connection (no connect)."""
        idle = getattr(pool, "_available_connections", None)
        try:
            newest = idle[-1] if idle else None  # the one get_connection() pops next
        except IndexError:  # another thread took it meanwhile
            return False
        return getattr(newest, "_sock", None) is not None

    def _connect_and_send(self, group: _Group, replies: list[object],
                          pending: list[_Group]) -> None:
        pool = self.pools[group.node]
        try:
            group.conn = pool.get_connection()
            commands = [render(call, evalsha=True) for call in group.calls]
            if self.identify is not None and _is_new(group.conn):
                group.probed = True
                commands.insert(0, render(self.identify(group.node), evalsha=False))
            group.conn.send_packed_command(group.conn.pack_commands(commands),
                                           check_health=False)
            pending.append(group)
        except Exception as exc:
            for index in group.indexes:
                replies[index] = exc
            if group.conn is not None:
                self._discard(group.node, group.conn)

    def _connect_in_parallel(self, groups: list[_Group], replies: list[object],
                             pending: list[_Group]) -> None:
        """One short-lived thread per new connection; each is bounded by the socket
        timeouts. If the caller is interrupted meanwhile, late connections are closed
        by their own thread instead of leaking."""
        mutex = threading.Lock()
        abandoned = False

        def work(group: _Group) -> None:
            mine: list[_Group] = []
            self._connect_and_send(group, replies, mine)
            with mutex:
                if not abandoned:
                    pending.extend(mine)
                    return
            for late in mine:
                self._discard(late.node, late.conn)

        threads = [threading.Thread(target=work, args=(group,), name="redlock-connect",
                                    daemon=True) for group in groups]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            with mutex:
                abandoned = True

    def _read(self, group: _Group, replies: list[object], deadline: float) -> bool:
        """Read the group's replies in order; True if its connection was parked."""
        conn = group.conn
        try:
            if group.probed:
                try:
                    group.identity = conn.read_response(
                        timeout=max(deadline - time.monotonic(), 0.0005),
                        disconnect_on_error=False)
                except redis.ResponseError as exc:  # e.g. NOPERM: the calls say more
                    group.identity = exc
                conn._redlock_identified = conn._sock  # this connection is known now
            unknown = self._read_replies(conn, group.indexes, replies, deadline)
            if unknown:  # first use of a script on this node (or SCRIPT FLUSH): send bodies
                by_index = dict(zip(group.indexes, group.calls, strict=True))
                conn.send_packed_command(conn.pack_commands(
                    [render(by_index[i], evalsha=False) for i in unknown]), check_health=False)
                self._read_replies(conn, unknown, replies, deadline)
        except Exception as exc:
            # A timeout or a broken connection: this and every later reply are lost.
            for index in group.indexes:
                if replies[index] is _UNREAD:
                    replies[index] = exc
            if isinstance(exc, redis.TimeoutError) and self._park(group):
                return True
            conn.disconnect()  # a late reply must never be read as the next command's
        return False

    @staticmethod
    def _read_replies(conn: Any, indexes: list[int], replies: list[object],
                      deadline: float) -> list[int]:
        """Read one reply per index (an error reply is that call's result); returns the
        indexes answered NOSCRIPT. Timeouts and connection errors propagate."""
        unknown = []
        for index in indexes:
            try:
                replies[index] = conn.read_response(
                    timeout=max(deadline - time.monotonic(), 0.0005), disconnect_on_error=False)
            except NoScriptError:
                unknown.append(index)
                replies[index] = _UNREAD
            except redis.ResponseError as exc:
                replies[index] = exc
        return unknown

    def close(self) -> None:
        for node, conn in self._parked.drain():
            self._discard(node, conn)
        for pool in self.pools:
            pool.disconnect()
