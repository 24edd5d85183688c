"""The asyncio client renews its auto-extended locks from a thread of its own, over blocking
connections of its own (docs/design.md §5.1): a task runs only when the event loop gets to it, and
a loaded loop gets to it late enough to lose healthy locks (BENCHMARKS.md, "Figures quoted in the
library's comments"); a thread gets the interpreter within its switch interval whatever the loop
does.

It drives the sync client's renewal flow (redlock/_core/renewals.py) over a :class:`SyncTransport`
of its own to the same endpoints. What must happen on the loop is handed to it: a loss (``on_lost``
runs as a task there) and a node found restarted (the maintenance is a task)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from redlock._client.executors import SyncExecutor
from redlock._client.waiting_room import WaitingRoom
from redlock._core.algorithm import RedlockCore
from redlock._core.requests import Flow
from redlock._core.state import LockState
from redlock._io.endpoint import Endpoint
from redlock._io.sync_transport import SyncTransport


class RenewalThread:
    """Runs the renewal loop of one :class:`AsyncRedlock` (in one process) in a thread.

    ``start(flow)`` runs the loop's flow in a new thread (the loop ends when no lock is
    left to renew; the next auto-extended acquire starts another); ``lost`` and
    ``maintain`` hand their work to the event loop that started it; ``close()`` (once
    the loop has ended) closes the connections."""

    def __init__(self, endpoints: list[Endpoint], addresses: list[str],
                 connect_timeout: float, identify: Any, room: WaitingRoom, core: RedlockCore,
                 lost: Callable[[LockState, list[Any]], None],
                 maintain: Callable[[], None]) -> None:
        self._transport = SyncTransport(endpoints, addresses, connect_timeout, identify)
        self._close_timeout = 2 * connect_timeout + 1.0
        self._executor = SyncExecutor(self._transport, room, core, self._maintain, None)
        self._lost = lost
        self._maintain_on_loop = maintain
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self, flow: Flow[None]) -> threading.Thread:
        """Run the renewal loop's ``flow`` in a new daemon thread (called on the loop)."""
        self._loop = asyncio.get_running_loop()
        thread = self.thread = threading.Thread(target=self._run, args=(flow,),
                                                name="redlock-renewals", daemon=True)
        thread.start()
        return thread

    def _run(self, flow: Flow[None]) -> None:
        # A failure inside is the flow's to report: it logs redlock.renewals_crashed
        # and marks its locks lost (redlock/_core/renewals.py).
        self._executor.drive(flow)

    def _on_loop(self, function: Callable[..., object], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # the application's loop is gone: nobody is left to tell
        with contextlib.suppress(RuntimeError):  # closed between the check and the call
            loop.call_soon_threadsafe(function, *args)

    def lost(self, state: LockState, handles: list[Any]) -> None:
        """A renewed lock was lost: its handles are told on the loop."""
        self._on_loop(self._lost, state, handles)

    def _maintain(self) -> None:
        self._on_loop(self._maintain_on_loop)

    async def join(self, timeout: float) -> bool:
        """Wait, without blocking the loop, until the thread has ended (True) or
        ``timeout`` seconds have passed (False)."""
        return await ended(self.thread, timeout)

    async def close(self) -> None:
        """Close the connections (in a helper thread: closing may wait for a late reply up to
        ``connect_timeout``, and the loop must not block meanwhile). The transport bounds its own
        close; this bound only keeps a bug there from hanging the application's close()."""
        closer = threading.Thread(target=self._transport.close,
                                  name="redlock-renewals-close", daemon=True)
        closer.start()
        await ended(closer, self._close_timeout)

    def forget(self) -> SyncTransport:
        """In a forked child: the parent's connections, never to be touched here."""
        return self._transport


async def ended(thread: threading.Thread | None, timeout: float) -> bool:
    """Whether ``thread`` (None: none was started) ended within ``timeout`` seconds,
    polled from the loop, which stays free meanwhile."""
    until = time.monotonic() + timeout
    while thread is not None and thread.is_alive() and time.monotonic() < until:
        await asyncio.sleep(0.005)
    return thread is None or not thread.is_alive()
