"""Hand-off in the release (docs/design.md §6.7): which messages a waiter may count, free of
I/O; whether they make an acquisition is the acquire's to decide. The wake-up registry
(:mod:`redlock._io.wakeups`) collects the messages naming a waiter, by node."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from redlock._core.members import Rule

__all__ = ["Handoffs", "Heard", "counted", "enough", "may_still", "parse_message", "wake_at"]


@dataclass(frozen=True)
class Heard:
    """A hand-off message from ``node``: the counter the release raised for our
    reservation, the node's membership epoch, and the number of our attempt whose
    refusal there recorded the hand-off (the latest that ran there before it).
    ``subscribed``: when (``time.monotonic``) the subscription it came by was confirmed
    on its connection (None: not known); a message counts only if that was before the
    attempt went out (:meth:`Handoffs.since`): the same server run answered both, so a
    node that restarted in between (and may have lost data, §4.4) is never counted."""

    node: int
    counter: int
    epoch: int
    attempt: int
    subscribed: float | None = None


class Handoffs(list[Heard]):
    """What a waiter's watch heard so far (one message per node: the latest), the reply
    to its :class:`~redlock._core.requests.Backoff`; ``total``: how many hand-off
    messages it recorded in all (a later wait returns at once if more came since)."""

    def __init__(self, heard: Iterable[Heard] = (), count: int = 0,
                 attempts: Mapping[int, int] | None = None) -> None:
        super().__init__(heard)
        self.total = count
        # Per node, the attempt its latest message named, whether it counts or not
        # (None: not known). A node whose message for the latest attempt came already
        # sends no other for it: a wait for more need not wait for it.
        self.attempts = attempts

    def since(self, sent: float | None) -> Handoffs:
        """Those that came by a subscription confirmed before ``sent`` (when the
        latest attempt went out, ``time.monotonic``; None: none do)."""
        return Handoffs((h for h in self if sent is not None and h.subscribed is not None
                         and h.subscribed < sent), self.total,
                        {h.node: h.attempt for h in self})


def parse_message(data: str) -> tuple[str, tuple[int, int, int] | None]:
    """A release message: the waiter id it names ('' for none) and, for a hand-off,
    (counter, epoch, attempt). Anything else names nobody."""
    parts = data.split(" ")
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 4 and len(parts[0]) == 40 and all(p.isdigit() for p in parts[1:]):
        return parts[0], (int(parts[1]), int(parts[2]), int(parts[3]))
    return "", None


def counted(heard: Iterable[Heard], attempt: int, epoch: int, benched: Collection[int],
            refused: Collection[int]) -> dict[int, int]:
    """Per node, the counter of the hand-off messages that count: of the call's latest
    ``attempt`` (an older one's reservation may have been consumed since), whose reply
    from that node was read and ``refused`` (the server run that answered it was
    identified and judged, §4.4), under the client's ``epoch``, from a node this manager
    counts now (not ``benched``: restarted and not yet judged, or without its marker)."""
    return {h.node: h.counter for h in heard
            if h.attempt == attempt and h.epoch == epoch and h.node not in benched
            and h.node in refused}


def enough(counters: Mapping[int, int], rule: Rule) -> bool:
    """Whether the nodes that handed the lock to us satisfy the quorum rule (§13.2)."""
    return bool(counters) and rule.met(counters)


def may_still(heard: Handoffs, counters: Mapping[int, int], attempt: int,
              benched: Collection[int], refused: Collection[int], rule: Rule) -> bool:
    """Whether more messages could still make a quorum with ``counters``: only the nodes that
    refused our latest ``attempt`` (and are counted) can add one, and not those whose message for
    it came already without counting (a subscription confirmed too late, another epoch): each node
    hands off once per release. Unknown (``heard.attempts`` None): assumed possible."""
    if heard.attempts is None:
        return True
    possible = set(counters) | {i for i in refused if i not in benched
                                and heard.attempts.get(i) != attempt}
    return rule.met(possible)


def wake_at(heard: Handoffs, counters: Mapping[int, int], attempt: int,
            rule: Rule) -> tuple[int, int] | None:
    """When a wait for more hand-offs is worth ending: once as many nodes' messages of
    our latest ``attempt`` came as could make a quorum with those that count (those
    that came without counting stay in the number: their nodes send no other). None:
    at every message (what came is not known by node)."""
    if heard.attempts is None:
        return None
    not_counting = sum(1 for node, a in heard.attempts.items()
                       if a == attempt and node not in counters)
    return attempt, not_counting + max(len(counters) + 1, rule.needed)
