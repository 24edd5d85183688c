"""Running flows: one executor per flavour (docs/design.md §10). An executor carries out
each request a flow yields: a broadcast through the transport (taking turns in the
local turns when the request asks it), a wait of one of the three kinds, a user callback;
and drives the flow to its end, handing what each broadcast learnt to the core
(``absorb``) and, once the call is over, leaving the local turns and seeing to nodes that
newly need the background maintenance. Every operation runs this way, the usual
uncontended acquire and release included (docs/design.md §2.6)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

from redlock._client.waiting_room import Waiter, WaitingRoom, start_queued_attempt
from redlock._core.algorithm import RedlockCore
from redlock._core.requests import (
    LAST_ROUND,
    NO_REPLY,
    Backoff,
    Broadcast,
    Flow,
    Invoke,
    PauseUntilWoken,
    Request,
    Wait,
    drive,
    drive_async,
)
from redlock._io.async_transport import AsyncTransport, wait_event, within
from redlock._io.sync_transport import SyncTransport

T = TypeVar("T")


class _Executor:
    """What both executors hold: the waiting room, the core's ``absorb`` and node health, the
    ``maintain`` hook for restarted or amnesiac nodes, a test's sleep (None: the real waits)."""

    def __init__(self, room: WaitingRoom, core: RedlockCore, maintain: Callable[[], None],
                 sleep: Callable[[float], Any] | None) -> None:
        self._room = room
        self._absorb = core.absorb
        self._health = core.amnesia.health
        self._maintain = maintain
        self._sleep = sleep

    def _start_backoff(self, waiter: Waiter[Any], request: Backoff) -> tuple[Any, Any, float]:
        """A backoff starts: nodes found restarted are seen to, the call waits in its
        resource's local turns (returned, with the event that wakes it), and listens for
        releases (how long to wait)."""
        self._maintain()  # a blocking acquire met a restarted node: see to it now
        turns, wake = self._room.turns.start_wait(request.turns_key, waiter)
        seconds = self._room.watch_releases(request, waiter)
        if request.heard_before is not None:  # a wait for more hand-offs (§6.7)
            wake.clear()
            if self._room.more_handoffs(waiter, request.heard_before, request.wake_at):
                seconds = 0.0
        return turns, wake, seconds

    def _end_call(self, waiter: Waiter[Any]) -> None:
        """A driven call is over (asked only when there is something to do): out of its
        local turns, and a node its requests found restarted or unmarked is seen to."""
        if waiter.key is not None or waiter.watch is not None:
            self._room.end_call(waiter)
        if self._health.news:
            self._maintain()


def after_waiting(request: Broadcast, started: float) -> Broadcast:
    """An attempt that waited for its turn (or another waiter's local wake) since ``started``: what
    is left of its timeout, which bounds the wait and the round together, so the caller's deadline
    holds however long another attempt kept the turn. Not below LAST_ROUND: the round still goes
    out, with or without the turn (taking turns only spares the nodes a split vote, §6.5)."""
    waited = time.monotonic() - started
    if waited < 0.001:  # the usual case: no one else's attempt was under way
        return request
    return replace(request, timeout=max(LAST_ROUND, request.timeout - waited))


class SyncExecutor(_Executor):
    """The sync client's: requests run on the calling thread; waits block it. ``sleep``: a test's
    injected sleep, honoured for every wait but one that a signal ends (``PauseUntilWoken``)."""

    def __init__(self, transport: SyncTransport, room: WaitingRoom, core: RedlockCore,
                 maintain: Callable[[], None], sleep: Callable[[float], Any] | None) -> None:
        super().__init__(room, core, maintain, sleep)
        self._transport = transport

    def drive(self, flow: Flow[T]) -> T:
        waiter: Waiter[threading.Event] = Waiter()
        try:
            return drive(flow, functools.partial(self._execute, waiter), self._absorb)
        finally:
            if waiter.key is not None or waiter.watch is not None or self._health.news:
                self._end_call(waiter)

    def _execute(self, waiter: Waiter[threading.Event], request: Request) -> Sequence[object]:
        if type(request) is Broadcast:
            if request.turns_key is None:  # (a release, an extend: no turns)
                return self._transport.broadcast(request)
            if not request.turns:  # a waiter in the nodes' line: no turns (§6.5)
                start_queued_attempt(waiter)
                return self._transport.broadcast(request)
            return self._broadcast(waiter, request)
        if isinstance(request, Invoke):
            request.function(*request.args)
        else:
            self._wait(waiter, cast(Wait, request))
            if isinstance(request, Backoff):
                return self._room.handoffs(waiter)
        return NO_REPLY

    def _broadcast(self, waiter: Waiter[threading.Event], request: Broadcast) -> Sequence[object]:
        """An acquire attempt that takes its turn first (local turns, §6.5)."""
        assert request.turns_key is not None
        local = self._room.turns
        started = time.monotonic()
        turns, woken, until = local.start_attempt(request.turns_key, waiter)
        try:
            if woken is not None:
                woken.wait(max(0.0, min(until, started + request.timeout) - time.monotonic()))
            turn = turns.turn.acquire(
                timeout=max(0.0, started + request.timeout - time.monotonic()))
        except BaseException:
            local.exit(request.turns_key, turns)
            raise
        try:
            return self._transport.broadcast(after_waiting(request, started))
        finally:
            if turn:
                turns.turn.release()
            local.end_attempt(request.turns_key, turns, waiter)

    def _wait(self, waiter: Waiter[threading.Event], request: Wait) -> None:
        if isinstance(request, PauseUntilWoken):
            cast(threading.Event, request.wake).wait(request.seconds)
        elif self._sleep is not None:  # an injected sleep (tests) is honoured as given
            self._sleep(request.seconds)
        elif isinstance(request, Backoff):
            turns, wake, seconds = self._start_backoff(waiter, request)
            try:
                wake.wait(seconds)
            finally:
                self._room.turns.exit(request.turns_key, turns)
        else:
            time.sleep(request.seconds)


