"""The asyncio client's release listener (docs/design.md §6.4): per node, one subscription
connection (:class:`~redlock._io.async_wire.Wire`) and a task that keeps its subscriptions;
what to subscribe to and whom to wake: :mod:`redlock._io.wakeups`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from redlock._io import resp, wakeups
from redlock._io.async_transport import wait_event, within
from redlock._io.async_wire import IGNORE, Wire, open_wire
from redlock._io.endpoint import Endpoint

# The longest a node's task waits for news: it sends a due ping and drops lingering
# channels at least this often.
_TICK = 1.0


class AsyncReleaseListener:
    """Subscription connections to every node, for one manager, on one event loop."""

    def __init__(self, endpoints: Sequence[Endpoint], addresses: Sequence[str],
                 connect_timeout: float, registry: wakeups.WakeRegistry) -> None:
        self._endpoints = endpoints
        self._addresses = addresses
        self._connect_timeout = connect_timeout
        self._registry = registry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None] | None] = [None] * len(endpoints)
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
            self._tasks = [None] * len(self._endpoints)
            self._changed = [asyncio.Event() for _ in self._endpoints]
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
        changed = self._changed[node]
        delay = wakeups.RECONNECT_MIN
        while not self._closed:
            if subscription.idle() and not self._registry.wanted():
                return  # nothing to listen to; the next wait starts a new task
            try:
                wire = await within(open_wire(self._endpoints[node], node,
                                              self._connect_timeout), self._connect_timeout)
            except Exception:
                subscription.check_idle()
                await asyncio.sleep(delay)
                delay = min(2 * delay, wakeups.RECONNECT_MAX)
                continue
            delay = wakeups.RECONNECT_MIN
            refusal: list[BaseException] = []

            def heard(message: object, wire: Wire = wire,
                      refusal: list[BaseException] = refusal) -> None:
                if isinstance(message, resp.ReplyError):  # SUBSCRIBE refused: an ACL
                    refusal.append(message)
                    wire.close()
                else:
                    subscription.heard(message)

            wire.messages = heard
            wire.on_broken = lambda _wire: changed.set()
            try:
                await self._keep(wire, subscription, changed)
            finally:
                subscription.lost()
                wire.on_broken = None
                wire.close()
            if refusal:
                self._registry.refused(node, self._addresses[node], refusal[0])
                self._refused.add(node)
                return

    async def _keep(self, wire: Wire, subscription: wakeups.NodeSubscription,
                    changed: asyncio.Event) -> None:
        """Send what the subscription needs until the connection breaks or goes silent,
        or there is nothing left to listen to."""
        while wire.alive:
            changed.clear()
            commands = subscription.commands()
            if commands:
                wire.send(resp.pack(commands), IGNORE, 0)
            if subscription.idle() and not self._registry.wanted():
                return
            if subscription.silent():
                return
            await wait_event(changed, _TICK)
