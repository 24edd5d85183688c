"""Where a manager's blocking acquires wait (docs/design.md §6.4, §6.5): the local
turns (in-process order and the wake of the first local waiter) and the wake-ups from
releases anywhere (:class:`WaitingRoom`), shared by both executors, which do the
waiting. Without them the thread or task that just released usually re-acquires
before any waiter wakes, and the longest waiter starves."""

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

# How long the first local waiter a release woke holds off other local attempts on that resource:
# long enough to be scheduled, short enough that one that died or stalls costs the others little.
WAKE_GRACE = 0.1

E = TypeVar("E", bound=Wakeable)
L = TypeVar("L")  # the shell's lock type for taking turns


class Waiter(Generic[E]):
    """A driven call's place in its resource's local turns and its watch for releases,
    kept across its attempts (a waiter that loses a race keeps its place)."""

    __slots__ = ("key", "sent", "since", "wake", "watch")

    def __init__(self) -> None:
        self.since = time.monotonic()  # the call started (a release since may be for it)
        self.key: str | None = None
        self.wake: E | None = None  # made on the first wait only
        # From its first wait to its end: a release heard during an attempt ends the
        # next wait at once.
        self.watch: object | None = None
        # When its latest attempt as a waiter in the nodes' line went out: hand-offs
        # count only by subscriptions confirmed before that (docs/design.md §6.7).
        self.sent: float | None = None


def start_queued_attempt(waiter: Waiter[Any]) -> None:
    """An attempt of a waiter in the nodes' line: it takes no turn (the nodes' line
    decides who may win); a release from here on wakes its next wait at once."""
    waiter.sent = time.monotonic()
    if waiter.wake is not None:
        waiter.wake.clear()


class Turns(Generic[E, L]):
    """One resource's local turns: the turn lock, the local waiters in arrival order,
    and the first one a release woke (``woken``) until it has tried."""

    __slots__ = ("turn", "turn_waiters", "users", "waiting", "woken", "woken_done", "woken_until")

    def __init__(self, turn: L) -> None:
        self.turn = turn
        self.turn_waiters = 0  # (asyncio) tasks waiting for the turn: it goes to them first
        self.waiting: list[Waiter[E]] = []
        self.woken: Waiter[E] | None = None
        self.woken_done: E | None = None  # made by a wake only
        self.woken_until = 0.0
        self.users = 0  # threads or tasks inside an attempt or a wait right now

    def idle(self) -> bool:
        return self.users == 0 and not self.waiting and self.woken is None


class LocalTurns(Generic[E, L]):
    """The local turns of one manager, per resource. Nothing here blocks: the shells
    wait on the events and turn locks these methods hand out."""

    def __init__(self, new_event: Callable[[], E], new_turn: Callable[[], L]) -> None:
        self._new_event = new_event
        self._new_turn = new_turn
        self._mutex = threading.Lock()  # uncontended on one event loop; cheap either way
        self._turns: dict[str, Turns[E, L]] = {}

    def _enter(self, key: str) -> Turns[E, L]:  # with self._mutex held
        turns = self._turns.get(key)
        if turns is None:
            turns = self._turns[key] = Turns(self._new_turn())
        turns.users += 1
        return turns

    def exit(self, key: str, turns: Turns[E, L]) -> None:
        with self._mutex:
            turns.users -= 1
            if turns.idle():
                del self._turns[key]

    def _end_wake(self, turns: Turns[E, L]) -> None:  # with self._mutex held
        turns.woken = None
        if turns.woken_done is not None:
            turns.woken_done.set()
            turns.woken_done = None

    def start_attempt(self, key: str, waiter: Waiter[E]) -> tuple[Turns[E, L], E | None, float]:
        """Enter the resource's turns for an attempt. Returns them, and the event of
        another waiter's pending wake with the time until which to wait for it (None: no
        wait). The caller then takes ``turns.turn`` and, after the attempt, calls
        end_attempt (or exit, if it never got the turn)."""
        with self._mutex:
            turns = self._enter(key)
            if waiter.wake is not None:
                waiter.wake.clear()  # a release from here on wakes the next wait at once
            done = None
            if turns.woken is not None and turns.woken is not waiter:
                done = turns.woken_done
            return turns, done, turns.woken_until

    def end_attempt(self, key: str, turns: Turns[E, L], waiter: Waiter[E]) -> None:
        """After the attempt (the caller has released ``turns.turn``)."""
        with self._mutex:
            if turns.woken is waiter:
                self._end_wake(turns)
            turns.users -= 1
            if turns.idle():
                del self._turns[key]

    def start_wait(self, key: str, waiter: Waiter[E]) -> tuple[Turns[E, L], E]:
        """Join the waiting (once per acquire call) before a backoff sleep; returns the
        turns and the event a release sets. The caller waits on it, then calls exit."""
        with self._mutex:
            turns = self._enter(key)
            if waiter.key is None:
                waiter.key = key
                turns.waiting.append(waiter)
            if waiter.wake is None:
                waiter.wake = self._new_event()
            return turns, waiter.wake

    def leave(self, waiter: Waiter[E]) -> None:
        """The acquire call is over (held, timed out, failed or cancelled)."""
        if waiter.key is None:
            return
        with self._mutex:
            turns = self._turns.get(waiter.key)
            if turns is None:
                return
            if waiter in turns.waiting:
                turns.waiting.remove(waiter)
            if turns.woken is waiter:
                self._end_wake(turns)
            if turns.idle():
                del self._turns[waiter.key]

    def notify(self, key: str) -> None:
        """A handle of this manager released: wake the first local waiter. One only:
        waking them all makes them split the nodes and all back off again."""
        with self._mutex:
            turns = self._turns.get(key)
            if turns is None or not turns.waiting:
                return
            first = turns.waiting[0]
            now = time.monotonic()
            if turns.woken is None or now >= turns.woken_until:
                turns.woken = first
                turns.woken_done = self._new_event()
                turns.woken_until = now + WAKE_GRACE
            if first.wake is not None:
                first.wake.set()

    def idle(self) -> bool:
        """No call of this manager waits, attempts or is woken (nothing stays behind per resource).
        A look without the lock: turns that come or go meanwhile are seen at the next look."""
        return not self._turns


