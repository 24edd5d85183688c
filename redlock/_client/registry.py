"""What every handle of one manager shares, and all a handle needs of it (docs/design.md §10):
handles know the registry, never the manager, and are told of a loss through what they offer
(:class:`LossListener`)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from redlock._client.telemetry import Telemetry
from redlock._core.algorithm import RedlockCore
from redlock._core.renewals import Renewing
from redlock._core.requests import Flow
from redlock._core.state import LockState, Status


class LossListener(Protocol):
    """A handle as the registry sees it when an acquisition it renewed is lost."""

    on_lost: Callable[[Any], object] | None

    def _lost_flow(self, state: LockState) -> Flow[None]: ...


class Registry:
    """Shared by a manager's handles. ``drive`` runs a flow the way the manager's flavour does
    (returns its result, or, asyncio, an awaitable of it); ``current_owner()`` is the calling
    thread or task (None: no task, asyncio); ``released`` is told of every release (the local
    turns' wake); ``renewals`` and the reentrancy map live in one process (a forked child gets new
    ones: :meth:`start_process`)."""

    def __init__(self, core: RedlockCore, telemetry: Telemetry | None,
                 current_owner: Callable[[], Hashable | None], drive: Callable[..., Any],
                 spawn: Callable[[Flow[None], str], object]) -> None:
        self.core = core
        self.telemetry = telemetry
        self.current_owner = current_owner
        self.drive = drive
        self._spawn = spawn

    def start_process(self, renewals: Renewing, released: Callable[[LockState], None],
                      watch_every: Callable[[tuple[str, ...], Any], Callable[[], None]],
                      new_event: Callable[[], Any], closing: Any) -> None:
        """What lives in one process only (called again in a forked child). ``watch_every(channels,
        event)`` sets ``event`` on every message published on ``channels`` until the function it
        returns is called (an election's observer); ``new_event`` makes the flavour's event;
        ``closing`` is the manager's, set by ``close()``."""
        self.renewals = renewals
        self.closing = closing
        self.released = released
        self.watch_every = watch_every
        self.new_event = new_event
        # Per owner (a thread or task, held weakly: a finished one takes its entries
        # along), the acquisitions it may re-enter, by resource.
        self._reentrant: weakref.WeakKeyDictionary[Any, dict[str, LockState]] = (
            weakref.WeakKeyDictionary())
        self._mutex = threading.Lock()

    # -- reentrancy: per (resource, owner) across the manager's handles ---------

    def reentered(self, resource: str, owner: Hashable) -> LockState | None:
        """The acquisition of ``resource`` this owner may re-enter, if any."""
        with self._mutex:
            held = self._reentrant.get(owner, {})
            state = held.get(resource)
            if state is not None and state.status != Status.HELD:
                del held[resource]
                return None
            return state

    def register_reentrant(self, state: LockState, owner: Hashable) -> None:
        with self._mutex:
            self._reentrant.setdefault(owner, {})[state.resource] = state

    def forget_reentrant(self, state: LockState, owner: Hashable | None) -> None:
        if owner is None:
            return
        with self._mutex:
            held = self._reentrant.get(owner)
            if held is not None and held.get(state.resource) is state:
                del held[state.resource]

    # -- losses ------------------------------------------------------------------

    def lost(self, state: LockState, handles: list[LossListener]) -> None:
        """The renewals lost ``state``: tell each handle, each in a thread or task of its
        own (a slow callback must not hold up the renewal of other locks)."""
        for handle in handles:
            if handle.on_lost is not None:
                self._spawn(handle._lost_flow(state), f"redlock-on-lost:{state.resource}")
