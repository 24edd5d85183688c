"""Redlock distributed locks over N independent Redis nodes, with fencing tokens.

    from redlock import Redlock
    dlm = Redlock(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    with dlm.lock("orders:42", ttl=10.0, timeout=5.0) as held:
        store.write("orders:42", held.token, b"...")   # the resource rejects stale tokens

See :mod:`redlock.errors` for the exception tree and :mod:`redlock.core` for the
algorithm (both clients are thin I/O shells over it).
"""

from redlock.aio import AsyncLock, AsyncRedlock
from redlock.client import Lock, Redlock
from redlock.core import RepairReport
from redlock.errors import (
    ClusterAmnesiaError,
    LockLost,
    LockNotAcquired,
    NodeResult,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    RedlockError,
)

__all__ = [
    "AsyncLock",
    "AsyncRedlock",
    "ClusterAmnesiaError",
    "Lock",
    "LockLost",
    "LockNotAcquired",
    "NodeResult",
    "NotHeld",
    "Outcome",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
    "RepairReport",
]