class Listener(Protocol):
    """A release listener of either flavour (redlock._io.sync_listener, async_listener)."""

    def ensure_running(self) -> None: ...
    def poke(self) -> None: ...


class WaitingRoom:
    """One manager's local turns and release wake-ups (one per process: a forked child
    makes its own). ``open_listener`` builds the flavour's listener over ``wakeups``."""

    def __init__(self, core: RedlockCore, new_event: Callable[[], Wakeable],
                 new_turn: Callable[[], Any], open_listener: Callable[[WakeRegistry], Any],
                 closing: Wakeable) -> None:
        self._core = core
        self._open_listener = open_listener
        self._closing = closing
        self.turns: LocalTurns[Any, Any] = LocalTurns(new_event, new_turn)
        # Releases anywhere wake waiters here: the subscriptions are opened when a
        # blocking acquire first waits.
        self.wakeups = WakeRegistry(changed=self._poke)
        self.listener: Any = None
        self._mutex = threading.Lock()

    def _poke(self) -> None:
        if self.listener is not None:
            self.listener.poke()

    def watch_releases(self, backoff: Backoff, waiter: Waiter[Any]) -> float:
        """From an acquire call's first wait to its end (:meth:`end_call`), a release on the wait's
        channels wakes it (``waiter.wake``). Returns how long to wait: the patient wait once every
        channel is heard from a quorum of nodes subscribed before the call's latest attempt went
        out; else its backoff, no longer (a release it did not hear may have handed it the lock,
        docs/design.md §6.4)."""
        if (waiter.watch is None and waiter.wake is not None and backoff.channels
                and not self._closing.is_set()):
            waiter.watch = self.wakeups.watch(backoff.channels, backoff.waiter, waiter.wake,
                                              since=waiter.since)
            with self._mutex:  # one listener, even when threads race here
                if self.listener is None:
                    self.listener = self._open_listener(self.wakeups)
                listener = self.listener
            listener.ensure_running()
        if waiter.watch is not None and backoff.patient is not None:
            channels = backoff.channels
            if all(self.wakeups.heard_since(c, waiter.sent, self._core.quorum) for c in channels):
                return backoff.patient
            if all(self.wakeups.live(c) for c in channels):  # heard now, not since then
                return min(backoff.seconds, backoff.patient)
        return backoff.seconds

    def handoffs(self, waiter: Waiter[Any]) -> Handoffs:
        """The hand-offs the call's watch heard so far by subscriptions that were up
        before its latest attempt went out (docs/design.md §6.7)."""
        if isinstance(waiter.watch, Watch):
            return self.wakeups.handoffs(waiter.watch).since(waiter.sent)
        return Handoffs()

    def more_handoffs(self, waiter: Waiter[Any], than: int,
                      wake_at: tuple[int, int] | None = None) -> bool:
        """A wait for more hand-offs starts: True if it should end at once (more heard
        than ``than``; with ``wake_at``, as many as it waits for). Until the call's next
        wait, messages wake it as ``wake_at`` says (:meth:`WakeRegistry.expect`)."""
        if not isinstance(waiter.watch, Watch):
            return False
        return self.wakeups.expect(waiter.watch, than, wake_at)

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

    def end_call(self, waiter: Waiter[Any]) -> None:
        """A driven call is over: leave the local turns, stop watching for releases."""
        self.turns.leave(waiter)
        if isinstance(waiter.watch, Watch):
            self.wakeups.unwatch(waiter.watch)
            waiter.watch = None

    def released(self, state: LockState) -> None:
        """Wake this manager's first local waiter for what ``state`` held, unless the release's
        own message wakes the first in the nodes' line (a subscribed channel)."""
        if self.turns.idle():  # nobody of this manager waits (a waiter that comes in
            return  # after this look tries after the release: it finds the lock free)
        key = self._core.turns_key(state.resources, state.kind)
        if len(state.resources) > 1 or not self.wakeups.live(key):
            self.turns.notify(key)  # a set's turns have no channel of their own
        if len(state.resources) > 1:  # waiters for a single resource of the set, too
            for resource in state.resources:
                channel = self._core.keys.channel(resource)
                if not self.wakeups.live(channel):
                    self.turns.notify(channel)
