"""Where a manager's blocking acquires wait (docs/design.md §6.4, §6.5): the local
lines (turns and hand-off between this manager's waiters) and the wake-ups from
releases anywhere (one subscription connection per node, opened by the first wait).
Both executors use it; it does no waiting itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from redlock._client.lines import LocalLines, Ticket
from redlock._core.algorithm import RedlockCore
from redlock._core.handoff import Handoffs
from redlock._core.requests import Backoff, Wakeable
from redlock._core.state import LockState
from redlock._io.wakeups import EVERY, WakeRegistry, Watch


class Listener(Protocol):
    """A release listener of either flavour (redlock._io.sync_listener, async_listener)."""

    def ensure_running(self) -> None: ...
    def poke(self) -> None: ...


class WaitingRoom:
    """One manager's local lines and release wake-ups (one per process: a forked child
    makes its own). ``open_listener`` builds the flavour's listener over ``wakeups``."""

    def __init__(self, core: RedlockCore, new_event: Callable[[], Wakeable],
                 new_turn: Callable[[], Any], open_listener: Callable[[WakeRegistry], Any],
                 closing: Wakeable) -> None:
        self._core = core
        self._open_listener = open_listener
        self._closing = closing
        self.lines: LocalLines[Any, Any] = LocalLines(new_event, new_turn)
        # Releases anywhere wake waiters here: the subscriptions are opened when a
        # blocking acquire first waits.
        self.wakeups = WakeRegistry(changed=self._poke)
        self.listener: Any = None
        self._mutex = threading.Lock()

    def _poke(self) -> None:
        if self.listener is not None:
            self.listener.poke()

    def watch_releases(self, backoff: Backoff, ticket: Ticket[Any]) -> float:
        """From an acquire call's first wait to its end (:meth:`end_call`), a release on
        the wait's channels wakes it (``ticket.wake``). Returns how long to wait: the
        patient wait once releases on every channel are heard from a quorum of nodes,
        subscribed there before the call's latest attempt went out. A release in
        between, on a node not yet subscribed, was not heard: it may have handed the
        lock to this very call, which would then sleep its whole patient wait (0.5 s)
        holding a reservation nobody else can take (docs/design.md §6.7). Then it
        waits its backoff instead, no longer than the patient wait, and tries again."""
        if (ticket.watch is None and ticket.wake is not None and backoff.channels
                and not self._closing.is_set()):
            ticket.watch = self.wakeups.watch(backoff.channels, backoff.waiter, ticket.wake,
                                              since=ticket.since)
            with self._mutex:  # one listener, even when threads race here
                if self.listener is None:
                    self.listener = self._open_listener(self.wakeups)
                listener = self.listener
            listener.ensure_running()
        if ticket.watch is not None and backoff.patient is not None:
            channels = backoff.channels
            if all(self.wakeups.heard_since(c, ticket.sent, self._core.quorum)
                   for c in channels):
                return backoff.patient
            if all(self.wakeups.live(c) for c in channels):  # heard now, not since then
                return min(backoff.seconds, backoff.patient)
        return backoff.seconds

    def handoffs(self, ticket: Ticket[Any]) -> Handoffs:
        """The hand-offs the call's watch heard so far by subscriptions that were up
        before its latest attempt went out (docs/design.md §6.7)."""
        if isinstance(ticket.watch, Watch):
            return self.wakeups.handoffs(ticket.watch).since(ticket.sent)
        return Handoffs()

    def more_handoffs(self, ticket: Ticket[Any], than: int,
                      wake_at: tuple[int, int] | None = None) -> bool:
        """A wait for more hand-offs starts: True if it should end at once (more heard
        than ``than``; with ``wake_at``, as many as it waits for). Until the call's next
        wait, messages wake it as ``wake_at`` says (:meth:`WakeRegistry.expect`)."""
        if not isinstance(ticket.watch, Watch):
            return False
        return self.wakeups.expect(ticket.watch, than, wake_at)

    def watch_every(self, channels: tuple[str, ...], event: Wakeable) -> Callable[[], None]:
        """Set ``event`` on every message on ``channels`` (an election's observer,
        docs/design.md §12.1) until the returned function is called."""
        watch = self.wakeups.watch(channels, EVERY, event)
        with self._mutex:
            if self.listener is None:
                self.listener = self._open_listener(self.wakeups)
            listener = self.listener
        listener.ensure_running()
        return lambda: self.wakeups.unwatch(watch)

    def end_call(self, ticket: Ticket[Any]) -> None:
        """A driven call is over: leave the local line, stop watching for releases."""
        self.lines.leave(ticket)
        if isinstance(ticket.watch, Watch):
            self.wakeups.unwatch(ticket.watch)
            ticket.watch = None

    def released(self, state: LockState) -> None:
        """Wake this manager's local waiters for what ``state`` held, unless the
        release's own message does (a subscribed channel: the message wakes the first
        in the nodes' line, wherever it waits; waking the first local waiter as well
        would cost an attempt whenever that is not the same waiter)."""
        if self.lines.idle():  # nobody of this manager waits (a waiter that comes in
            return  # after this look tries after the release: it finds the lock free)
        line = self._core.line(state.resources, state.kind)
        if len(state.resources) > 1 or not self.wakeups.live(line):
            self.lines.notify(line)  # a set's local line has no channel of its own
        if len(state.resources) > 1:  # waiters for a single resource of the set, too
            for resource in state.resources:
                channel = self._core.keys.channel(resource)
                if not self.wakeups.live(channel):
                    self.lines.notify(channel)
