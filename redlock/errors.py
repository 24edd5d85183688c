"""Exceptions raised by redlock.

The tree::

    RedlockError                     root: catch this to catch everything below
    ├── LockNotAcquired              no quorum before the deadline (lock held elsewhere)
    │   └── QuorumUnavailable        too few nodes answered healthily for any quorum
    │       │                        (down, timed out, wrong password, amnesiac)
    │       └── NodeFormatError      ...because nodes were initialised by a newer
    │                                release of redlock-fenced: upgrade this client
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
node granted, refused, failed or was amnesiac. They survive pickling."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Outcome(enum.Enum):
    """What one node answered to one request."""

    GRANTED = "granted"
    REFUSED = "refused"  # the key is held by another owner (or ours is gone)
    ERROR = "error"  # connection refused, timeout, auth failure, script error...
    AMNESIAC = "amnesiac"  # the node lost its marker: it may have forgotten locks
    # The node's marker names another format than this client's (a newer release
    # initialised it): this client must not use it (docs/design.md §4.1).
    INCOMPATIBLE = "incompatible"
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what a JSON serializer of exceptions carries)."""
        return {"node": self.node, "outcome": self.outcome.value, "detail": self.detail,
                "counter": self.counter, "pttl_ms": self.pttl_ms}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> NodeResult:
        return cls(str(value["node"]), Outcome(value["outcome"]), str(value.get("detail", "")),
                   value.get("counter"), value.get("pttl_ms"))


def describe(outcomes: Sequence[NodeResult]) -> str:
    return "; ".join(str(result) for result in outcomes)


def _node_result(value: NodeResult | Mapping[str, Any] | Sequence[Any]) -> NodeResult:
    """An outcome as given, or rebuilt from its dict (JSON) or field tuple."""
    if isinstance(value, NodeResult):
        return value
    if isinstance(value, Mapping):
        return NodeResult.from_dict(value)
    node, outcome, *rest = value
    return NodeResult(node, Outcome(outcome), *rest)


class RedlockError(Exception):
    """Root of every error this library raises on purpose.

    ``resource``: the resource involved (None when the error is about the cluster);
    ``outcomes``: one :class:`NodeResult` per node when nodes were asked (else empty).

    Every error here crosses process boundaries whole (pools, task queues): its ``args`` are
    ``(message, resource, outcomes as dicts)``, plain JSON, so both pickle and the JSON serializers
    that rebuild an exception as ``type(*args)`` (Celery's default result serializer) give back
    ``resource`` and ``outcomes``. ``str(error)`` is the message."""

    def __init__(self, message: str = "", resource: str | None = None,
                 outcomes: Sequence[NodeResult | Mapping[str, Any]] = ()) -> None:
        self.message = message
        self.resource = resource
        self.outcomes: tuple[NodeResult, ...] = tuple(_node_result(o) for o in outcomes)
        super().__init__(message, resource, [o.to_dict() for o in self.outcomes])

    def __str__(self) -> str:
        return self.message


class LockNotAcquired(RedlockError):
    """The lock could not be acquired before the deadline."""


class QuorumUnavailable(LockNotAcquired):
    """Fewer than a quorum of nodes could answer at all: an outage, not contention."""


class NodeFormatError(QuorumUnavailable):
    """Too few nodes are left for a quorum because some were initialised by a newer
    format of redlock-fenced than this client reads (their node marker names it,
    docs/design.md §4.1): this client must not use them, and retrying cannot help.
    Upgrade this client (docs/operations.md, "Upgrading: the node format"). Their
    ``outcomes`` are ``Outcome.INCOMPATIBLE``, the detail naming the format found."""


class LockLost(RedlockError):
    """A held lock can no longer be trusted: stop touching the protected resource."""


class NotHeld(RedlockError):
    """The operation needs a held lock and this handle holds none."""


class AlreadyHeld(RedlockError):
    """This owner already holds the lock through this handle (and it is not reentrant)."""


class ClusterAmnesiaError(RedlockError):
    """A majority of nodes lost their data (markers) at once; tokens cannot be trusted."""


class MembershipError(RedlockError):
    """The cluster's membership stops the operation (docs/design.md §13): this client's nodes
    cannot form a quorum of the members, or a membership change cannot proceed (another change in
    progress, too few nodes reachable, a new node that does not answer)."""
