"""The Redlock algorithm with quorum fencing, free of I/O (docs/design.md §2-§5).

Everything that decides anything about locks lives here and in
:mod:`redlock._core.holding`: the acquire attempt, its quorum, validity and token
commit, retries and backoff here; release, extend and loss there (the renewal loop,
:mod:`redlock._core.renewals`, drives those). Each operation is a flow (see
:mod:`redlock._core.requests`) that the sync and asyncio shells drive; node amnesia is
delegated to :class:`redlock._core.amnesia.guard.AmnesiaGuard`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from redlock._core import handoff
from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.amnesia.repair import RepairReport, initialise, repair
from redlock._core.attempts import Attempts
from redlock._core.commit import commit_enough
from redlock._core.environment import Environment
from redlock._core.holding import Holding
from redlock._core.kinds import MUTEX, Kind, Leadership, with_epoch
from redlock._core.members import Members, Rule, stable
from redlock._core.quick import Opening, QuickLane
from redlock._core.requests import Backoff, Broadcast, Deadline, Flow, Replies
from redlock._core.settings import Keys, Settings, label, validate_node_addresses
from redlock._core.state import AcquireResult, AttemptResult, LockState, RoundTrips
from redlock._core.templates import CallTemplates
from redlock._core.tokens import (
    TOKEN_LIMIT,
    TokenFloors,
    attempt_owner,
    choose_token,
    quorum,
    validity_left,
    waiter_id,
)
from redlock._core.waiting import Waits
from redlock._observe.log import get_logger
from redlock._observe.outages import NodeOutages
from redlock._scripts.replies import (
    FailureKind,
    NodeFailure,
    acked,
    acquire_counters,
    acquire_set_nothing,
    epoch_refusal,
)
from redlock.errors import NodeResult, Outcome, describe

logger = get_logger("redlock.locks")
nodes_logger = get_logger("redlock.nodes")

class RedlockCore(Holding, QuickLane, Attempts):
    """Quorum acquire with fencing for N nodes; release, extend and loss come from
    :class:`~redlock._core.holding.Holding`, the quick lane from
    :class:`~redlock._core.quick.QuickLane`, a call's opening and its attempts' requests
    from :class:`~redlock._core.attempts.Attempts`."""

    def __init__(self, addresses: Sequence[str], settings: Settings, env: Environment) -> None:
        validate_node_addresses(addresses)
        self.env = env
        self.round_trips = RoundTrips(len(addresses), env.new_mutex())  # fed by the I/O
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.clock = env.clock
        self.n = len(addresses)
        self.quorum = quorum(self.n)
        # The membership rule (docs/design.md §13): epoch 0, the nodes given, until a
        # node refuses our epoch with a newer record.
        self.rule = Rule(self.addresses, stable(self.addresses))
        self._members_mutex = env.new_mutex()
        self.floors = TokenFloors(env.new_mutex())
        self.templates = CallTemplates(self.keys, self.n)  # the usual calls, filled in
        # A mutex's local line and counters per name (asked on every acquire and release;
        # the names used lately, as the templates).
        self._mutex_names: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
        # A holder's release is decided once a quorum answered (the same decision for every
        # release: made once).
        self.quorum_answered = self._answered(self.quorum)
        # Where hand-offs to this manager's waiters are told (docs/design.md §6.7): its
        # listeners subscribe '<release channel>:<route>'; a forked child has its own.
        self.route = env.random_hex(4)
        self._all_done = tuple(NodeResult(a, Outcome.GRANTED) for a in self.addresses)
        self._every_node = frozenset(range(self.n))
        self.amnesia = AmnesiaGuard(self.addresses, settings, self.keys, env, self.timeout,
                                    lambda: self.rule)
        # Failing nodes are logged once per outage.
        self.node_outages = NodeOutages(env.clock, env.wall_clock, env.new_mutex())
        if self.n % 2 == 0:
            nodes_logger.warning("redlock.even_node_count", nodes=self.n, quorum=self.quorum,
                           tolerated_failures=self.n - self.quorum,
                           hint="an odd N tolerates as many failures with one node fewer")

    def after_fork(self) -> None:
        """In a forked child: fresh thread locks (what they guard stays valid: floors and
        round trips are only hints, node health is the nodes')."""
        new_mutex = self.env.new_mutex
        self.round_trips.after_fork(new_mutex())
        self.floors.after_fork(new_mutex())
        self.amnesia.health.after_fork(new_mutex())
        self.node_outages.after_fork(new_mutex())
        self._members_mutex = new_mutex()
        self.route = self.env.random_hex(4)

    def timeout(self, ttl: float | None = None) -> float:
        """How long a request waits for the nodes: ``node_timeout`` if the user set one,
        else adapted to the measured round trips, within a fifth of ``ttl``."""
        if self.settings.node_timeout is not None:
            return self.settings.node_timeout
        return self.round_trips.timeout(self.quorum, self.settings.request_ceiling(ttl))

    def absorb(self, replies: Replies) -> None:
        """What a broadcast learnt on the way (the drivers call this before its flow goes
        on): round trips measured, servers identified on new connections."""
        if replies.round_trips:
            self.round_trips.sample_many(replies.round_trips)
        if replies.identities:
            self.amnesia.identified(replies.identities)
        for reply in replies:  # (a constant tuple: `list | tuple` built a union per reply)
            if isinstance(reply, (list, tuple)) and len(reply) == 5:  # (a refusal's shape)
                record = epoch_refusal(reply)
                if record is not None:
                    self.adopt_members(record)

    def adopt_members(self, record: Members, *, learnt: bool = True) -> bool:
        """Count under ``record``'s configuration from now on, if its epoch is above ours
        (docs/design.md §13.1: epochs only rise in a client); True if adopted. Logged
        when ``learnt`` from a node (not when this manager made the change itself)."""
        record = Members(record.epoch, record.members, record.joining)
        with self._members_mutex:
            if record.epoch <= self.rule.epoch:
                return False
            self.rule = Rule(self.addresses, record)
        if learnt:
            logger.info("redlock.members_adopted", epoch=record.epoch,
                        members=list(record.members), joining=list(record.joining or ()),
                        possible=self.rule.possible)
        return True

    # -- acquire ---------------------------------------------------------------

    def acquire(self, resources: str | tuple[str, ...], ttl: float, *, blocking: bool,
                timeout: float | None,
                watch: Callable[[AttemptResult], None] | None = None,
                kind: Kind = MUTEX, opening: Opening | None = None) -> Flow[AcquireResult]:
        """Attempts until success, the deadline, or (non-blocking) after one attempt.

        ``opening``: the call as the quick lane opened it, its first attempt sent
        (:mod:`redlock._core.quick`); the flow carries on from its replies. A blocking
        acquire also gives up once the cluster has been unavailable (too few nodes
        answering, not contention) for ``outage_timeout``: waiting longer would hide an
        outage from the caller."""
        resources = (resources,) if isinstance(resources, str) else resources
        if opening is None:
            opening = self.open_acquire(resources, ttl, blocking=blocking, timeout=timeout,
                                        kind=kind)
        call, kind, queued, ticket = opening.owner, opening.kind, opening.queued, opening.ticket
        single, deadline = opening.single, opening.deadline
        outage_limit = self.settings.outage_timeout
        outage_since: float | None = None
        waits = Waits(self.settings, queued=queued)
        attempts = 0
        while True:
            attempts += 1
            owner = attempt_owner(call, attempts)  # for the releases that end the call
            attempt_started = self.clock()
            try:
                result = yield from self._attempt(opening, ttl, kind, attempt=attempts)
            except GeneratorExit:
                raise
            except BaseException:
                # The call ends here, interrupted (cancelled) or failed anywhere in the
                # attempt: its SET may have happened anywhere, and its line entries go too
                # (a release would hand the lock to one left behind, for its TTL, §6.7).
                yield deadline.cap(self._release_calls(resources, owner, ttl, kind=kind))
                raise
            if watch is not None:  # observation (OpenTelemetry) hears of each attempt
                watch(result)
            if result.retry_now and attempts < 3:
                if not deadline.passed():
                    continue
                result = replace(result, reason=f"{result.reason}; no time was left to try"
                                                " again")
            if result.state is not None and isinstance(kind, Leadership):
                try:
                    yield from self._proclaim(result.state, deadline)
                except GeneratorExit:
                    raise
                except BaseException:  # interrupted: the caller never gets the leadership
                    yield deadline.cap(self._release_calls(resources, owner, ttl,
                                                           kind=result.state.kind))
                    raise
            if result.state is not None or single or result.permanent:
                if result.state is None:
                    yield from self._leave_line(resources, owner, ttl, ticket, deadline, kind)
                return AcquireResult(result.state, result.outcomes, attempts,
                                     result.unavailable, result.reason)
            kind = result.next_kind or kind
            now = self.clock()
            if result.unavailable:
                outage_since = attempt_started if outage_since is None else outage_since
                if outage_limit is not None and now - outage_since >= outage_limit:
                    yield from self._leave_line(resources, owner, ttl, ticket, deadline, kind)
                    return AcquireResult(None, result.outcomes, attempts, True,
                                         f"{result.reason}; the cluster has been unavailable"
                                         f" for {now - outage_since:.1f} s (outage_timeout)")
            else:
                outage_since = None
            if deadline.passed():
                yield from self._leave_line(resources, owner, ttl, ticket, deadline, kind)
                return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                     result.reason)
            delay, patient = waits.next(attempts, result.outcomes,
                                        unavailable=result.unavailable, left=deadline.left())
            backoff = Backoff(delay, line=self.line(resources, kind),
                              channels=kind.wait_channels(self.keys, resources,
                                                          self.route if queued else ""),
                              waiter=waiter_id(call) if queued else None, patient=patient)
            try:
                heard = yield backoff
                if queued and kind.hands_off:
                    # Releases may have handed us the lock meanwhile (docs/design.md §6.7).
                    handed = yield from handoff.acquired(
                        self, heard, backoff, resources, call, ttl, deadline, kind,
                        attempts, attempt_started, result.outcomes)
                    if handed is not None:
                        if watch is not None:
                            watch(handed)
                        return AcquireResult(handed.state, handed.outcomes, attempts,
                                             False, "")
            except GeneratorExit:
                raise
            except BaseException:  # interrupted (cancelled) while waiting: leave the line
                yield from self._leave_line(resources, owner, ttl, ticket, deadline, kind)
                raise

    def _proclaim(self, state: LockState, deadline: Deadline) -> Flow[None]:
        """A new leader writes its term record on the nodes that still hold its key
        (docs/design.md §12.1): information for ``leader()``, not safety (the term in
        the leader's hands is). Fewer than a quorum is logged, not a failure."""
        kind = state.kind
        assert isinstance(kind, Leadership)
        calls = with_epoch((kind.proclaim_call(self.keys, i, state.resource, state.owner,
                                               state.token) for i in range(self.n)),
                           self.keys, self.rule.epoch)
        acks = yield deadline.cap(Broadcast(calls, self.timeout(state.ttl),
                                            enough=self._settled(calls, acks=True)))
        proclaimed = sum(1 for ack in acks if acked(ack))
        if not self.rule.met(i for i, ack in enumerate(acks) if acked(ack)):
            logger.warning("redlock.term_unrecorded", resource=state.resource,
                           token=state.token, recorded=proclaimed, needed=self.rule.needed,
                           hint="leader() may not name this leader until its next term;"
                                " the term itself (the token) is committed")

    def _leave_line(self, resources: tuple[str, ...], owner: str, ttl: float,
                    ticket: str, deadline: Deadline, kind: Kind = MUTEX) -> Flow[None]:
        """A queued acquire call that ends without the lock drops its entries from the
        waiting lines at once: the next in line need not wait for them to lapse. (A
        final release: what is still unsent at the deadline goes out when its
        connection opens, docs/design.md §2.4.)"""
        if ticket:
            yield deadline.cap(self._release_calls(resources, owner, ttl, leave=True,
                                                   kind=kind))

    def _attempt(self, opening: Opening, ttl: float, kind: Kind,
                 attempt: int) -> Flow[AttemptResult]:
        resources, deadline = opening.resources, opening.deadline
        owner = attempt_owner(opening.owner, attempt)  # this attempt's value (§2.1)
        settings, keys, name = self.settings, self.keys, label(resources)
        sent, opening.sent = opening.sent, None  # (the quick lane's first attempt, sent)
        if sent is None:
            sent = self.attempt_request(opening, ttl, kind, attempt)
            # (Interrupted or failed from here on: acquire() releases and leaves the line.)
            replies = yield sent.request
        elif isinstance(sent.outcome, BaseException):  # interrupted in the quick lane
            raise sent.outcome
        else:
            replies = cast(Replies, sent.outcome)
        request, started, epoch = sent.request, sent.started, sent.epoch
        buckets = sent.buckets  # the counters involved (§3.0)
        if len(replies) > self.n:  # (with the INFO of a manager's first attempt)
            self.amnesia.inspected(replies[self.n:])
            replies = replies[:self.n]
        outcomes = self.amnesia.screen([
            kind.outcome(self.addresses[i], reply, len(resources))
            for i, reply in enumerate(replies)])
        amnesia = (None if self.amnesia.clear(outcomes)
                   else (yield from self.amnesia.check(outcomes, deadline)))
        if amnesia is not None:  # the call may try again: it keeps its place in line
            yield deadline.cap(self._release_calls(resources, owner, ttl, leave=False,
                                                   kind=kind, ticket=opening.ticket))
            return amnesia
        # The grants this attempt keeps (a permit's: of the slot most nodes granted;
        # the others are given back at once, §12.2), and what they are grants of.
        granting = {i: replies[i] for i, r in enumerate(outcomes)
                    if r.outcome is Outcome.GRANTED}
        held_kind, kept = kind.granted(granting) if granting else (kind, {})
        stray = held_kind.stray(granting)
        if stray:
            yield deadline.cap(self._release_calls(resources, owner, ttl, leave=False,
                                                   nodes=stray, kind=kind))
        if kept and held_kind is not kind:  # (a permit's slot: its own buckets)
            buckets = held_kind.buckets(resources)
        # Per granting node, its counter for each resource (in the set's order).
        granted = {i: acquire_counters(reply) for i, reply in kept.items()}
        if granted:  # the next attempt lifts the nodes that lag behind the highest
            self.floors.raise_to(buckets, max(max(c) for c in granted.values()))
        # Counted under the newest configuration we know (this round's refusals may
        # have taught us one: a stricter rule, never a weaker one, §13.4).
        rule = self.rule
        if rule.met(granted):
            # The token rule, resource by resource (docs/design.md §3).
            choices = {r: choose_token({i: c[j] for i, c in granted.items()})
                       for j, r in enumerate(resources)}
            committed = {r: set(c.committed) for r, c in choices.items()}
            write_backs = [(r, call) for r, c in choices.items()
                           if not rule.met(committed[r])
                           for call in with_epoch(
                               (held_kind.write_back_call(keys, i, r, owner, c.token)
                                for i in c.write_back), keys, epoch)]
            if write_backs:
                # Counters diverged: raise the lower ones to the token, but only on
                # nodes that still hold our key (the script checks the owner).
                acks = yield Broadcast(tuple(call for _, call in write_backs),
                                       deadline.bound(self.timeout(ttl)),
                                       enough=commit_enough(write_backs, committed,
                                                             rule))
                rule = self.rule
                for (r, call), ack in zip(write_backs, acks, strict=True):
                    if acked(ack):
                        committed[r].add(call.node)
                for r in {r for r, _ in write_backs}:
                    logger.info("redlock.token_write_back", resource=r,
                                token=choices[r].token,
                                returned_token=len(choices[r].committed),
                                written_back=len(choices[r].write_back),
                                committed=len(committed[r]))
            validity = validity_left(settings, ttl, started, self.clock())
            short = [r for r in resources if not rule.met(committed[r])]
            too_big = [r for r in resources if choices[r].token >= TOKEN_LIMIT]
            if not short and not too_big and validity > 0:
                return AttemptResult(self.held(opening, ttl, started, {
                    r: c.token for r, c in choices.items()}, held_kind, len(granted), attempt),
                    outcomes)
            if too_big:
                reason = f"fence counter reached {TOKEN_LIMIT}"
            elif short:
                reason = ("token " + rule.count(committed[short[0]], "committed")
                          if rule.joint else f"token committed on"
                          f" {len(committed[short[0]])} nodes, need {rule.needed}")
            else:
                reason = "validity ran out during the attempt"
        else:
            reason = rule.count(granted, "granted")
            if rule.epoch:
                reason += f" (membership epoch {rule.epoch})"
        # Failure: release wherever our key may be, including nodes that timed out (reply
        # lost after SET); not where the script refused (it set nothing). The waiter
        # keeps its place in line: the acquire call may try again.
        maybe_set = [i for i, reply in enumerate(replies) if not acquire_set_nothing(reply)]
        if maybe_set:
            yield deadline.cap(self._release_calls(resources, owner, ttl, leave=False,
                                                   nodes=maybe_set, kind=kind,
                                                   ticket=opening.ticket))
        healthy = [i for i, r in enumerate(outcomes)
                   if r.outcome in (Outcome.GRANTED, Outcome.REFUSED)]
        relearnt = self.rule.epoch != epoch  # refused for our epoch: try again at once
        unavailable = not self.rule.met(healthy) and not relearnt
        if all(isinstance(reply, NodeFailure) and reply.kind is FailureKind.TIMEOUT
               for reply in replies):
            reason += (f"; every node timed out after {request.timeout * 1000:.0f} ms:"
                       + (" node_timeout is too short for this network (leave it unset"
                          " to adapt to the measured round trips)"
                          if self.settings.node_timeout is not None else
                          " check the network, and connect_timeout if new connections"
                          " are slow"))
        if unavailable and any(r.outcome is Outcome.INCOMPATIBLE for r in outcomes):
            # Nodes a newer release initialised (§4.1) kept the quorum out of reach: no
            # retry can help (acquire() releases the call and leaves its lines).
            raise self.amnesia.incompatible_error(kind.describe(resources), name, outcomes)
        permanent = unavailable and any(
            isinstance(reply, NodeFailure) and reply.permanent for reply in replies)
        logger.debug("redlock.quorum_failed", resource=name, reason=reason,
                     granted=len(granted), needed=self.rule.needed, nodes=self.n,
                     unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, retry_now=relearnt,
                             reason=reason, next_kind=kind.next_attempt(replies))

    def repair(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.repair` (and the one below)."""
        return (yield from repair(self.amnesia, force=force))

    def initialise(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.initialise`."""
        return (yield from initialise(self.amnesia, force=force))
