"""The quick lane: an uncontended acquire of one lock, and its release, without the
flow machinery (docs/design.md §2.6).

Every operation is a flow (:mod:`redlock._core.requests`) that an executor drives; on
the most common call, one lock taken by nobody else, that machinery cost more than the
nodes did. Here an acquire call's first attempt is opened as plain data
(:class:`Opening`, made by :meth:`RedlockCore.open_acquire`, the same start the flow
makes), the shells send its request through their transport themselves, and
:meth:`QuickLane.clean_grant` recognises the one outcome that needs no decision: every node
granted, a quorum returned the same counter, time is left. Anything else (a refusal, an
error, a node that did not answer in time, a new connection met on the way, counters
to write back) goes to the generic flow with the request and what it came to
(:class:`Sent`), and the flow carries on as if its own first attempt had sent it. So
the quick lane decides nothing the flow would decide otherwise.

A release goes the same way: its request is the flow's own (:meth:`Holding.release_many`
takes ``sent``), and what its replies mean is decided in one place
(:meth:`Holding.released`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.kinds import Kind
from redlock._core.members import Rule
from redlock._core.requests import Broadcast, Deadline, Replies
from redlock._core.settings import Settings
from redlock._core.state import LockState, RoundTrips
from redlock._core.tokens import TOKEN_LIMIT, TokenFloors, validity_left
from redlock._scripts import lock as scripts

__all__ = ["Opening", "QuickLane", "Releasing", "Sent"]


@dataclass(slots=True)
class Sent:
    """An acquire attempt's request (or a release's): when the attempt started (its
    validity is measured from there), under which membership epoch, and, once the quick
    lane sent it outside the flow, what it came to: its replies, or the exception that
    interrupted it (the flow then cleans up as if it had been interrupted itself)."""

    request: Broadcast
    # An attempt's (a release has none): when it started, the membership epoch it was
    # made under (§13.2), the counters it asks for (§3.0).
    started: float = 0.0
    epoch: int = 0
    buckets: tuple[str, ...] = ()
    outcome: Replies | BaseException | None = None
    # When the quick lane sent it, by time.monotonic (the local lines' clock): the flow's
    # waits count releases and hand-offs from there (§6.4, §6.7).
    at: float | None = None


@dataclass(slots=True)
class Opening:
    """An acquire call's start (:meth:`RedlockCore.open_acquire`): its secret (``owner``,
    32 hex digits; each attempt's owner value starts with it, docs/design.md §2.1),
    what it acquires, its place in the nodes' line (``ticket``, '' when it does not
    queue), when it started and its deadline; ``sent``: its first attempt, when the
    quick lane sent it."""

    resources: tuple[str, ...]
    owner: str
    kind: Kind
    ticket: str
    started: float
    single: bool
    deadline: Deadline
    sent: Sent | None = None

    @property
    def queued(self) -> bool:
        """Whether the call waits in the nodes' line (it has a ticket)."""
        return bool(self.ticket)


@dataclass(slots=True)
class Releasing:
    """A caller's release under way (a handle began it): the acquisition it releases
    (None: nothing to send), whether its validity had run out before, and the request
    when the quick lane sends it."""

    state: LockState | None
    expired: bool = False
    sent: Sent | None = None


class QuickLane:
    """The quick lane's half of :class:`redlock._core.algorithm.RedlockCore` (a mixin,
    as :class:`~redlock._core.holding.Holding` is): it uses the core's own start,
    request and acquisition, so that what an attempt is stays in one place."""

    # Set by RedlockCore.__init__.
    amnesia: AmnesiaGuard
    settings: Settings
    round_trips: RoundTrips
    floors: TokenFloors
    quorum: int
    n: int
    rule: Rule
    clock: Callable[[], float]

    if TYPE_CHECKING:
        def open_acquire(self, resources: tuple[str, ...], ttl: float, *, blocking: bool,
                         timeout: float | None, kind: Kind = ...) -> Opening: ...

        def attempt_request(self, opening: Opening, ttl: float, kind: Kind,
                            attempt: int) -> Sent: ...

        def held(self, opening: Opening, ttl: float, started: float,
                 tokens: dict[str, int], kind: Kind, granted: int,
                 attempt: int) -> LockState: ...

    def open_quickly(self, resource: str, ttl: float, *, blocking: bool,
                     timeout: float | None, kind: Kind) -> Opening | None:
        """An acquire call of ``resource`` opened with its first attempt's request in
        ``sent`` (not sent yet), or None when this call should take the flow at once:
        the manager has not seen its nodes' configuration, round trips or markers yet,
        or a node is suspected of a restart (the flow asks and judges those), or is of
        another format (docs/design.md §4.1: the flow does not count it)."""
        health = self.amnesia.health
        if (health.suspect or health.incompatible or not health.inspected
                or not health.marker_seen):
            return None
        if self.settings.node_timeout is None and self.round_trips.measured() < self.quorum:
            return None
        opening = self.open_acquire((resource,), ttl, blocking=blocking, timeout=timeout,
                                    kind=kind)
        opening.sent = self.attempt_request(opening, ttl, opening.kind, attempt=1)
        return opening

    def clean_grant(self, opening: Opening, ttl: float) -> LockState | None:
        """The acquisition, when the first attempt's replies (``opening.sent.outcome``,
        absorbed by the core) need no decision: every node granted a plain grant, the
        counters a quorum returned are the largest (nothing to write back), and
        validity is left. None: let the flow judge them (docs/design.md §2.6)."""
        sent = opening.sent
        assert sent is not None
        replies = sent.outcome
        if not isinstance(replies, Replies) or replies.identities or len(replies) != self.n:
            return None
        counters: list[int] = []  # per node, in order
        for reply in replies:
            if (type(reply) is not list or len(reply) != 2
                    or reply[0] != scripts.ACQUIRE_GRANTED or type(reply[1]) is not int):
                return None
            counters.append(reply[1])
        token = max(counters)  # the token rule (§3.1): the largest counter...
        rule = self.rule  # ...returned by a quorum: nothing to write back (usually by all)
        if (token >= TOKEN_LIMIT
                or not (rule.met_by_all if counters.count(token) == len(counters)
                        else rule.met([i for i, c in enumerate(counters) if c == token]))
                or validity_left(self.settings, ttl, sent.started, self.clock()) <= 0):
            return None
        self.floors.raise_to(sent.buckets, token)
        return self.held(opening, ttl, sent.started, {opening.resources[0]: token},
                         opening.kind, len(counters), attempt=1)
