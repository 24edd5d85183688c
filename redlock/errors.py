"""Exceptions raised by redlock.

The tree::

    RedlockError                     root: catch this to catch everything below
    ├── LockNotAcquired              no quorum before the deadline (lock held elsewhere)
    │   └── QuorumUnavailable        too few nodes answered healthily for any quorum
    │                                (down, timed out, wrong password, amnesiac)
    ├── LockLost                     a lock we held can no longer be trusted
    │                                (extend failed, watchdog gave up, validity ran out)
    ├── NotHeld                      release/extend/token on a lock that is not held
    ├── AlreadyHeld                  acquire again through the same handle while holding
    │                                (not reentrant)
    └── ClusterAmnesiaError          a majority of nodes lost their data at once;
                                     refusing rather than silently resetting tokens

Bad arguments raise the built-in ``TypeError`` / ``ValueError`` at the call site.

Every error carries ``resource`` (None for cluster-wide ones) and ``outcomes``: one
:class:`NodeResult` per node when nodes were asked, so "quorum not reached" says which
node granted, refused, failed or was amnesiac. They survive pickling.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class Outcome(enum.Enum):
    """What one node answered to one request."""

    GRANTED = "granted"
    REFUSED = "refused"  # the key is held by another owner (or ours is gone)
    ERROR = "error"  # connection refused, timeout, auth failure, script error...
    AMNESIAC = "amnesiac"  # the node lost its marker: it may have forgotten locks
    NOT_AWAITED = "not awaited"  # decided without this node's reply (read in the background)


@dataclass(frozen=True)
class NodeResult:
    """One node's answer: who (``node``), what (``outcome``) and why (``detail``)."""

    node: str
    outcome: Outcome
    detail: str = ""
    counter: int | None = None  # the fence counter a granting node returned
    pttl_ms: int | None = None  # time left on another owner's key, for REFUSED

    def __str__(self) -> str:
        text = f"{self.node} {self.outcome.value}"
        return f"{text} ({self.detail})" if self.detail else text


def describe(outcomes: Sequence[NodeResult]) -> str:
    return "; ".join(str(result) for result in outcomes)


class RedlockError(Exception):
    """Root of every error this library raises on purpose.

    ``resource``: the resource involved (None when the error is about the cluster);
    ``outcomes``: one :class:`NodeResult` per node when nodes were asked (else empty).
    Every error here pickles (they cross process boundaries in pools and task queues).
    """

    def __init__(self, message: str = "", *, resource: str | None = None,
                 outcomes: Sequence[NodeResult] = ()) -> None:
        super().__init__(message)
        self.resource = resource
        self.outcomes: tuple[NodeResult, ...] = tuple(outcomes)

    # Pickling uses the default (class, args, __dict__): __init__ accepts the message
    # alone, and resource/outcomes come back with __dict__.


class LockNotAcquired(RedlockError):
    """The lock could not be acquired before the deadline."""


class QuorumUnavailable(LockNotAcquired):
    """Fewer than a quorum of nodes could answer at all: an outage, not contention."""


class LockLost(RedlockError):
    """A held lock can no longer be trusted: stop touching the protected resource."""


class NotHeld(RedlockError):
    """The operation needs a held lock and this handle holds none."""


class AlreadyHeld(RedlockError):
    """This owner already holds the lock through this handle (and it is not reentrant)."""


class ClusterAmnesiaError(RedlockError):
    """A majority of nodes lost their data (markers) at once; tokens cannot be trusted."""