class AsyncExecutor(_Executor):
    """The asyncio client's: requests run in the calling task; waits await.
    ``sleep``: a test's injected sleep (a coroutine function), as for the sync one."""

    def __init__(self, transport: AsyncTransport, room: WaitingRoom, core: RedlockCore,
                 maintain: Callable[[], None], sleep: Callable[[float], Any] | None) -> None:
        super().__init__(room, core, maintain, sleep)
        self._transport = transport

    def drive(self, flow: Flow[T]) -> Awaitable[T]:
        """The flow's end, an awaitable (the driver's coroutine itself: no coroutine of
        the executor's around it, which every resumption would pass through)."""
        waiter: Waiter[Any] = Waiter()
        return drive_async(flow, functools.partial(self._execute, waiter), self._absorb,
                           functools.partial(self._ended, waiter))

    def _ended(self, waiter: Waiter[Any]) -> None:
        if waiter.key is not None or waiter.watch is not None or self._health.news:
            self._end_call(waiter)

    def _execute(self, waiter: Waiter[Any], request: Request) -> Awaitable[Sequence[object]]:
        """What carries out ``request``: a broadcast's the transport's own awaitable."""
        if type(request) is Broadcast:
            if request.turns_key is None:  # (a release, an extend: no turns)
                return self._transport.broadcast(request)
            if not request.turns:  # a waiter in the nodes' line: no turns (§6.5)
                start_queued_attempt(waiter)
                return self._transport.broadcast(request)
            return self._broadcast(waiter, request)
        return self._other(waiter, request)

    async def _other(self, waiter: Waiter[Any], request: Request) -> Sequence[object]:
        if isinstance(request, Invoke):
            outcome = request.function(*request.args)
            if inspect.isawaitable(outcome):
                await outcome
        else:
            await self._wait(waiter, cast(Wait, request))
            if isinstance(request, Backoff):
                return self._room.handoffs(waiter)
        return NO_REPLY

    async def _broadcast(self, waiter: Waiter[Any], request: Broadcast) -> Sequence[object]:
        """An acquire attempt that takes its turn first (local turns, §6.5)."""
        assert request.turns_key is not None
        local = self._room.turns
        started = time.monotonic()
        turns, woken, until = local.start_attempt(request.turns_key, waiter)
        try:
            if woken is not None:
                await wait_event(woken, min(until, started + request.timeout) - time.monotonic())
            turn = True
            # Another attempt has the turn, or one it was handed to has yet to run: wait,
            # within the round.
            if turns.turn.locked() or turns.turn_waiters:
                turns.turn_waiters += 1
                try:
                    await within(turns.turn.acquire(),
                                 max(0.0, started + request.timeout - time.monotonic()))
                except asyncio.TimeoutError:
                    turn = False
                finally:
                    turns.turn_waiters -= 1
            else:  # free: taken at once (no suspension), without a timeout's timer
                await turns.turn.acquire()
        except BaseException:
            local.exit(request.turns_key, turns)
            raise
        try:
            return await self._transport.broadcast(after_waiting(request, started))
        finally:
            if turn:
                turns.turn.release()
            local.end_attempt(request.turns_key, turns, waiter)

    async def _wait(self, waiter: Waiter[Any], request: Wait) -> None:
        if isinstance(request, PauseUntilWoken):
            await wait_event(cast(asyncio.Event, request.wake), request.seconds)
        elif self._sleep is not None:  # an injected sleep (tests) is honoured as given
            await self._sleep(request.seconds)
        elif isinstance(request, Backoff):
            turns, wake, seconds = self._start_backoff(waiter, request)
            try:
                await wait_event(wake, seconds)
            finally:
                self._room.turns.exit(request.turns_key, turns)
        else:
            await asyncio.sleep(request.seconds)
