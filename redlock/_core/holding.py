"""What a holder does with an acquisition, free of I/O (docs/design.md §2.4, §5.1): release,
extend and lose it, with the release calls and decisions the acquire also uses.
:class:`Holding` is one object per core (``core.holding``), given what it counts by: the nodes,
the settings, the membership rule, the request timeout."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import DEBUG

from redlock._core.kinds import MUTEX, Kind, by_node, with_epoch
from redlock._core.layout import Layout
from redlock._core.members import Membership
from redlock._core.requests import (
    PENDING,
    Broadcast,
    Call,
    CommandArg,
    Decision,
    Flow,
    Pause,
)
from redlock._core.settings import Settings
from redlock._core.state import LockState, Status
from redlock._core.tokens import quorum
from redlock._observe.log import get_logger
from redlock._observe.outages import NodeOutages
from redlock._scripts.replies import ack_outcome, acked, key_gone
from redlock.errors import NodeResult, Outcome, describe

logger = get_logger("redlock.locks")

# The least a holder's release waits for a quorum's answers (see release_calls).
_RELEASE_FLOOR = 0.25


class Holding:
    """Release, extend and loss of acquisitions, for one manager's N nodes (``addresses``),
    counted by ``membership``'s rule; ``timeout(ttl)`` is a request's wait."""

    def __init__(self, addresses: Sequence[str], settings: Settings, layout: Layout,
                 membership: Membership, timeout: Callable[[float | None], float],
                 node_outages: NodeOutages, clock: Callable[[], float]) -> None:
        self.addresses = tuple(addresses)
        self.n = len(self.addresses)
        self.nodes = range(self.n)
        self.settings = settings
        self.layout = layout  # each node's key names (docs/design.md §11.4)
        self.membership = membership
        self.timeout = timeout
        self.node_outages = node_outages
        self.clock = clock
        self.quorum = quorum(self.n)
        # A holder's release's decision, and every node's outcome when each did it (made
        # once, shared: immutable).
        self.quorum_answered = self._answered(self.quorum)
        self._all_done = tuple(NodeResult(a, Outcome.GRANTED) for a in self.addresses)
        self._every_node = frozenset(self.nodes)

    def release_calls(self, resources: Sequence[str], value: str, ttl: float | None = None, *,
                      leave: bool = True, nodes: Sequence[int] | None = None,
                      patient: bool = False, kind: Kind = MUTEX, ticket: str = "") -> Broadcast:
        """Compare-and-delete of each resource's key on every node; with ``leave`` the waiter's
        entries in the lines go too, without, its place (``ticket``) is kept (§6.3). Decided
        once a quorum of the nodes asked answered (:meth:`settled`)."""
        # A failed attempt keeps its place in line for the patience (the ACQUIRE that
        # granted it cut its entry to the key's TTL).
        timeout = self.timeout(ttl)
        args: tuple[CommandArg, ...] = (value, "1") if leave else (
            value, "0", int(self.settings.patience(timeout) * 1000), ticket)
        asked = self.nodes if nodes is None else nodes
        if not self.layout.clusters:
            calls, packed = kind.release_request(self.layout.keys, asked, resources, args)
        else:  # (each group of nodes with its key names)
            calls, packed = by_node(kind.release_request(keys, group, resources, args)
                                    for keys, group in self.layout.groups(asked, resources))
        if patient:
            # Decided once a quorum answered: the timeout only bounds it when fewer do, and
            # a starved thread or busy event loop reads healthy nodes' answers late.
            timeout = max(timeout, min(self.settings.request_ceiling(ttl), _RELEASE_FLOOR))
        return Broadcast(calls, timeout, enough=self.settled(calls) if nodes is not None
                         or len(resources) > 1 else self.quorum_answered, packed=packed)

    @staticmethod
    def _answered(needed: int) -> Decision:
        """:meth:`settled` of one key's release on every node: ``needed`` answered."""
        def answered(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
            return len(replies) - replies.count(PENDING) >= needed
        return answered

    def settled(self, calls: Sequence[Call], *, acks: bool = False) -> Decision:
        """When a release or extend is decided (docs/design.md §2.4, §5.1): once every key in it
        is settled, i.e. a quorum of the nodes asked answered for it (``acks``: replied 1, as an
        extend needs; or more said "our key is gone" than a quorum can spare), by the membership
        rule (§13.2). Until then it waits for every node, up to its timeout."""
        # A key: the call's value and first key (the resource's; a cluster node's call
        # declares other node keys than a standalone node's, §11.4).
        keys: dict[tuple[object, str], list[int]] = {}
        nodes = set()
        for index, call in enumerate(calls):
            nodes.add(call.node)
            keys.setdefault((call.args[0], call.keys[0]), []).append(index)
        per_key = list(keys.values())
        needed, rule = min(self.quorum, len(nodes)), self.membership.rule

        def key_settled(indexes: list[int], replies: Sequence[object]) -> bool:
            if not acks:
                return sum(1 for i in indexes if replies[i] is not PENDING) >= needed
            return (rule.met(calls[i].node for i in indexes if acked(replies[i]))
                    or rule.lost(calls[i].node for i in indexes if key_gone(replies[i])))

        def settled(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
            return all(key_settled(indexes, replies) for indexes in per_key)
        return settled

    def _per_node(self, replies: Sequence[object], resources: int,
                  refused: str) -> tuple[list[NodeResult], list[set[int]]]:
        """Replies of a value-checked script sent per node and resource (node-major):
        each node's outcome (GRANTED only if it acked every resource) and, per
        resource, the nodes that acked."""
        if resources == 1:  # (the usual case, on every release: one pass)
            for reply in replies:
                if type(reply) is not int or reply != 1:
                    break
            else:  # every node did
                return list(self._all_done), [set(self._every_node)]
            outcomes = [ack_outcome(address, reply, refused=refused)
                        for address, reply in zip(self.addresses, replies, strict=True)]
            return outcomes, [{i for i, result in enumerate(outcomes)
                               if result.outcome is Outcome.GRANTED}]
        outcomes = []
        acks: list[set[int]] = [set() for _ in range(resources)]
        for i in range(self.n):
            mine = replies[i * resources:(i + 1) * resources]
            results = [ack_outcome(self.addresses[i], reply, refused=refused) for reply in mine]
            for j, result in enumerate(results):
                if result.outcome is Outcome.GRANTED:
                    acks[j].add(i)
            worst = next((r for r in results if r.outcome is Outcome.ERROR),
                         next((r for r in results if r.outcome is Outcome.REFUSED), results[0]))
            outcomes.append(worst)
        return outcomes, acks

    # -- release / extend --------------------------------------------------------

    def release(self, state: LockState) -> Flow[tuple[NodeResult, ...]]:
        """Compare-and-delete on every node; idempotent; never deletes another's key. Per node:
        GRANTED (deleted our key of every resource), REFUSED (some key was not ours) or ERROR.
        An interrupted release is sent again before the interruption propagates."""
        [outcomes] = yield from self.release_many([state])
        return outcomes

    def release_many(self, states: Sequence[LockState]) -> Flow[list[tuple[NodeResult, ...]]]:
        """:meth:`release` of several acquisitions in one request, decided once each is; per
        acquisition, its outcomes (the renewal loop's, for those whose handles are gone: one by
        one, a hung majority would cost each a request timeout)."""
        request = (self.release_request(states[0]) if len(states) == 1
                   else self._joined([self.release_request(state) for state in states]))
        try:
            replies = yield request
        except GeneratorExit:
            raise
        except BaseException:
            yield request
            for state in states:
                state.mark_released()
            raise
        return self.released(states, replies)

    def release_request(self, state: LockState) -> Broadcast:
        """The request that releases ``state`` (a holder's: patient, see :meth:`release_calls`)."""
        return self.release_calls(state.resources, state.value, state.ttl, patient=True,
                                   kind=state.kind)

    def released(self, states: Sequence[LockState],
                 replies: Sequence[object]) -> list[tuple[NodeResult, ...]]:
        """What the replies of a release of ``states`` (one request, in their order)
        mean, per acquisition: its outcomes per node; the keys on nodes it missed expire
        by their TTL, which is said (once per node and outage)."""
        results, offset = [], 0
        for state in states:
            state.mark_released()
            size = self.n * len(state.resources)
            mine = replies if len(states) == 1 else replies[offset:offset + size]
            outcomes, _ = self._per_node(mine, len(state.resources), refused="key already gone")
            offset += size
            errors = [r for r in outcomes if r.outcome is Outcome.ERROR]
            if errors or self.node_outages.current:
                # The keys on nodes it missed expire by their TTL; say so (once per node
                # and outage: redlock.release_incomplete) rather than hide it.
                self.node_outages.release(logger, state.resource, state.ttl, outcomes)
            if not errors and logger.isEnabledFor(DEBUG):
                logger.debug("redlock.released", resource=state.resource, token=state.token)
            results.append(tuple(outcomes))
        return results

    def _joined(self, requests: Sequence[Broadcast]) -> Broadcast:
        """Release requests of several acquisitions as one: decided once each key is
        (see :meth:`settled`), within the longest of their timeouts."""
        if len(requests) == 1:
            return requests[0]
        calls = tuple(call for request in requests for call in request.calls)
        return Broadcast(calls, max(request.timeout for request in requests),
                         enough=self.settled(calls))

    def extend_many(self, items: Sequence[tuple[LockState, float]], *, lane: str | None = None,
                    until: float | None = None, racing_ttl: float | None = None,
                    ) -> Flow[list[tuple[NodeResult, ...] | None]]:
        """One extend round for several acquisitions, in one request. Per acquisition: None on
        success (a quorum of acks for every resource before the old validity ran out; the new
        validity measured from this round's start), else the per-node outcomes. ``until``: when
        another acquisition waiting for this round runs out of validity. ``racing_ttl``: the TTL
        a renewal still in flight may set after this round (§5.2): the shorter counts."""
        started = self.clock()
        live = [(state, ttl) for state, ttl in items
                if state.status == Status.HELD and started < state.deadline]
        results: dict[LockState, tuple[NodeResult, ...] | None] = {}
        if live:
            epoch, layout = self.membership.rule.epoch, self.layout
            for _ in range(2):  # again at once if a node taught us a newer epoch (§13.1)
                calls = with_epoch((
                    state.kind.extend_call(layout.of(i, r), i, r, state.value,
                                           max(1, int(ttl * 1000)))
                    for state, ttl in live for i in range(self.n) for r in state.resources),
                    layout, epoch)
                # A round may take up to half the validity left (at least a request timeout):
                # a late answer is still in time while the lock is valid, and a round given
                # up too early is only sent again (a batch of renewals on a busy loop lost
                # locks that way). Also half of what the others waiting for it have left, so
                # that a hung majority does not delay their loss.
                now = self.clock()
                validity_left = min(s.deadline for s, _ in live) - now
                spare = validity_left if until is None else min(validity_left, until - now)
                timeout = min(max(self.timeout(max(t for _, t in live)), spare / 2), validity_left)
                replies = yield Broadcast(calls, timeout,
                                          enough=self.settled(calls, acks=True), lane=lane)
                if self.membership.rule.epoch == epoch or min(
                        s.deadline for s, _ in live) <= self.clock():
                    break
                epoch = self.membership.rule.epoch
            # Counted under the newest configuration we know (§13.4).
            finished, offset, rule = self.clock(), 0, self.membership.rule
            for state, ttl in live:
                size = self.n * len(state.resources)
                outcomes, acks = self._per_node(replies[offset:offset + size],
                                                len(state.resources),
                                                refused="our key is gone (expired or taken)")
                offset += size
                if self.node_outages.current:
                    self.node_outages.answers(logger, outcomes)
                lasts = ttl if racing_ttl is None else min(ttl, racing_ttl)
                if all(rule.met(a) for a in acks) and finished < state.deadline and (
                        state.renewed(started + lasts - self.settings.drift(lasts), ttl)):
                    logger.debug("redlock.extended", resource=state.resource,
                                 token=state.token, acks=min(len(a) for a in acks), ttl_s=ttl)
                    results[state] = None
                else:
                    results[state] = tuple(outcomes)
        return [results.get(state, ()) for state, _ in items]

    def extend(self, state: LockState, ttl: float, racing_ttl: float | None = None,
               ) -> Flow[tuple[NodeResult, ...] | None]:
        """One extend round for one acquisition (see :meth:`extend_many`)."""
        [failure] = yield from self.extend_many([(state, ttl)], racing_ttl=racing_ttl)
        return failure

    def extend_or_lose(self, state: LockState, ttl: float,
                       racing_ttl: float | None = None) -> Flow[None]:
        """Explicit extend(): renewed on a quorum, or the lock is lost (marked, its keys
        released, LockLost raised). A round that fails while no majority says our key is gone
        is tried again, with backoff, while validity is left: the lock is still ours."""
        state.check()
        delay = 0.0
        answers: tuple[NodeResult, ...] = ()  # the last round's, for the loss report
        while True:
            failure = yield from self.extend(state, ttl, racing_ttl)
            if failure is None:
                return
            answers = failure or answers  # () : no round was sent (the validity ran out)
            if state.status != Status.HELD:  # released, handed over or lost meanwhile
                state.check()
            left = state.deadline - self.clock()
            if self.key_gone(answers) or left <= 0:
                yield from self.lose(state, self.loss_reason(answers), answers)
                state.check()  # raises LockLost with the reason
            settings = self.settings
            delay = (settings.retry_delay_min if not delay
                     else min(2 * delay, settings.retry_delay_max))
            yield Pause(min(delay, left))

    def key_gone(self, outcomes: Sequence[NodeResult]) -> bool:
        """More nodes answered that our key is gone than a quorum can spare (by the
        membership rule, §13.2): no extend can succeed any more. Only answers count: an
        error or a reply not read says nothing about our key."""
        return self.membership.rule.lost(i for i, r in enumerate(outcomes)
                              if r.outcome is Outcome.REFUSED)

    def loss_reason(self, outcomes: Sequence[NodeResult]) -> str:
        """Why a held lock is lost, in the nodes' words."""
        gone = sum(1 for r in outcomes if r.outcome is Outcome.REFUSED)
        if self.key_gone(outcomes):
            return (f"{gone} of {self.n} nodes answered that our key is gone (it expired,"
                    " or an operator force-released it), more than a quorum can spare")
        return (f"no quorum of the {self.n} nodes renewed it before its validity ran out"
                f" ({gone} answered that our key is gone, the others did not answer in time)")

    def lose(self, state: LockState, reason: str, outcomes: Sequence[NodeResult]) -> Flow[bool]:
        """Mark the lock lost and drop what is left of our keys; True the first time."""
        [first] = yield from self.lose_many([(state, reason, outcomes)])
        return first

    def lose_many(self, losses: Sequence[tuple[LockState, str, Sequence[NodeResult]]],
                  ) -> Flow[list[bool]]:
        """:meth:`lose` for several acquisitions (state, reason, outcomes), their keys dropped
        in one request (one each would cost a request timeout per lock before the next one's
        holder is told)."""
        firsts = []
        for state, reason, outcomes in losses:
            first = state.mark_lost(reason, outcomes)
            if first:
                logger.warning("redlock.lost", resource=state.resource, token=state.token,
                               reason=reason, outcomes=describe(outcomes))
            firsts.append(first)
        dropped = [state for (state, _, _), first in zip(losses, firsts, strict=True) if first]
        if dropped:
            # Drop what is left of our keys so the next holder need not wait for the TTL.
            yield self._joined([self.release_calls(state.resources, state.value, state.ttl,
                                                   kind=state.kind) for state in dropped])
        return firsts
