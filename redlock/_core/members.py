"""Cluster membership (docs/design.md §13): a configuration with its epoch, and the
quorum rule it sets, free of I/O.

A configuration is *stable* (one set C of node addresses) or *joint* (the old set O and
the new set N, during a change). A set of nodes satisfies a stable configuration when
it holds a majority of C, a joint one when it holds a majority of O *and* a majority of
N. Epoch 0 is the configuration of a cluster that never changed: the nodes the client
was given.

:class:`Rule` applies a configuration to one client's nodes (its indexes 0..n-1, named
by ``addresses``): a client counts only the members it knows, and a member it does not
know never answers yes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from redlock._core.tokens import quorum
from redlock.errors import MembershipError

#: Separates addresses in a record's fields (addresses never contain a line break).
SEPARATOR = "\n"


@dataclass(frozen=True)
class Members:
    """A configuration: ``members`` (stable), or ``members`` (the old set) and
    ``joining`` (the new set) during a change; ``retired``: the node that stored it was
    removed by a change."""

    epoch: int
    members: tuple[str, ...]
    joining: tuple[str, ...] | None = None
    retired: bool = False

    @property
    def joint(self) -> bool:
        return self.joining is not None

    @property
    def sets(self) -> tuple[tuple[str, ...], ...]:
        """The sets of which a majority is needed."""
        return (self.members,) if self.joining is None else (self.members, self.joining)

    @property
    def target(self) -> tuple[str, ...]:
        """The members once the change (if any) is complete."""
        return self.members if self.joining is None else self.joining

    def fields(self) -> tuple[str, str, str, str]:
        """The record's fields as the scripts store them: epoch, members, joining,
        retired ('' for none)."""
        return (str(self.epoch), SEPARATOR.join(self.members),
                "" if self.joining is None else SEPARATOR.join(self.joining),
                "1" if self.retired else "")

    def same_configuration(self, other: Members) -> bool:
        return (self.epoch, self.members, self.joining) == (
            other.epoch, other.members, other.joining)

    def __str__(self) -> str:
        shown = ", ".join(self.members)
        if self.joining is not None:
            shown = f"joint: old [{shown}] and new [{', '.join(self.joining)}]"
        else:
            shown = f"[{shown}]"
        return f"epoch {self.epoch} {shown}" + (" (this node retired)" if self.retired else "")


def stable(addresses: Sequence[str], epoch: int = 0) -> Members:
    return Members(epoch, tuple(addresses))


def from_fields(epoch: object, members: object, joining: object,
                retired: object) -> Members | None:
    """A record from its stored fields (bytes or text; None or '' where absent), or
    None if there is none or it is not one of ours."""
    def text(value: object) -> str:
        if value is None or value is False:
            return ""
        return value.decode() if isinstance(value, bytes) else str(value)

    try:
        number = int(text(epoch) or "0")
    except ValueError:
        return None
    listed = tuple(a for a in text(members).split(SEPARATOR) if a)
    if number <= 0 or not listed:
        return None
    new = tuple(a for a in text(joining).split(SEPARATOR) if a)
    return Members(number, listed, new or None, text(retired) == "1")


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
    """One configuration's quorum rule over one client's nodes."""

    def __init__(self, addresses: Sequence[str], members: Members) -> None:
        self.members = members
        index = {a: i for i, a in enumerate(addresses)}
        # Per set: the client's nodes in it, how many members it has, the majority.
        self.groups = tuple(
            (frozenset(index[a] for a in s if a in index), len(s), quorum(len(s)))
            for s in members.sets)

    @property
    def epoch(self) -> int:
        return self.members.epoch

    def met(self, nodes: Iterable[int]) -> bool:
        """Whether ``nodes`` (indexes of this client's nodes) satisfy the rule."""
        chosen = set(nodes)
        return all(len(known & chosen) >= need for known, _, need in self.groups)

    def lost(self, nodes: Iterable[int]) -> bool:
        """Whether the rule can no longer be met without ``nodes`` (those that said no):
        in some set, they and the members this client does not know are more than the
        set can spare."""
        out = set(nodes)
        return any(len(known & out) + (size - len(known)) > size - need
                   for known, size, need in self.groups)

    @property
    def possible(self) -> bool:
        """Whether this client's nodes can satisfy the rule at all."""
        return not self.lost(())

    @property
    def needed(self) -> int:
        """The fewest of this client's nodes that can satisfy the rule (for messages):
        the largest majority of its sets (a lower bound when the sets overlap little)."""
        return max(need for _, _, need in self.groups)

    def count(self, nodes: Collection[int]) -> str:
        """``nodes`` against the rule, for messages: '2 of 3' or, joint, per set."""
        chosen = set(nodes)
        if len(self.groups) == 1:
            [(known, size, need)] = self.groups
            return f"{len(known & chosen)} of {size} (need {need})"
        return " and ".join(f"{len(known & chosen)} of the {which} {size} (need {need})"
                            for (known, size, need), which in zip(self.groups, ("old", "new"),
                                                                   strict=True))

    def check(self) -> None:
        """MembershipError when this client's nodes cannot satisfy the rule."""
        if not self.possible:
            raise MembershipError(
                f"this client's nodes cannot form a quorum of the cluster's members"
                f" ({self.members}): configure it with the members' addresses, written as"
                " the record writes them (docs/design.md §13.1)")
