"""The sync transport: parallel requests to N nodes from one thread.

Parallel means parallel on one thread: a request's commands are written to every
node first (scatter), then the replies are read against one shared deadline
(gather), so N nodes cost one round trip and one node timeout at most, not N.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import NoScriptError
from redis.retry import Retry

from redlock._node_config import build_pool, check_node_list, node_labels, pool_overrides
from redlock._protocol import Broadcast, Call
from redlock._transport import ParkedAcquires, render

_Pending = tuple[int, Call, Any]  # (index in the request, call, connection)


class SyncTransport:
    """One connection pool per node, and scatter/gather over raw connections."""

    def __init__(self, nodes: Iterable[str | redis.Redis], node_timeout: float) -> None:
        overrides = pool_overrides(node_timeout, Retry(NoBackoff(), 0))
        items = check_node_list(nodes, redis.Redis, "redis.Redis")
        self.pools: list[redis.ConnectionPool] = [
            build_pool(node, redis.ConnectionPool, parse_url, overrides) for node in items]
        self.addresses = node_labels(items)
        self._parked: ParkedAcquires[Any] = ParkedAcquires(len(self.pools))

    def broadcast(self, request: Broadcast) -> list[object]:
        if self._parked.any():
            self._trail_releases(request)
        deadline = time.monotonic() + request.timeout
        replies: list[object] = [None] * len(request.calls)
        pending: list[_Pending] = []
        try:
            # Scatter. A node with an idle open connection costs a write; a node that
            # needs a new connection (first use, or after a timeout closed it) may take
            # up to a node timeout to connect and handshake (a hung node accepts TCP but
            # never answers AUTH / CLIENT SETINFO). Those connect in parallel, so k hung
            # nodes cost one node timeout, not k.
            slow: list[tuple[int, Call]] = []
            for index, call in enumerate(request.calls):
                if self._has_idle_connection(self.pools[call.node]):
                    self._connect_and_send(index, call, replies, pending)
                else:
                    slow.append((index, call))
            if len(slow) == 1:
                self._connect_and_send(*slow[0], replies, pending)
            elif slow:
                self._connect_in_parallel(slow, replies, pending)
            while pending:  # gather against one deadline
                index, call, conn = pending[0]
                replies[index], parked = self._read(conn, call, deadline)
                pending.pop(0)
                if not parked:
                    self.pools[call.node].release(conn)
        finally:
            for _, call, conn in pending:  # interrupted: these replies will never be read
                if not self._park(call, conn):
                    self._discard(call.node, conn)
        return replies

    def _park(self, call: Call, conn: Any) -> bool:
        """Keep the connection of an unanswered acquire; False if it is not one."""
        if not ParkedAcquires.wants(call) or getattr(conn, "_sock", None) is None:
            return False
        evicted = self._parked.park(call, conn)
        if evicted is not None:
            self._discard(call.node, evicted)
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

    def _connect_and_send(self, index: int, call: Call, replies: list[object],
                          pending: list[_Pending]) -> None:
        pool = self.pools[call.node]
        conn = None
        try:
            conn = pool.get_connection()
            conn.send_command(*render(call, evalsha=True))
            pending.append((index, call, conn))
        except Exception as exc:
            replies[index] = exc
            if conn is not None:
                conn.disconnect()
                pool.release(conn)

    def _connect_in_parallel(self, calls: list[tuple[int, Call]], replies: list[object],
                             pending: list[_Pending]) -> None:
        """One short-lived thread per new connection; each is bounded by the socket
        timeouts. If the caller is interrupted meanwhile, late connections are closed
        by their own thread instead of leaking."""
        mutex = threading.Lock()
        abandoned = False

        def work(index: int, call: Call) -> None:
            mine: list[_Pending] = []
            self._connect_and_send(index, call, replies, mine)
            with mutex:
                if not abandoned:
                    pending.extend(mine)
                    return
            for _, _, conn in mine:
                self._discard(call.node, conn)

        threads = [threading.Thread(target=work, args=item, name="redlock-connect",
                                    daemon=True) for item in calls]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            with mutex:
                abandoned = True

    def _read(self, conn: Any, call: Call, deadline: float) -> tuple[object, bool]:
        """The reply (or the error) and whether the connection was parked."""
        try:
            try:
                return conn.read_response(timeout=max(deadline - time.monotonic(), 0.0005),
                                          disconnect_on_error=False), False
            except NoScriptError:  # first use on this node (or SCRIPT FLUSH): send the body
                conn.send_command(*render(call, evalsha=False))
                return conn.read_response(timeout=max(deadline - time.monotonic(), 0.0005),
                                          disconnect_on_error=False), False
        except redis.TimeoutError as exc:
            if self._park(call, conn):
                return exc, True
            conn.disconnect()  # a late reply must never be read as the next command's
            return exc, False
        except Exception as exc:
            conn.disconnect()
            return exc, False

    def close(self) -> None:
        for node, conn in self._parked.drain():
            self._discard(node, conn)
        for pool in self.pools:
            pool.disconnect()
