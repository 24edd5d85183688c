"""Hand-off in the release (docs/design.md §6.7): which messages a waiter may count, and
whether they make an acquisition, free of I/O.

A release that frees the lock hands it to the first waiter in the node's line (a
*reservation*, set in the same script) and publishes ``"<waiter id> <counter> <epoch>
<attempt>"``. The wake-up registry (:mod:`redlock._io.wakeups`) collects the messages
naming a waiter, by node; the algorithm asks here what they are worth.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.commit import commit_enough
from redlock._core.environment import Environment
from redlock._core.kinds import Kind, with_epoch
from redlock._core.members import Rule
from redlock._core.requests import Backoff, Broadcast, Deadline, Flow
from redlock._core.settings import Keys, Settings
from redlock._core.state import AttemptResult, LockState
from redlock._core.tokens import (
    TOKEN_LIMIT,
    TokenFloors,
    attempt_owner,
    choose_token,
    validity_left,
)
from redlock._observe.log import get_logger
from redlock._scripts.replies import acked
from redlock.errors import NodeResult, Outcome


class Core(Protocol):
    """What a hand-off needs of the core (:class:`redlock._core.algorithm.RedlockCore`)."""

    rule: Rule
    keys: Keys
    settings: Settings
    floors: TokenFloors
    amnesia: AmnesiaGuard
    addresses: tuple[str, ...]
    n: int
    env: Environment
    clock: Callable[[], float]

    def timeout(self, ttl: float | None = None) -> float: ...

__all__ = ["Handoffs", "Heard", "acquired", "counted", "enough", "may_still", "parse_message",
           "wake_at"]

logger = get_logger("redlock.locks")


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
    """Whether more messages could still make a quorum with ``counters``: only the
    nodes that refused our latest ``attempt`` (and are counted) can add one, and not
    those whose message for it came already without counting (a subscription confirmed
    too late, another epoch): each node hands off once per release. Unknown
    (``heard.attempts`` None): assumed possible."""
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


def acquired(core: Core, heard: Sequence[object], backoff: Backoff,
             resources: tuple[str, ...], call: str, ttl: float, deadline: Deadline,
             kind: Kind, attempt: int, attempt_started: float,
             outcomes: Sequence[NodeResult]) -> Flow[AttemptResult | None]:
    """The lock, if the releases that handed it to us while we waited make an
    acquisition (docs/design.md §6.7): the messages of our latest ``attempt`` from a
    quorum of the nodes we count, the token committed (the ordinary write-back where
    counters differ), validity left from the start of that attempt. None: the next
    attempt goes as usual (it is granted the reservations). ``call``: the acquire call's
    secret."""
    if not isinstance(heard, Handoffs) or not heard:
        return None
    # The reservations become a value no attempt sent, so that a late command of the
    # attempt that queued cannot touch them (§2.1); the next attempt, if this comes to
    # nothing, is the one that sends it.
    owner = attempt_owner(call, attempt + 1)
    refused = {i for i, r in enumerate(outcomes) if r.outcome is Outcome.REFUSED}
    counters = counted(heard, attempt, core.rule.epoch, core.amnesia.health.benched(),
                       refused)
    if counters and not enough(counters, core.rule) and not deadline.passed():
        # Some nodes handed off: the others' messages are on their way (or lost). Each
        # message ends a wait: wait again for the rest, within one request timeout, as
        # long as the nodes yet to be heard could make a quorum.
        until = core.clock() + core.timeout(ttl)
        total, latest = heard.total, heard
        while not enough(counters, core.rule) and not deadline.passed():
            left = until - core.clock()
            if left <= 0 or not may_still(latest, counters, attempt,
                                          core.amnesia.health.benched(), refused,
                                          core.rule):
                break
            more = yield replace(backoff, seconds=deadline.pause(left), patient=None,
                                 heard_before=total,
                                 wake_at=wake_at(latest, counters, attempt, core.rule))
            if not isinstance(more, Handoffs) or more.total <= total:
                break  # nothing new came in time
            total, latest = more.total, more
            counters = counted(more, attempt, core.rule.epoch,
                               core.amnesia.health.benched(), refused)
    if not enough(counters, core.rule):
        return None
    [resource] = resources
    core.floors.raise_to(kind.buckets(resources), max(counters.values()))
    choice = choose_token(counters)
    committed = set(choice.committed)
    rule, epoch = core.rule, core.rule.epoch
    if not rule.met(committed):
        calls = with_epoch((kind.write_back_call(core.keys, i, resource, owner, choice.token)
                            for i in choice.write_back), core.keys, epoch)
        write_backs = [(resource, call) for call in calls]
        acks = yield Broadcast(calls, deadline.bound(core.timeout(ttl)),
                               enough=commit_enough(write_backs, {resource: set(committed)},
                                                    rule))
        rule = core.rule
        committed |= {call.node for call, ack in zip(calls, acks, strict=True)
                      if acked(ack)}
        logger.info("redlock.token_write_back", resource=resource, token=choice.token,
                    returned_token=len(choice.committed),
                    written_back=len(choice.write_back), committed=len(committed))
    validity = validity_left(core.settings, ttl, attempt_started, core.clock())
    if not rule.met(committed) or choice.token >= TOKEN_LIMIT or validity <= 0:
        logger.debug("redlock.handoff_unused", resource=resource, token=choice.token,
                     committed=len(committed), validity_ms=round(validity * 1000, 3))
        return None
    state = LockState(resource, owner, ttl, choice.token,
                      attempt_started + ttl - core.settings.drift(ttl), core.clock,
                      core.env.new_mutex(), tokens={resource: choice.token}, kind=kind)
    logger.debug("redlock.handed_off", resource=resource, token=state.token,
                 heard=len(counters), committed=len(committed))
    logger.debug("redlock.acquired", resource=resource, token=state.token,
                 kind=kind.name, validity_ms=round(validity * 1000, 3),
                 granted=len(counters), nodes=core.n)
    handed = [NodeResult(core.addresses[i], Outcome.GRANTED, "handed off by a release",
                         counter=counters[i]) if i in counters else result
              for i, result in enumerate(outcomes)]
    return AttemptResult(state, tuple(handed))
