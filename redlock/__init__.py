"""Redlock distributed locks over N independent Redis nodes, with fencing tokens.

    from redlock import Redlock
    dlm = Redlock(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    with dlm.lock("orders:42", ttl=10.0, timeout=5.0) as held:
        store.write("orders:42", held.token, b"...")   # the resource rejects stale tokens

What applications use is here: the managers, their handles (the lock family's too),
the errors, the warnings and :class:`EventFormatter`. The operator's tools (inspect a
lock on every node, force a release, repair, initialise, change the nodes) and their
reports are in :mod:`redlock.admin`; a manager with a test's clock and sleep, real
servers and the pytest plugin in :mod:`redlock.testing`.

See :mod:`redlock.errors` for the exception tree and docs/design.md for the
algorithm (it lives in :mod:`redlock._core.algorithm`; both clients are thin I/O shells
over :mod:`redlock._client.manager` and :mod:`redlock._client.handles`)."""

__version__ = "0.1.0"  # the single source: pyproject.toml reads it, CHANGELOG.md names it

from redlock._core.handover import Handover
from redlock._core.views import Holder, Leader, ReadWriteStatus, SemaphoreStatus
from redlock._observe.log import EventFormatter
from redlock._observe.warn import BlockingInEventLoopWarning, DurationWarning, RedlockWarning
from redlock.aio import (
    AsyncElection,
    AsyncLeadership,
    AsyncLock,
    AsyncMultiLock,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncRedlock,
    AsyncSemaphore,
    AsyncWriteLock,
)
from redlock.client import (
    Election,
    Leadership,
    Lock,
    MultiLock,
    ReadLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
    WriteLock,
)
from redlock.errors import (
    AlreadyHeld,
    ClusterAmnesiaError,
    LockLost,
    LockNotAcquired,
    MembershipError,
    NodeFormatError,
    NodeResult,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    RedlockError,
)

__all__ = ["AlreadyHeld", "AsyncElection", "AsyncLeadership", "AsyncLock", "AsyncMultiLock",
           "AsyncReadLock", "AsyncReadWriteLock", "AsyncRedlock", "AsyncSemaphore",
           "AsyncWriteLock", "BlockingInEventLoopWarning", "ClusterAmnesiaError",
           "DurationWarning", "Election", "EventFormatter", "Handover", "Holder", "Leader",
           "Leadership", "Lock", "LockLost", "LockNotAcquired", "MembershipError", "MultiLock",
           "NodeFormatError", "NodeResult", "NotHeld", "Outcome", "QuorumUnavailable", "ReadLock",
           "ReadWriteLock", "ReadWriteStatus", "Redlock", "RedlockError", "RedlockWarning",
           "Semaphore", "SemaphoreStatus", "WriteLock"]
