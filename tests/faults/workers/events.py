"""What the fault tests' worker processes share: each step is one JSON line on stdout
(read by tests/faults/processes.py), with time.monotonic() times (CLOCK_MONOTONIC: one
clock for every process on the machine)."""

from __future__ import annotations

import json
import time
from typing import Any

from fencing import RedisFencedStore, StaleTokenError
from redlock import LockNotAcquired, NotHeld, RedlockError


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def acquire_announced(handle: Any, timeout: float | None = 1.0,
                      **fields: object) -> dict[str, Any] | None:
    """Acquire ``handle`` (with ``timeout``, or the handle's own if None) and announce
    ``holding`` with its token and validity deadline (or ``failed``); the announcement
    (its ``token``...), or None. ``fields`` go into it; a callable one is called right
    after the acquire (a permit's slot name is only known then, and a frozen holder's
    handle may no longer say it later)."""
    invoked = time.monotonic()
    try:
        got = handle.acquire() if timeout is None else handle.acquire(timeout=timeout)
    except LockNotAcquired:
        got = False
    completed = time.monotonic()
    if not got:
        emit(event="failed", invoked=invoked, completed=completed)
        return None
    held = {key: value() if callable(value) else value for key, value in fields.items()}
    held.update(event="holding", token=handle.token, invoked=invoked, completed=completed,
                valid_until=completed + handle.validity)
    emit(**held)
    return held


def write(store: RedisFencedStore, client: str, resource: str, token: int) -> str:
    """A write through the fenced store, announced with its outcome."""
    invoked = time.monotonic()
    try:
        store.write(resource, token, f"{client}:{token}".encode())
        outcome = "accepted"
    except StaleTokenError:
        outcome = "rejected"
    emit(event="write", resource=resource, token=token, invoked=invoked,
         completed=time.monotonic(), outcome=outcome)
    return outcome


def release_announced(handle: Any, token: int, at: float | None = None,
                      problem: str | None = None) -> None:
    """Release ``handle`` and announce ``released`` (``at``: when the hold ended, by
    default now), with why the release failed if it did (e.g. it expired while the
    process was frozen)."""
    at = time.monotonic() if at is None else at
    try:
        handle.release()
    except (NotHeld, RedlockError) as exc:
        problem = problem or f"{type(exc).__name__}: {exc}"
    emit(event="released", token=token, at=at, problem=problem)
