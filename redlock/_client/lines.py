"""Where a manager's blocking acquires wait (docs/design.md §6.4, §6.5): the local lines
(turns and hand-off between this manager's waiters) and the wake-ups from releases
anywhere (:class:`WaitingRoom`: one subscription connection per node, opened by the
first wait). The bookkeeping, shared by the sync and asyncio executors, which do the
waiting.

Without the local lines, blocking waiters poll with jittered backoff, and the thread or task that
has just released usually re-acquires before any waiter wakes (under exponential
backoff the longest waiter sleeps longest, so it starves; BENCHMARKS.md has the
figures). Here, per resource (its release channel names it):

* acquire attempts from one manager take turns: two racing attempts would split the
  nodes between them (each wins some, neither a quorum) and both back off;
* waiters queue in arrival order and keep their place across attempts; a release by a
  handle of the manager wakes the first one at once and, for HANDOFF_GRACE, holds
  other local attempts back until it has made its attempt.

Waiters in other processes still rely on their backoff (capped by the holder's PTTL).
Lines exist only while used, so idle resources cost nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from redlock._core.algorithm import RedlockCore
from redlock._core.handoff import Handoffs
from redlock._core.requests import Backoff, Wakeable
from redlock._core.state import LockState
from redlock._io.wakeups import EVERY, WakeRegistry, Watch

# How long a release's handoff to the first local waiter holds off other local
# attempts on that resource: long enough for the woken thread or task to be scheduled,
# short enough that a waiter that died or stalls costs the others little.
HANDOFF_GRACE = 0.1

E = TypeVar("E", bound=Wakeable)
L = TypeVar("L")  # the shell's lock type for taking turns


class Ticket(Generic[E]):
    """One blocking acquire call's place in its resource's line, kept across its
    attempts (a waiter that loses a race keeps its place instead of going to the back)."""

    __slots__ = ("key", "sent", "since", "wake", "watch")

    def __init__(self) -> None:
        self.since = time.monotonic()  # the call started (a release since may be for it)
        self.key: str | None = None
        self.wake: E | None = None  # made on the first wait only
        # The call's watch for releases elsewhere (redlock._io.wakeups), from its first wait
        # to its end: a release heard during an attempt ends the next wait at once.
        self.watch: object | None = None
        # When its latest attempt as a waiter in the nodes' line went out: hand-offs
        # count only by subscriptions confirmed before that (docs/design.md §6.7).
        self.sent: float | None = None


def start_queued_attempt(ticket: Ticket[Any]) -> None:
    """An attempt of a waiter in the nodes' line: it takes no turn (the nodes' line
    decides who may win); a release from here on wakes its next wait at once."""
    ticket.sent = time.monotonic()
    if ticket.wake is not None:
        ticket.wake.clear()


class Line(Generic[E, L]):
    """One resource's line."""

    __slots__ = ("handoff_done", "handoff_to", "handoff_until", "turn", "turn_waiters",
                 "users", "waiting")

    def __init__(self, turn: L) -> None:
        self.turn = turn
        self.turn_waiters = 0  # (asyncio) tasks waiting for the turn: it goes to them first
        self.waiting: list[Ticket[E]] = []
        self.handoff_to: Ticket[E] | None = None
        self.handoff_done: E | None = None  # made by a handoff only
        self.handoff_until = 0.0
        self.users = 0  # threads or tasks inside an attempt or a wait right now

    def idle(self) -> bool:
        return self.users == 0 and not self.waiting and self.handoff_to is None


class LocalLines(Generic[E, L]):
    """The lines of one manager. Nothing here blocks: the shells wait on the events and
    the turn locks these methods hand out (threading or asyncio ones, by the factories)."""

    def __init__(self, new_event: Callable[[], E], new_turn: Callable[[], L]) -> None:
        self._new_event = new_event
        self._new_turn = new_turn
        self._mutex = threading.Lock()  # uncontended on one event loop; cheap either way
        self._lines: dict[str, Line[E, L]] = {}

    def _enter(self, key: str) -> Line[E, L]:  # with self._mutex held
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = Line(self._new_turn())
        line.users += 1
        return line

    def exit(self, key: str, line: Line[E, L]) -> None:
        with self._mutex:
            line.users -= 1
            if line.idle():
                del self._lines[key]

    def _end_handoff(self, line: Line[E, L]) -> None:  # with self._mutex held
        line.handoff_to = None
        if line.handoff_done is not None:
            line.handoff_done.set()
            line.handoff_done = None

    def start_attempt(self, key: str,
                      ticket: Ticket[E]) -> tuple[Line[E, L], E | None, float]:
        """Enter the line for an attempt. Returns it, and the event of a pending handoff
        to another waiter with the time until which to wait for it (None: no wait).
        The caller then takes ``line.turn`` and, after the attempt, calls end_attempt
        (or exit, if it never got the turn)."""
        with self._mutex:
            line = self._enter(key)
            if ticket.wake is not None:
                ticket.wake.clear()  # a release from here on wakes the next wait at once
            done = None
            if line.handoff_to is not None and line.handoff_to is not ticket:
                done = line.handoff_done
            return line, done, line.handoff_until

    def end_attempt(self, key: str, line: Line[E, L], ticket: Ticket[E]) -> None:
        """After the attempt (the caller has released ``line.turn``)."""
        with self._mutex:
            if line.handoff_to is ticket:
                self._end_handoff(line)
            line.users -= 1
            if line.idle():
                del self._lines[key]

    def start_wait(self, key: str, ticket: Ticket[E]) -> tuple[Line[E, L], E]:
        """Join the line (once per acquire call) before a backoff sleep; returns the line
        and the event a release sets. The caller waits on it, then calls exit."""
        with self._mutex:
            line = self._enter(key)
            if ticket.key is None:
                ticket.key = key
                line.waiting.append(ticket)
            if ticket.wake is None:
                ticket.wake = self._new_event()
            return line, ticket.wake

    def leave(self, ticket: Ticket[E]) -> None:
        """The acquire call is over (held, timed out, failed or cancelled)."""
        if ticket.key is None:
            return
        with self._mutex:
            line = self._lines.get(ticket.key)
            if line is None:
                return
            if ticket in line.waiting:
                line.waiting.remove(ticket)
            if line.handoff_to is ticket:
                self._end_handoff(line)
            if line.idle():
                del self._lines[ticket.key]

    def notify(self, key: str) -> None:
        """A handle of this manager released: hand the lock to the first waiter. One
        only: waking them all makes them split the nodes and all back off again."""
        with self._mutex:
            line = self._lines.get(key)
            if line is None or not line.waiting:
                return
            first = line.waiting[0]
            now = time.monotonic()
            if line.handoff_to is None or now >= line.handoff_until:
                line.handoff_to = first
                line.handoff_done = self._new_event()
                line.handoff_until = now + HANDOFF_GRACE
            if first.wake is not None:
                first.wake.set()

    def idle(self) -> bool:
        """No line left: no call of this manager waits, attempts or hands off (nothing
        stays behind per resource). A look without the lock: a line that comes or goes
        meanwhile is seen at the next look."""
        return not self._lines


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
