"""The asyncio client's release listener: per node, one subscription connection with a
task that reads it and one that keeps its subscriptions, started when a blocking
acquire first waits and stopped after a while with nothing to listen to
(docs/design.md §6; what to subscribe to and whom a message wakes is decided in
:mod:`redlock._io.wakeups`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError

from redlock._io import wakeups
from redlock._io.async_transport import wait_event, within

# The longest a node's task waits for news: it sends a due ping and drops lingering
# channels at least this often.
_TICK = 1.0


class AsyncReleaseListener:
    """Subscription connections to every node, for one manager, on one event loop."""

    def __init__(self, pools: Sequence[redis.asyncio.ConnectionPool], addresses: Sequence[str],
                 connect_timeout: float, registry: wakeups.WakeRegistry) -> None:
        self._pools = pools
        self._addresses = addresses
        self._connect_timeout = connect_timeout
        self._registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None] | None] = [None] * len(pools)
        self._changed: list[asyncio.Event] = []
        self._refused: set[int] = set()  # nodes whose ACL refuses SUBSCRIBE
        self._closed = False

    def ensure_running(self) -> None:
        """A task per node on the running loop (one whose node refused SUBSCRIBE stays
        off). A manager used from a new event loop starts over on it."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the old loop's tasks went with it
            self._loop = loop
            self._tasks = [None] * len(self._pools)
            self._changed = [asyncio.Event() for _ in self._pools]
        for node, task in enumerate(self._tasks):
            if (task is None or task.done()) and node not in self._refused:
                self._tasks[node] = loop.create_task(self._run(node),
                                                     name=f"redlock-listener-{node}")

    def poke(self) -> None:
        """Wake every node's task (the wanted channels changed)."""
        for changed in self._changed:
            changed.set()

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in self._tasks if t is not None and not t.done()]
        if self._loop is not asyncio.get_running_loop():
            return  # they belong to another (closed) loop
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- one node ----------------------------------------------------------------------

    async def _run(self, node: int) -> None:
        subscription = wakeups.NodeSubscription(node, self._registry)
        delay = wakeups.RECONNECT_MIN
        while not self._closed:
            if subscription.idle() and not self._registry.wanted():
                return  # nothing to listen to; the next wait starts a new task
            conn = wakeups.subscription_connection(self._registry, node, self._addresses[node],
                                           self._pools[node], self._connect_timeout, None,
                                           Retry(NoBackoff(), 0))
            if conn is None:
                self._refused.add(node)
                return
            try:
                await within(conn.connect(), self._connect_timeout)
            except Exception:
                await _disconnect(conn)
                subscription.check_idle()
                await asyncio.sleep(delay)
                delay = min(2 * delay, wakeups.RECONNECT_MAX)
                continue
            delay = wakeups.RECONNECT_MIN
            reader = asyncio.get_running_loop().create_task(self._read(conn, subscription))
            try:
                await self._keep(conn, subscription, reader, self._changed[node])
            finally:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
                subscription.lost()
                await _disconnect(conn)
            if isinstance(_error(reader), ResponseError):  # SUBSCRIBE refused: an ACL
                self._registry.refused(node, self._addresses[node], _error(reader))
                self._refused.add(node)
                return

    async def _keep(self, conn: Any, subscription: wakeups.NodeSubscription,
                    reader: asyncio.Task[None], changed: asyncio.Event) -> None:
        """Send what the subscription needs until the reader ends (the connection broke),
        the connection goes silent, or there is nothing left to listen to."""
        while not reader.done():
            changed.clear()
            for command in subscription.commands():
                await conn.send_command(*command, check_health=False)
            if subscription.idle() and not self._registry.wanted():
                return
            if subscription.silent():
                return
            await wait_event(changed, _TICK)

    @staticmethod
    async def _read(conn: Any, subscription: wakeups.NodeSubscription) -> None:
        while True:
            subscription.heard(await conn.read_response(disconnect_on_error=False))


def _error(task: asyncio.Task[None]) -> BaseException:
    if task.cancelled() or not task.done():
        return asyncio.CancelledError()
    return task.exception() or asyncio.CancelledError()


async def _disconnect(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.disconnect()
