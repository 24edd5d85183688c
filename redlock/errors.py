"""Exceptions raised by redlock.

The tree::

    RedlockError                     root: catch this to catch everything below
    ├── LockNotAcquired              no quorum before the deadline (lock held elsewhere)
    │   └── QuorumUnavailable        too few nodes answered healthily for any quorum
    │                                (down, timed out, wrong password, amnesiac)
    ├── LockLost                     a lock we held can no longer be trusted
    │                                (extend failed, watchdog gave up, validity ran out)
    ├── NotHeld                      release/extend/token on a lock that is not held
    └── ClusterAmnesiaError          a majority of nodes lost their data at once;
                                     refusing rather than silently resetting tokens

Bad arguments raise the built-in ``TypeError`` / ``ValueError`` at the call site.

Failures that involve nodes carry ``outcomes``: one :class:`NodeResult` per node,
so "quorum not reached" says which node granted, refused, failed or was amnesiac.
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
    """Root of every error this library raises on purpose."""


class LockNotAcquired(RedlockError):
    """The lock could not be acquired before the deadline."""

    def __init__(
        self, message: str, *, resource: str, outcomes: Sequence[NodeResult] = ()
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.outcomes: tuple[NodeResult, ...] = tuple(outcomes)


class QuorumUnavailable(LockNotAcquired):
    """Fewer than a quorum of nodes could answer at all: an outage, not contention."""


class LockLost(RedlockError):
    """A held lock can no longer be trusted: stop touching the protected resource."""

    def __init__(
        self, message: str, *, resource: str, outcomes: Sequence[NodeResult] = ()
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.outcomes: tuple[NodeResult, ...] = tuple(outcomes)


class NotHeld(RedlockError):
    """The operation needs a held lock and this handle holds none."""


class ClusterAmnesiaError(RedlockError):
    """A majority of nodes lost their data (markers) at once; tokens cannot be trusted."""

    def __init__(self, message: str, *, outcomes: Sequence[NodeResult] = ()) -> None:
        super().__init__(message)
        self.outcomes: tuple[NodeResult, ...] = tuple(outcomes)
