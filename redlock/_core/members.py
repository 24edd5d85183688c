"""Cluster membership (docs/design.md §13.1, §13.2), free of I/O: a configuration with its epoch
(stable, or joint during a change: a majority of the old set *and* of the new), and the quorum
:class:`Rule` it sets for one client's nodes (a member the client does not know never answers yes).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from redlock._core.environment import Mutex
from redlock._core.tokens import quorum
from redlock._observe.log import get_logger
from redlock._scripts.record import SEPARATOR, Members, from_fields, stable
from redlock.errors import MembershipError

__all__ = ["Members", "Membership", "Rule", "from_fields", "stable", "validate_change"]

logger = get_logger("redlock.locks")

def validate_change(current: Sequence[str], new: Sequence[str]) -> tuple[str, ...]:
    """The new set of a change, checked: a ValueError for an empty set or a node listed
    twice; MembershipError for a change that changes nothing."""
    new = tuple(new)
    if isinstance(new, str) or not new:
        raise ValueError("the new set of nodes is empty: a cluster needs at least one node")
    seen: set[str] = set()
    for address in new:
        if not isinstance(address, str) or not address or SEPARATOR in address:
            raise ValueError(f"node {address!r} is not a node address (host:port, as the"
                             " clients name it)")
        if address in seen:
            raise ValueError(f"node {address} is listed twice in the new set")
        seen.add(address)
    if set(new) == set(current):
        raise MembershipError(f"the new set is the current one ({', '.join(current)}):"
                              " nothing to change")
    return new


class Rule:
    """One configuration's quorum rule over one client's nodes. Its answers that never
    change (``epoch``, ``joint``, ``possible``, ``met_by_all``) are attributes: an
    attempt reads them without a call."""

    def __init__(self, addresses: Sequence[str], members: Members) -> None:
        self.members = members
        self.epoch = members.epoch
        self.joint = members.joint
        index = {a: i for i, a in enumerate(addresses)}
        # Per set: the client's nodes in it, how many members it has, the majority.
        self.groups = tuple(
            (frozenset(index[a] for a in s if a in index), len(s), quorum(len(s)))
            for s in members.sets)
        #: Whether this client's nodes can satisfy the rule at all.
        self.possible = not self.lost(())
        #: Whether every one of the client's nodes together meets the rule (the usual
        #: grant is by all of them).
        self.met_by_all = self.met(range(len(addresses)))

    def met(self, nodes: Iterable[int]) -> bool:
        """Whether ``nodes`` (indexes of this client's nodes) satisfy the rule."""
        chosen = set(nodes)
        if len(self.groups) == 1:  # (the usual case, on every decision: no generator)
            known, _, need = self.groups[0]
            return len(known & chosen) >= need
        return all(len(known & chosen) >= need for known, _, need in self.groups)

    def lost(self, nodes: Iterable[int]) -> bool:
        """Whether the rule can no longer be met without ``nodes`` (those that said no): in some
        set, they and the members this client does not know are more than the set can spare."""
        out = set(nodes)
        if len(self.groups) == 1:
            known, size, need = self.groups[0]
            return len(known & out) + (size - len(known)) > size - need
        return any(len(known & out) + (size - len(known)) > size - need
                   for known, size, need in self.groups)

    @property
    def needed(self) -> int:
        """The fewest of this client's nodes that can satisfy the rule (for messages):
        the largest majority of its sets (a lower bound when the sets overlap little)."""
        return max(need for _, _, need in self.groups)

    def count(self, nodes: Collection[int], done: str) -> str:
        """``nodes`` against the rule, for messages: '1 of 3 nodes granted, need 2' or,
        joint, per set."""
        chosen = set(nodes)
        if len(self.groups) == 1:
            [(known, size, need)] = self.groups
            return f"{len(known & chosen)} of {size} nodes {done}, need {need}"
        return f"{done} by " + " and ".join(
            f"{len(known & chosen)} of the {which} {size} nodes (need {need})"
            for (known, size, need), which in zip(self.groups, ("old", "new"), strict=True))

    def check(self) -> None:
        """MembershipError when this client's nodes cannot satisfy the rule (asked only
        when :attr:`possible` is false)."""
        if not self.possible:
            raise MembershipError(
                f"this client's nodes cannot form a quorum of the cluster's members"
                f" ({self.members}): configure it with the members' addresses, written as"
                " the record writes them (docs/design.md §13.1)")


class Membership:
    """The membership rule one manager counts by (docs/design.md §13.1): ``rule``, for
    its nodes; replaced, never changed, when a node teaches it a newer configuration,
    so that a decision that read ``rule`` once keeps counting by that one. Shared by the
    parts of the core that count nodes (the acquire, the holding, the amnesia guard)."""

    def __init__(self, addresses: Sequence[str], mutex: Mutex) -> None:
        self.addresses = tuple(addresses)
        # Epoch 0, the nodes given, until a node refuses our epoch with a newer record.
        self.rule = Rule(self.addresses, stable(self.addresses))
        self._mutex = mutex

    def after_fork(self, mutex: Mutex) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def adopt(self, record: Members, *, learnt: bool = True) -> bool:
        """Count under ``record``'s configuration from now on, if its epoch is above ours
        (docs/design.md §13.1: epochs only rise in a client); True if adopted. Logged
        when ``learnt`` from a node (not when this manager made the change itself)."""
        record = Members(record.epoch, record.members, record.joining)
        with self._mutex:
            if record.epoch <= self.rule.epoch:
                return False
            self.rule = Rule(self.addresses, record)
        if learnt:
            logger.info("redlock.members_adopted", epoch=record.epoch,
                        members=list(record.members), joining=list(record.joining or ()),
                        possible=self.rule.possible)
        return True
