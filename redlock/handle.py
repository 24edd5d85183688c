"""State handling shared by the sync :class:`~redlock.Lock` and :class:`~redlock.AsyncLock`.

A handle may be shared by threads (sync) or tasks (asyncio): each owner (thread or
task) that acquires through it gets its own acquisition, with its own secret owner
value and token; ``token``, ``validity``, ``release()`` act on the caller's own.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from redlock.core import (
    AcquireResult,
    LockState,
    RedlockCore,
    Status,
    validate_resource,
    validate_timeout,
)
from redlock.errors import LockNotAcquired, NotHeld, QuorumUnavailable, RedlockError, describe


class LockHandleBase:
    """Validation, per-owner state and failure reporting; no I/O."""

    def __init__(self, core: RedlockCore, resource: str, ttl: float, *, blocking: bool,
                 timeout: float | None, auto_extend: bool, reentrant: bool) -> None:
        self._core = core
        self.resource = validate_resource(resource)
        self.ttl = core.check_ttl(ttl)
        self.blocking = bool(blocking)
        self.timeout = validate_timeout(timeout)
        self.auto_extend = bool(auto_extend)
        self.reentrant = bool(reentrant)
        self.last_failure: LockNotAcquired | None = None
        self._states: dict[Hashable, LockState] = {}
        self._mutex = threading.Lock()

    def _owner_key(self) -> Hashable:
        raise NotImplementedError

    # -- acquire / release bookkeeping ----------------------------------------

    def _prepare_acquire(self, owner: Hashable) -> LockState | None:
        """A re-entered state (no I/O needed), or None to acquire for real."""
        if self.reentrant:
            state = self._core.reenter(self.resource, owner)
            if state is not None:
                with self._mutex:
                    self._states[owner] = state
                return state
        with self._mutex:
            state = self._states.get(owner)
        if state is not None and state.status == Status.HELD:
            raise RedlockError(
                f"this owner already holds {self.resource!r} through this handle: release it"
                " first, or create the lock with reentrant=True to nest")
        return None

    def _options(self, blocking: bool | None, timeout: float | None) -> tuple[bool, float | None]:
        return (self.blocking if blocking is None else bool(blocking),
                self.timeout if timeout is None else validate_timeout(timeout))

    def _finish_acquire(self, result: AcquireResult, owner: Hashable) -> LockState | None:
        """Record a success, or build (and for outages raise) the failure."""
        if result.state is None:
            failure_type = QuorumUnavailable if result.unavailable else LockNotAcquired
            self.last_failure = failure_type(
                f"could not acquire {self.resource!r} after {result.attempts} attempt(s):"
                f" {result.reason}; {describe(result.outcomes)}",
                resource=self.resource, outcomes=result.outcomes)
            if result.unavailable:
                raise self.last_failure
            return None
        with self._mutex:
            self._states[owner] = result.state
        if self.reentrant:
            self._core.register_reentrant(result.state, owner)
        return result.state

    def _prepare_release(self, owner: Hashable) -> LockState | None:
        """The state to release on the nodes, or None (nested re-entry, or already done)."""
        with self._mutex:
            state = self._states.get(owner)
        if state is None:
            raise NotHeld(f"{self.resource!r} is not held by this owner through this handle")
        with state.mutex:
            if state.depth > 1:
                state.depth -= 1
                return None
        return state if state.status == Status.HELD else None

    def _entered_failure(self) -> LockNotAcquired:
        return self.last_failure or LockNotAcquired(
            f"could not acquire {self.resource!r}", resource=self.resource)

    # -- state of the caller's own acquisition --------------------------------

    def _held(self) -> LockState:
        with self._mutex:
            state = self._states.get(self._owner_key())
        if state is None:
            raise NotHeld(f"{self.resource!r} is not held by this owner through this handle")
        return state

    def _current(self) -> LockState | None:
        with self._mutex:
            return self._states.get(self._owner_key())

    @property
    def token(self) -> int:
        """The fencing token; raises :class:`LockLost` once the lock is lost or expired."""
        state = self._held()
        state.check()
        return state.token

    @property
    def validity(self) -> float:
        """Seconds of validity left on a monotonic clock; 0 when not held."""
        state = self._current()
        return 0.0 if state is None else state.validity()

    @property
    def lost(self) -> bool:
        """True once the lock was lost (extend or the watchdog failed)."""
        state = self._current()
        return state is not None and state.status == Status.LOST

    def locked(self) -> bool:
        """True while the caller holds the lock and its validity has not run out."""
        return self.validity > 0

    def check(self) -> None:
        """Raise :class:`LockLost` if the lock was lost or its validity ran out."""
        self._held().check()

    def __repr__(self) -> str:
        state = self._current()
        status = "unlocked" if state is None else state.status
        return f"<{type(self).__name__} {self.resource!r} ttl={self.ttl:g}s {status}>"
