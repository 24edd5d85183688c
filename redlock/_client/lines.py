"""Fair handoff between the waiters of one lock manager in this process: the
bookkeeping, shared by the sync and asyncio shells, which only add the waiting.

Without it, blocking waiters poll with jittered backoff, and the thread or task that
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
from typing import Generic, TypeVar

from redlock._core.requests import Wakeable

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

    @staticmethod
    def start_queued_attempt(ticket: Ticket[E]) -> None:
        """An attempt of a waiter in the nodes' line: it takes no turn (the nodes' line
        decides who may win); a release from here on wakes its next wait at once."""
        ticket.sent = time.monotonic()
        if ticket.wake is not None:
            ticket.wake.clear()

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

    def busy(self, key: str) -> bool:
        """Whether a call of this manager is in ``key``'s line (an attempt, a wait, a
        hand-off): the quick lane then stays out of it (docs/design.md §2.6)."""
        return key in self._lines
