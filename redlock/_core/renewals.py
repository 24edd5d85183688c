"""Auto-extend for every lock of one manager from one loop (docs/design.md §5.1, §5.2): each
acquisition is renewed when a third of the validity it has left has passed, the renewals due
together in one request; a lock whose validity runs out, or whose key a majority lost, is lost and
its handles told. Acquisitions are held strongly, their handles weakly: one whose handles were all
collected without a release is released, not renewed for ever."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from logging import DEBUG
from typing import Any, Protocol

from redlock._core.algorithm import RedlockCore
from redlock._core.requests import Flow, PauseUntilWoken, Wakeable
from redlock._core.state import LockState, Status
from redlock._observe.log import get_logger
from redlock.errors import NodeResult

logger = get_logger("redlock.locks")

# The renewal loop's own connections (redlock._core.requests.Broadcast.lane).
RENEWALS_LANE = "renewals"
# Renewals due within this many seconds of the first one go out with it (early is fine).
_BATCH_WINDOW = 0.01
# While the holder's process is stopped, how often the renewer looks again (§5.2).
_STOPPED_POLL = 0.01


class Renewal:
    """One auto-extended acquisition: when it is due, and who holds it."""

    __slots__ = ("answers", "due", "handles", "retry_delay", "state")

    def __init__(self, state: LockState, due: float) -> None:
        self.state = state
        self.due = due
        self.retry_delay = 0.0  # 0: the last renewal succeeded
        self.answers: tuple[NodeResult, ...] = ()  # the last failed round's, for a loss
        self.handles: weakref.WeakSet[Any] = weakref.WeakSet()


def next_renewal(state: LockState, now: float) -> float:
    """When to renew: after a third of the validity left (never later than half)."""
    return now + max(0.0, state.deadline - now) / 3.0


class Renewing(Protocol):
    """What the handles ask of a manager's renewals, wherever the loop runs: here
    (:class:`Renewals`) or in the renewer (:class:`redlock._client.renewer.Renewer`)."""

    runner: Any  # what close() waits for (a thread or task; None: nothing runs)

    def __len__(self) -> int: ...
    def add(self, state: LockState, handle: Any) -> None: ...
    def remove(self, state: LockState) -> None: ...
    def withdraw(self, state: LockState) -> float | None: ...
    def rescheduled(self, state: LockState) -> None: ...
    def stop(self) -> None: ...


class Renewals:
    """The auto-extended acquisitions of one manager, and the loop that renews them.

    ``start_loop`` runs a flow in the background (the shell's thread or task);
    ``lost`` is told of every acquisition lost while renewed, with its live handles."""

    def __init__(self, core: RedlockCore, new_event: Callable[[], Wakeable],
                 start_loop: Callable[[Flow[None]], Any],
                 lost: Callable[[LockState, list[Any]], None],
                 observe: Callable[[LockState, str, int], None] = lambda *_: None,
                 *, closing: Wakeable | None = None,
                 holder_running: Callable[[], bool] = lambda: True,
                 abandoned: Callable[[LockState], None] = lambda _: None,
                 elsewhere: Callable[[LockState], bool] = lambda _: False,
                 in_process: str | None = None) -> None:
        self._core = core
        self._new_event = new_event
        self._start_loop = start_loop
        self._lost = lost
        self._observe = observe  # (state, "extended" | "failed" | "lost", round start ns)
        self._closing = closing  # set by the manager's close(): the loop stops
        # The renewer's (docs/design.md §5.2): whether the holder's process runs (a
        # stopped one gets no renewal), and who is told of what nobody held any more
        # (released here). The holder's bridge: which acquisitions the renewer renews now.
        self._holder_running = holder_running
        self._abandoned_told = abandoned
        self._elsewhere = elsewhere
        self._stopped_since: float | None = None  # when the holder was seen stopped
        # Why the loop runs in the holder's process, not the renewer (said once).
        self._in_process = in_process
        self._renewals: dict[LockState, Renewal] = {}
        self._mutex = core.env.new_mutex()
        self._wake: Wakeable | None = None  # made by the first loop (an asyncio.Event binds late)
        self._running = False
        self.runner: Any = None  # the loop's thread or task while it runs (close() waits)

    def __len__(self) -> int:
        return len(self._renewals)

    def add(self, state: LockState, handle: Any) -> None:
        """Renew ``state`` for ``handle`` (weakly held) until released or lost."""
        state.auto_extended = True  # (its release or export then calls remove)
        now = self._core.clock()
        with self._mutex:
            renewal = self._renewals.get(state)
            if renewal is None:
                renewal = self._renewals[state] = Renewal(state, next_renewal(state, now))
            renewal.handles.add(handle)
            start = not self._running
            self._running = True
            if self._wake is None:
                self._wake = self._new_event()
            wake = self._wake
        if start:
            if self._in_process is not None:
                logger.warning("redlock.renewals_in_process", reason=self._in_process)
                self._in_process = None
            self.runner = self._start_loop(self._loop(wake))
        else:
            wake.set()  # the new renewal may be due before the loop's next wake-up

    def stop(self) -> None:
        """The manager is closing: wake the loop, which stops (see :meth:`_closed`)."""
        with self._mutex:
            wake = self._wake
        if wake is not None:
            wake.set()

    def remove(self, state: LockState) -> None:
        if state not in self._renewals:  # (only its owner adds it, and that owner is
            return  # the one releasing it)
        with self._mutex:
            self._renewals.pop(state, None)

    def withdraw(self, state: LockState) -> float | None:
        """An explicit extend() of ``state`` begins: the TTL a round of this loop still in
        flight may set after it (None: not renewed here)."""
        with self._mutex:
            return state.ttl if state in self._renewals else None

    def rescheduled(self, state: LockState) -> None:
        """An explicit extend() renewed ``state``: the next renewal moves accordingly."""
        with self._mutex:
            renewal = self._renewals.get(state)
            if renewal is not None:
                renewal.due = next_renewal(state, self._core.clock())

    def _loop(self, wake: Wakeable) -> Flow[None]:
        try:
            while True:
                wake.clear()
                if self._closing is not None and self._closing.is_set():
                    self._closed()
                    return
                now = self._core.clock()
                with self._mutex:
                    if not self._renewals:
                        self._running = False
                        return
                    first = min(r.due for r in self._renewals.values())
                    due = [r for r in self._renewals.values()
                           if r.due <= max(now, first) + _BATCH_WINDOW]
                try:
                    if first > now:
                        yield PauseUntilWoken(first - now, wake)
                        continue
                    if not self._holder_running():  # stopped (SIGSTOP): nothing renewed
                        if self._stopped_since is None:
                            self._stopped_since = now
                        yield PauseUntilWoken(_STOPPED_POLL, wake)
                        continue
                    yield from self._renew(due, now)
                except Exception:
                    # A bug in here: the holders must not go on believing they hold.
                    logger.exception("redlock.renewals_crashed", locks=len(self._renewals))
                    self._crashed()
                    return
        except BaseException:  # the loop died (cancelled, or its event loop is closing)
            with self._mutex:
                self._running = False
            raise

    def _closed(self) -> None:
        """The manager was closed while it renewed locks: nobody renews them any more, so their
        holders must not go on believing they hold them. Each is marked lost (its check(), token,
        extend() and release() raise LockLost); its keys stay on the nodes until their TTL (its
        holder may still be writing: releasing would let the next holder in at once). on_lost is
        not called: the application closed the manager itself."""
        with self._mutex:
            renewals = list(self._renewals.values())
            self._renewals.clear()
            self._running = False
        for renewal in renewals:
            renewal.state.mark_lost("its manager was closed before it was released: nobody"
                                    " renews it any more (its keys expire with their TTL)")

    def _crashed(self) -> None:
        with self._mutex:
            renewals = list(self._renewals.values())
            self._renewals.clear()
            self._running = False
        for renewal in renewals:
            if renewal.state.mark_lost("the auto-extend loop crashed"):
                self._lost(renewal.state, list(renewal.handles))

    def _renew(self, due: list[Renewal], now: float) -> Flow[None]:
        if logger.isEnabledFor(DEBUG):  # how late each renewal goes out (RELIABILITY.md)
            for renewal in due:
                logger.debug("redlock.renewed", resource=renewal.state.resource,
                             late_ms=round(max(0.0, now - renewal.due) * 1000, 3),
                             validity_ms=round(max(0.0, renewal.state.deadline - now) * 1000, 3))
        live, abandoned = [], []
        for renewal in due:
            if renewal.state.status != Status.HELD or self._elsewhere(renewal.state):
                self.remove(renewal.state)
            elif not renewal.handles:  # (out of the loop now: no round waits for it)
                self.remove(renewal.state)
                abandoned.append(renewal)
            else:
                live.append(renewal)
        if live:
            yield from self._extend(live)
        if abandoned:  # after the round: their release must not hold up the renewals
            yield from self._abandoned(abandoned)

    def _extend(self, live: list[Renewal]) -> Flow[None]:
        """One extend round for the renewals due; those it lost are lost together."""
        started_ns = int(self._core.env.wall_clock() * 1e9)
        batch = set(live)
        with self._mutex:  # the round ends by half the validity left of every other lock
            others = [r.state.deadline for r in self._renewals.values() if r not in batch]
        failures = yield from self._core.holding.extend_many(
            [(r.state, r.state.ttl) for r in live], lane=RENEWALS_LANE,
            until=min(others, default=None))
        now = self._core.clock()
        losing = []
        for renewal, failure in zip(live, failures, strict=True):
            if failure is None:
                renewal.retry_delay = 0.0
                renewal.due = next_renewal(renewal.state, now)
                self._observe(renewal.state, "extended", started_ns)
            elif self._failed(renewal, failure, now):
                losing.append(renewal)
            else:
                self._observe(renewal.state, "failed", started_ns)
        stopped, self._stopped_since = self._stopped_since, None
        if not losing:
            return
        core = self._core  # (one request for all: see Holding.lose_many)
        firsts = yield from core.holding.lose_many([
            (r.state, self._loss_reason(r, stopped), r.answers) for r in losing])
        for renewal, first in zip(losing, firsts, strict=True):
            self._observe(renewal.state, "lost", started_ns)  # (first: the renewer's
            if first:                                          # holder forgets it when told)
                self._lost(renewal.state, list(renewal.handles))

    def _loss_reason(self, renewal: Renewal, stopped: float | None) -> str:
        if stopped is not None and not renewal.answers and stopped < renewal.state.deadline:
            return ("its process was stopped (SIGSTOP, a debugger) until its validity ran"
                    " out: a stopped holder is not renewed")
        return self._core.holding.loss_reason(renewal.answers)

    def _failed(self, renewal: Renewal, failure: tuple[NodeResult, ...], now: float) -> bool:
        """Retry later (False), or the lock is to be lost (True; removed already)."""
        state = renewal.state
        # Released (or lost) meanwhile, or its release under way: a round in flight then
        # finds the keys the release deleted, which is no loss.
        if state.status != Status.HELD or state.release_called:
            self.remove(state)
            return False
        core = self._core
        left = state.deadline - now
        failure = renewal.answers = failure or renewal.answers  # (): no round was sent
        if core.holding.key_gone(failure) or left <= 0:
            self.remove(state)
            return True
        settings = core.settings
        renewal.retry_delay = (settings.retry_delay_min if not renewal.retry_delay
                               else min(renewal.retry_delay * 2, settings.retry_delay_max))
        renewal.due = now + min(renewal.retry_delay, left)
        # redlock.extend_retry, once per failing node and outage (then counted).
        core.node_outages.renewal_failed(logger, state.resource, round(left, 3), failure)
        return False

    def _abandoned(self, renewals: list[Renewal]) -> Flow[None]:
        """Every handle holding these acquisitions is gone: release them (in one
        request) instead of renewing."""
        for renewal in renewals:
            logger.warning("redlock.abandoned", resource=renewal.state.resource,
                           token=renewal.state.token,
                           reason="auto-extended lock's handle was garbage-collected unreleased")
        yield from self._core.holding.release_many([renewal.state for renewal in renewals])
        for renewal in renewals:
            self._abandoned_told(renewal.state)
