"""Operator views and tools (``redlock.admin``): what the nodes hold for a resource, read in one
read-only script per node (a consistent snapshot), and a forced release. The lock value is never
read out: a holder is shown as a SHA1 prefix of its waiter id, enough to tell holders apart."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redlock._core.kinds import counter_field
from redlock._core.requests import Broadcast, Call, Flow
from redlock._observe.log import get_logger
from redlock._scripts import tools
from redlock._scripts.replies import ReleaseStatus, failure_detail, force_released, inspected
from redlock._scripts.script import Script
from redlock.errors import NodeResult, Outcome, QuorumUnavailable

if TYPE_CHECKING:
    from redlock._core.algorithm import RedlockCore

logger = get_logger("redlock.locks")


@dataclass(frozen=True)
class NodeLockStatus:
    """One node's view of a resource.

    ``held``: a lock key exists on the node (someone, maybe us, holds it there); ``pttl_ms``:
    milliseconds left on that key (0 when free, -1 for a key without expiry, which no Redlock
    client writes); ``fence``: the node's fence counter, from which every resource's tokens come (0
    before the first lock); ``marker``: the node marker is present (absent: a new node, or one that
    lost its data); ``format``: the node format its marker names (this client's is
    ``redlock._scripts.node.FORMAT``, 1; a higher one: a newer release initialised the node, and
    this client does not use it, docs/design.md §4.1; None: no marker, or one naming no format);
    ``repairing``: a repair has claimed the node; ``holder``: a fingerprint of the holder's lock
    value (never the value); ``benched``: the node lost its data (or restarted without durable
    persistence) and is kept out of quorums: it rejoins once repaired, ``rejoins_in_s`` from now at
    the earliest (read from its amnesia episode, by its own clock; None while unknown). A node that
    could not be read has ``reachable`` False, ``error`` saying why, and None in the fields it
    could not read."""

    node: str
    reachable: bool
    held: bool | None = None
    pttl_ms: int | None = None
    fence: int | None = None
    marker: bool | None = None
    repairing: bool | None = None
    holder: str | None = None
    format: int | None = None
    benched: bool = False
    rejoins_in_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class LockStatus:
    """Every node's view of one resource (see :class:`NodeLockStatus`)."""

    resource: str
    quorum: int
    nodes: tuple[NodeLockStatus, ...]

    @property
    def locked(self) -> bool | None:
        """True when one holder's key is on a quorum of nodes, False when that is
        impossible whatever the unreachable nodes hold, None when they could decide it."""
        holders = Counter(n.holder for n in self.nodes if n.held and n.holder)
        most = max(holders.values(), default=0)
        if most >= self.quorum:
            return True
        unreachable = sum(1 for n in self.nodes if not n.reachable)
        return False if most + unreachable < self.quorum else None

    @property
    def reachable(self) -> int:
        return sum(1 for n in self.nodes if n.reachable)

    def as_dict(self) -> dict[str, Any]:
        """The stable JSON shape of ``redlock status --json`` (docs/operations.md)."""
        return {
            "resource": self.resource,
            "quorum": self.quorum,
            "locked": self.locked,
            "nodes": [{"node": n.node, "held": n.held, "holder": n.holder,
                       "pttl_ms": n.pttl_ms, "fence": n.fence, "marker": n.marker,
                       "error": n.error} for n in self.nodes],
        }


@dataclass(frozen=True)
class ReleaseReport:
    """What a forced release did on one node (``detail`` says why it failed)."""

    node: str
    status: ReleaseStatus
    detail: str = ""


def _lock_calls(core: RedlockCore, script: Script, keys: tuple[str, ...],
                args: tuple[str, ...] = ()) -> Broadcast:
    return Broadcast(tuple(Call(i, args, script, keys) for i in range(core.n)), core.timeout())


def _node_status(core: RedlockCore, index: int, place: int, reply: object) -> NodeLockStatus:
    """Node ``index``'s view, its health read at ``place`` (the node, or on a cluster node
    the resource's hash slot: docs/design.md §11.4)."""
    address = core.addresses[index]
    health = core.amnesia.health
    benched = place in health.benched()
    rejoins = health.rejoins_in(place, core.clock())
    seen = inspected(reply)
    if seen is not None and seen.episode.split()[:1] and seen.episode.split()[0].isdigit():
        benched = True  # the node's own account of its amnesia episode
        age = (seen.now_ms - int(seen.episode.split()[0])) / 1000.0
        rejoins = max(0.0, core.settings.max_ttl - age)
    if seen is None:
        return NodeLockStatus(address, False, benched=benched, rejoins_in_s=rejoins,
                              error=failure_detail(reply))
    held = seen.pttl_ms != -2
    return NodeLockStatus(address, True, held=held, pttl_ms=seen.pttl_ms if held else 0,
                          fence=seen.fence, marker=seen.marker, repairing=seen.repairing,
                          holder=seen.holder if held else None, format=seen.format,
                          benched=benched, rejoins_in_s=rejoins)


def inspect_lock(core: RedlockCore, resource: str) -> Flow[LockStatus]:
    """Every node's view of ``resource`` in one parallel round of read-only scripts."""
    calls = []
    for i in range(core.n):
        keys = core.layout.of(i, resource)  # (a cluster node's: of the resource's hash slot)
        calls.append(Call(i, (counter_field(keys, resource),), tools.INSPECT,
                          (keys.lock(resource), keys.counter, keys.marker, keys.repair_guard,
                           keys.episode)))
    replies = yield Broadcast(tuple(calls), core.timeout())
    places = core.layout.places((resource,))
    return LockStatus(resource, core.quorum, tuple(
        _node_status(core, i, places[i], reply) for i, reply in enumerate(replies)))


def is_locked(core: RedlockCore, resource: str) -> Flow[bool]:
    """Whether anyone holds ``resource`` on a quorum; raises :class:`QuorumUnavailable`
    when the nodes that did not answer could decide it."""
    status = yield from inspect_lock(core, resource)
    locked = status.locked
    if locked is None:
        outcomes = tuple(NodeResult(n.node, Outcome.ERROR, n.error or "") for n in status.nodes
                         if not n.reachable)
        raise QuorumUnavailable(
            f"cannot tell whether {resource!r} is locked: {len(outcomes)} of {core.n} nodes"
            f" did not answer", resource=resource, outcomes=outcomes)
    return locked


def force_release(core: RedlockCore, resource: str) -> Flow[list[ReleaseReport]]:
    """Delete ``resource``'s lock key on every node, whoever holds it."""
    keys = (core.keys.lock(resource), core.keys.channel(resource), core.keys.line(resource),
            core.keys.line_deadlines(resource))
    replies = yield _lock_calls(core, tools.FORCE_RELEASE, keys)
    reports = [ReleaseReport(core.addresses[i], *force_released(reply))
               for i, reply in enumerate(replies)]
    # An operator evicted a holder that may still be working: worth a warning always.
    logger.warning("redlock.force_released", resource=resource,
                   deleted=sum(1 for r in reports if r.status is ReleaseStatus.DELETED),
                   failed=[f"{r.node} ({r.detail})" for r in reports
                           if r.status is ReleaseStatus.FAILED],
                   nodes=core.n)
    return reports
