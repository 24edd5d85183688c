"""When a token's write-back round is decided (docs/design.md §3.2), free of I/O: shared
by an acquire attempt and a hand-off (§6.7)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redlock._core.members import Rule
from redlock._core.requests import Call, Decision
from redlock._scripts.replies import acked


def commit_enough(write_backs: Sequence[tuple[str, Call]], committed: dict[str, set[int]],
                  rule: Rule) -> Decision:
    """The write-back round is decided once every resource's token is committed on a
    quorum of the rule (the nodes that returned it, plus those that acked so far)."""
    def enough(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
        now = {r: set(nodes) for r, nodes in committed.items()}
        for (resource, call), ack in zip(write_backs, replies, strict=True):
            if acked(ack):
                now[resource].add(call.node)
        return all(rule.met(nodes) for nodes in now.values())
    return enough
