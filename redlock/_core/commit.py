"""When an acquire's rounds are decided, free of I/O: its attempt (early quorum,
docs/design.md §2.4) and a token's write-back (§3.2, shared with a hand-off, §6.7)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from redlock._core.members import Rule
from redlock._core.requests import Call, Decision
from redlock._scripts.replies import acked, foreign, restarted


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


# The usual attempt's decision (no suspect node, one group of grants), per node count,
# rule and kind of vote: made once, not on every attempt. A few rules are ever in use
# (a new one per membership epoch); should many be, the oldest are dropped together.
_USUAL: dict[tuple[int, Rule, Callable[[object], int | None]], Decision] = {}
_USUAL_KEPT = 32


def grant_enough(n: int, suspect: Mapping[int, object], rule: Rule,
                 votes: Callable[[object], int | None],
                 group: Callable[[object], object] | None = None) -> Decision:
    """An early decision on an attempt's replies (one call per node): ``votes(reply)`` is
    1 (yes), 0 (no), None (unknown: an error, or not read yet). Decided once a quorum said
    yes, or more nodes said no than a quorum can spare. A node whose grants do not count
    (``suspect``: restarted, being judged, or of another format, §4.1; or found so by this
    very request's new connection, docs/design.md §4.4) never votes yes. The yes votes count per
    ``group`` of their reply (a permit's slot, §12.2; one group for other kinds): a quorum
    must grant the same one (None: every grant is of the same group). Quorums are the
    membership ``rule``'s (§13.2). Asked after every reply read: kept lean."""
    if suspect or group is not None:
        return _grant_enough(n, suspect, rule, votes, group)
    key = (n, rule, votes)
    decision = _USUAL.get(key)
    if decision is None:
        if len(_USUAL) >= _USUAL_KEPT:
            _USUAL.clear()
        decision = _USUAL[key] = _grant_enough(n, suspect, rule, votes)
    return decision


def _grant_enough(n: int, suspect: Mapping[int, object], rule: Rule,
                  votes: Callable[[object], int | None],
                  group: Callable[[object], object] | None = None) -> Decision:
    benched = set(suspect)

    def enough(replies: Sequence[object], identities: Mapping[int, object]) -> bool:
        yes: dict[object, list[int]] = {}
        no: list[int] = []
        for node in range(n):  # (the first n calls: one per node; INFO may follow)
            reply = replies[node]
            vote = votes(reply)
            if vote == 1:
                if node in benched or (identities and node in identities
                                       and (restarted(identities[node])
                                            or foreign(identities[node]))):
                    continue
                yes.setdefault(None if group is None else group(reply), []).append(node)
            elif vote == 0:
                no.append(node)
        return any(rule.met(nodes) for nodes in yes.values()) or rule.lost(no)
    return enough
