"""The Redlock algorithm with quorum fencing, free of I/O (docs/design.md §2-§5, §10 "What each
object holds"): :class:`RedlockCore`, what one manager knows of its nodes, and the acquire, one
route for every kind of grant (§2.6). Release, extend and loss are ``core.holding``'s; node
amnesia is ``core.amnesia``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from logging import DEBUG

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.amnesia.repair import RepairReport, initialise, repair
from redlock._core.environment import Environment
from redlock._core.handoff import Handoffs, counted, enough, may_still, wake_at
from redlock._core.holding import Holding
from redlock._core.kinds import MUTEX, AcquireArgs, Kind, Leadership, by_node, with_epoch
from redlock._core.layout import Layout
from redlock._core.members import Membership, Rule
from redlock._core.requests import (
    Backoff,
    Broadcast,
    Call,
    Deadline,
    Decision,
    Flow,
    Replies,
)
from redlock._core.settings import Keys, Settings, label, validate_node_addresses
from redlock._core.state import AcquireResult, AttemptResult, LockState, RoundTrips
from redlock._core.tokens import (
    TOKEN_LIMIT,
    TokenFloors,
    choose_token,
    lock_value,
    quorum,
    validity_left,
    waiter_id,
)
from redlock._core.waiting import Waits
from redlock._observe.log import get_logger
from redlock._observe.outages import NodeOutages
from redlock._scripts.lock import ACQUIRE_GRANTED
from redlock._scripts.replies import (
    FailureKind,
    NodeFailure,
    acked,
    acquire_counters,
    acquire_set_nothing,
    epoch_refusal,
    foreign,
    restarted,
)
from redlock.errors import NodeResult, Outcome, describe

__all__ = ["Opening", "RedlockCore", "commit_enough", "grant_enough"]

logger = get_logger("redlock.locks")
nodes_logger = get_logger("redlock.nodes")


@dataclass(slots=True)
class Opening:
    """An acquire call's start: its ``secret`` (32 hex digits; each attempt's lock value starts
    with it, docs/design.md §2.1), what it acquires (``name``: in messages), its place in the
    nodes' line (``ticket``, '' when it does not queue), when it started and its deadline."""

    resources: tuple[str, ...]
    name: str
    secret: str
    kind: Kind
    ticket: str
    started: float
    single: bool
    deadline: Deadline


class RedlockCore:
    """Quorum acquire with fencing for N nodes; release, extend and loss are
    ``holding``'s (:class:`~redlock._core.holding.Holding`)."""

    def __init__(self, addresses: Sequence[str], settings: Settings, env: Environment,
                 clusters: Sequence[int] = ()) -> None:
        validate_node_addresses(addresses)
        self.env = env
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = Keys(settings.namespace)
        # Each node's key names: ``clusters``, the Redis Cluster nodes, use those of each
        # resource's hash slot (docs/design.md §11.4).
        self.layout = Layout(self.keys, len(self.addresses), clusters)
        self.clock = env.clock
        self.n = len(addresses)
        self.nodes = range(self.n)
        self.quorum = quorum(self.n)
        self.round_trips = RoundTrips(self.n, env.new_mutex())  # fed by the I/O
        # The membership rule (docs/design.md §13): epoch 0, the nodes given, until a
        # node refuses our epoch with a newer record.
        self.membership = Membership(self.addresses, env.new_mutex())
        self.floors = TokenFloors(env.new_mutex())
        # Where hand-offs to this manager's waiters are told (docs/design.md §6.7): its
        # listeners subscribe '<release channel>:<route>'; a forked child has its own.
        self.route = env.random_hex(4)
        # Failing nodes are logged once per outage.
        self.node_outages = NodeOutages(env.clock, env.wall_clock, env.new_mutex())
        self.amnesia = AmnesiaGuard(self.addresses, settings, self.layout, env, self.timeout,
                                    self.membership)
        self.holding = Holding(self.addresses, settings, self.layout, self.membership,
                               self.timeout, self.node_outages, env.clock)
        # A mutex's local turns key and counters per name (asked on every attempt; the names
        # used lately: the client's memory does not grow with the names it ever locked).
        self._mutex_names: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
        # Every node's outcome when each granted (the usual attempt's, shared: immutable).
        self._all_granted = tuple(NodeResult(a, Outcome.GRANTED) for a in self.addresses)
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
        self.membership.after_fork(new_mutex())
        self.route = self.env.random_hex(4)

    def timeout(self, ttl: float | None = None) -> float:
        """How long a request waits for the nodes: ``node_timeout`` if the user set one,
        else adapted to the measured round trips, within a fifth of ``ttl``."""
        if self.settings.node_timeout is not None:
            return self.settings.node_timeout
        return self.round_trips.timeout(self.quorum, self.settings.request_ceiling(ttl))

    def absorb(self, replies: Replies) -> None:
        """What a broadcast learnt on the way (before its flow goes on): round trips,
        servers identified, a newer membership record a node refused our epoch with."""
        if replies.round_trips:
            self.round_trips.sample_many(replies.round_trips)
        if replies.identities:
            self.amnesia.identified(replies.identities)
        for reply in replies:  # (a constant tuple: `list | tuple` built a union per reply)
            if isinstance(reply, (list, tuple)) and len(reply) == 5:  # (a refusal's shape)
                record = epoch_refusal(reply)
                if record is not None:
                    self.membership.adopt(record)

    def turns_key(self, resources: Sequence[str], kind: Kind = MUTEX) -> str:
        """The key of an acquisition's local turns: a resource's release channel (a set
        has one of its own). Attempts on one key from one manager take turns (§6.5)."""
        if kind is MUTEX:
            return self._mutex_name(resources)[0]
        return kind.channel(self.keys, resources[0] if len(resources) == 1
                            else "\x00".join(resources))

    def _mutex_name(self, resources: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """A mutex's (turns key, buckets) of ``resources``, kept for the names used lately."""
        key = tuple(resources)
        made = self._mutex_names.get(key)
        if made is None:
            if len(self._mutex_names) >= 1024:
                self._mutex_names.clear()
            made = self._mutex_names[key] = (
                MUTEX.channel(self.keys, key[0] if len(key) == 1 else "\x00".join(key)),
                MUTEX.buckets(key))
        return made

    # -- acquire ---------------------------------------------------------------

    def open(self, resources: tuple[str, ...], ttl: float, *, blocking: bool,
             timeout: float | None, kind: Kind = MUTEX) -> Opening:
        """An acquire call's start. Every round and wait ends by the caller's deadline:
        ``timeout`` after the start for a blocking acquire, one request ceiling for a
        single try (:meth:`Settings.single_try`); docs/design.md §2.5."""
        secret = self.env.random_hex(16)  # 128 bits: only we can release our key
        # A blocking acquire of one resource queues with its ticket (wall-clock
        # microseconds, §6.3); a single try, or a set, does not queue.
        single = not blocking or timeout == 0
        ticket = (str(int(self.env.wall_clock() * 1_000_000))
                  if not single and len(resources) == 1 else "")
        started = self.clock()
        deadline = Deadline(self.clock, started + self.settings.single_try(ttl) if single
                            else None if timeout is None else started + timeout)
        return Opening(resources, label(resources), secret,
                       kind if kind is MUTEX else kind.for_call(secret), ticket, started,
                       single, deadline)

    def acquire(self, resources: str | tuple[str, ...], ttl: float, *, blocking: bool,
                timeout: float | None, watch: Callable[[AttemptResult], None] | None = None,
                kind: Kind = MUTEX) -> Flow[AcquireResult]:
        """Attempts until success, the deadline, or (non-blocking) after one attempt.

        A blocking acquire also gives up once the cluster has been unavailable (too few nodes
        answering, not contention) for ``outage_timeout``: waiting longer would hide an outage from
        the caller. ``watch`` (OpenTelemetry's observer) hears of each attempt."""
        resources = (resources,) if isinstance(resources, str) else resources
        opening = self.open(resources, ttl, blocking=blocking, timeout=timeout, kind=kind)
        call, kind, ticket, deadline = opening.secret, opening.kind, opening.ticket, \
            opening.deadline
        outage_since: float | None = None
        waits: Waits | None = None  # (made by the first wait: most calls never wait)
        attempts = 0
        while True:
            attempts += 1
            attempt_started = self.clock()
            try:
                result = yield from self._attempt(opening, ttl, kind, attempts)
            except GeneratorExit:
                raise
            except BaseException:
                # The call ends here, interrupted (cancelled) or failed anywhere in the
                # attempt: its SET may have happened anywhere, and its line entries go too
                # (a release would hand the lock to one left behind, for its TTL, §6.7).
                yield deadline.cap(self.holding.release_calls(
                    resources, lock_value(call, attempts), ttl, kind=kind))
                raise
            if watch is not None:
                watch(result)
            state = result.state
            if state is not None:
                if isinstance(state.kind, Leadership):
                    try:
                        yield from self._proclaim(state, deadline)
                    except GeneratorExit:
                        raise
                    except BaseException:  # interrupted: the caller never leads
                        yield deadline.cap(self.holding.release_calls(
                            resources, state.value, ttl, kind=state.kind))
                        raise
                return AcquireResult(state, result.outcomes, attempts, False, "")
            value = lock_value(call, attempts)  # (for the releases that end the call)
            if result.retry_now and attempts < 3:
                if not deadline.passed():
                    continue
                result = replace(result, reason=f"{result.reason}; no time was left to try"
                                                " again")
            if opening.single or result.permanent:
                yield from self._leave_line(resources, value, ttl, ticket, deadline, kind)
                return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                     result.reason)
            kind = result.next_kind or kind
            now = self.clock()
            if result.unavailable:
                outage_since = attempt_started if outage_since is None else outage_since
                outage_limit = self.settings.outage_timeout
                if outage_limit is not None and now - outage_since >= outage_limit:
                    yield from self._leave_line(resources, value, ttl, ticket, deadline, kind)
                    return AcquireResult(None, result.outcomes, attempts, True,
                                         f"{result.reason}; the cluster has been unavailable"
                                         f" for {now - outage_since:.1f} s (outage_timeout)")
            else:
                outage_since = None
            if deadline.passed():
                yield from self._leave_line(resources, value, ttl, ticket, deadline, kind)
                return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                     result.reason)
            if waits is None:
                waits = Waits(self.settings, queued=bool(ticket))
            delay, patient = waits.next(attempts, result.outcomes,
                                        unavailable=result.unavailable, left=deadline.left())
            backoff = Backoff(delay, turns_key=self.turns_key(resources, kind),
                              channels=kind.wait_channels(self.keys, resources,
                                                          self.route if ticket else ""),
                              waiter=waiter_id(call) if ticket else None, patient=patient)
            try:
                heard = yield backoff
                if ticket and kind.hands_off:
                    # Releases may have handed us the lock meanwhile (docs/design.md §6.7).
                    handed = yield from self._handed_off(
                        heard, backoff, opening, ttl, kind, attempts, attempt_started,
                        result.outcomes)
                    if handed is not None:
                        if watch is not None:
                            watch(handed)
                        return AcquireResult(handed.state, handed.outcomes, attempts, False, "")
            except GeneratorExit:
                raise
            except BaseException:  # interrupted (cancelled) while waiting: leave the line
                yield from self._leave_line(resources, value, ttl, ticket, deadline, kind)
                raise

    def _proclaim(self, state: LockState, deadline: Deadline) -> Flow[None]:
        """A new leader writes its term record on the nodes that still hold its key
        (docs/design.md §12.1): information for ``leader()``, not safety (the term in
        the leader's hands is). Fewer than a quorum is logged, not a failure."""
        kind = state.kind
        assert isinstance(kind, Leadership)
        rule = self.membership.rule
        layout = self.layout
        calls = with_epoch((kind.proclaim_call(layout.of(i, state.resource), i, state.resource,
                                               state.value, state.token) for i in self.nodes),
                           layout, rule.epoch)
        acks = yield deadline.cap(Broadcast(calls, self.timeout(state.ttl),
                                            enough=self.holding.settled(calls, acks=True)))
        proclaimed = sum(1 for ack in acks if acked(ack))
        rule = self.membership.rule
        if not rule.met(i for i, ack in enumerate(acks) if acked(ack)):
            logger.warning("redlock.term_unrecorded", resource=state.resource,
                           token=state.token, recorded=proclaimed, needed=rule.needed,
                           hint="leader() may not name this leader until its next term;"
                                " the term itself (the token) is committed")

    def _leave_line(self, resources: tuple[str, ...], value: str, ttl: float,
                    ticket: str, deadline: Deadline, kind: Kind = MUTEX) -> Flow[None]:
        """A queued acquire call that ends without the lock leaves the lines at once, so the
        next in line need not wait for its entries to lapse (a final release, §2.4)."""
        if ticket:
            yield deadline.cap(self.holding.release_calls(resources, value, ttl, leave=True,
                                                          kind=kind))

    def _attempt(self, opening: Opening, ttl: float, kind: Kind,
                 attempt: int) -> Flow[AttemptResult]:
        """One attempt (docs/design.md §2.2): its request to every node, then what the replies
        mean. The usual replies (every node granted our call, nothing to write back, time left) are
        told in one pass; anything else is judged by :meth:`_judged`."""
        resources, deadline, settings = opening.resources, opening.deadline, self.settings
        value = lock_value(opening.secret, attempt)  # this attempt's value (§2.1)
        rule, health = self.membership.rule, self.amnesia.health
        if not rule.possible:
            rule.check()  # MembershipError: our nodes cannot form a quorum (§13.2)
        epoch, started = rule.epoch, self.clock()
        # A manager's first attempt also reads every node's INFO (docs/design.md §4.7),
        # behind the acquire calls on the same connections: no round of its own.
        inspect = () if health.inspected else self.amnesia.inspect_calls()
        # Before the round trips are known (a new manager), the round learns its timeout
        # from its own replies, as later ones have it from RoundTrips (docs/design.md §2.4).
        learn = self.quorum if (settings.node_timeout is None
                                and self.round_trips.measured() < self.quorum) else 0
        timeout = self.timeout(ttl)  # (the attempt's, its line entry's patience from it)
        turns_key, buckets = (self._mutex_name(resources) if kind is MUTEX
                              else (self.turns_key(resources, kind), kind.buckets(resources)))
        args = AcquireArgs(value, max(1, int(ttl * 1000)), self.floors.get(buckets),
                           opening.ticket, int(settings.patience(timeout) * 1000), attempt,
                           self.route)
        if not self.layout.clusters:
            calls, packed = kind.acquire_request(self.keys, self.nodes, resources, args, epoch)
        else:  # (each group of nodes with its key names, docs/design.md §11.4)
            calls, packed = by_node(kind.acquire_request(keys, nodes, resources, args, epoch)
                                    for keys, nodes in self.layout.groups(self.nodes, resources))
        # Whose grants do not count: restarted nodes being judged (§4.4), nodes of
        # another format (§4.1).
        uncounted = (health.suspect if not health.incompatible
                     else {**health.suspect, **health.incompatible})
        request = Broadcast(calls + inspect, deadline.bound(timeout), turns_key=turns_key,
                            turns=not opening.ticket,
                            enough=grant_enough(self.n, uncounted, rule, kind.vote,
                                                kind.group if kind.grouped else None),
                            learn=learn, packed=None if inspect else packed)
        # (Interrupted or failed from here on: acquire() releases and leaves the line.)
        replies = yield request
        if len(replies) > self.n:  # (with the INFO of a manager's first attempt)
            self.amnesia.inspected(replies[self.n:])
            replies = replies[:self.n]
        # The usual outcome: every node granted our call plainly (none restarted or of
        # another format), a quorum returned the largest counter (nothing to write
        # back, §3.2), below 2**53, and validity is left (§2.2).
        if not health.suspect and not health.incompatible and not kind.grouped and len(
                resources) == 1:
            counters = []
            for reply in replies:
                if (type(reply) is not list or len(reply) != 2
                        or reply[0] != ACQUIRE_GRANTED or type(reply[1]) is not int):
                    break
                counters.append(reply[1])
            else:
                token = max(counters)  # the token rule (§3.1): the largest counter...
                rule = self.membership.rule  # ...returned by a quorum (usually by all)
                if (token < TOKEN_LIMIT
                        and (rule.met_by_all if counters.count(token) == self.n
                             else rule.met([i for i, c in enumerate(counters) if c == token]))
                        and validity_left(settings, ttl, started, self.clock()) > 0):
                    health.marker_seen = True  # (a grant: the node has its marker)
                    self.floors.raise_to(buckets, token)
                    return AttemptResult(self.held(opening, ttl, started, {
                        resources[0]: token}, kind, self.n, value), self._all_granted)
        return (yield from self._judged(opening, ttl, kind, attempt, value, request,
                                        replies, started, epoch, buckets))

    def _judged(self, opening: Opening, ttl: float, kind: Kind, attempt: int, value: str,
                request: Broadcast, replies: Sequence[object], started: float, epoch: int,
                buckets: tuple[str, ...]) -> Flow[AttemptResult]:
        """An attempt's replies, judged: amnesia, permits' slots, the token's commit (a
        write-back round where counters differ), validity; on failure, releases where
        our key may be and why."""
        resources, deadline = opening.resources, opening.deadline
        settings, layout, name = self.settings, self.layout, opening.name
        places = layout.places(resources)
        # (Each outcome names its node; a cluster node's, the hash slot it answered for.)
        names = self.addresses if not layout.clusters else [
            layout.where(place, self.addresses) for place in places]
        outcomes = self.amnesia.screen([
            kind.outcome(names[i], reply, len(resources)) for i, reply in enumerate(replies)])
        amnesia = (None if self.amnesia.clear(outcomes)
                   else (yield from self.amnesia.check(outcomes, deadline, places)))
        if amnesia is not None:  # the call may try again: it keeps its place in line
            yield deadline.cap(self.holding.release_calls(
                resources, value, ttl, leave=False, kind=kind, ticket=opening.ticket))
            return amnesia
        # The grants this attempt keeps (a permit's: of the slot most nodes granted;
        # the others are given back at once, §12.2), and what they are grants of.
        granting = {i: replies[i] for i, r in enumerate(outcomes) if r.outcome is Outcome.GRANTED}
        held_kind, kept = kind.granted(granting) if granting else (kind, {})
        stray = held_kind.stray(granting)
        if stray:
            yield deadline.cap(self.holding.release_calls(resources, value, ttl, leave=False,
                                                          nodes=stray, kind=kind))
        if kept and held_kind is not kind:  # (a permit's slot: its own buckets)
            buckets = held_kind.buckets(resources)
        # Per granting node, its counter for each resource (in the set's order).
        granted = {i: acquire_counters(reply) for i, reply in kept.items()}
        if granted:  # the next attempt lifts the nodes that lag behind the highest
            self.floors.raise_to(buckets, max(max(c) for c in granted.values()))
        # Counted under the newest configuration we know (this round's refusals may
        # have taught us one: a stricter rule, never a weaker one, §13.4).
        rule = self.membership.rule
        if rule.met(granted):
            # The token rule, resource by resource (docs/design.md §3).
            choices = {r: choose_token({i: c[j] for i, c in granted.items()})
                       for j, r in enumerate(resources)}
            committed = {r: set(c.committed) for r, c in choices.items()}
            write_backs = [(r, call) for r, c in choices.items()
                           if not rule.met(committed[r])
                           for call in with_epoch(
                               (held_kind.write_back_call(layout.of(i, r), i, r, value, c.token)
                                for i in c.write_back), layout, epoch)]
            if write_backs:
                # Counters diverged: raise the lower ones to the token, but only on
                # nodes that still hold our key (the script checks the value).
                acks = yield Broadcast(tuple(call for _, call in write_backs),
                                       deadline.bound(self.timeout(ttl)),
                                       enough=commit_enough(write_backs, committed, rule))
                rule = self.membership.rule
                for (r, call), ack in zip(write_backs, acks, strict=True):
                    if acked(ack):
                        committed[r].add(call.node)
                for r in {r for r, _ in write_backs}:
                    logger.info("redlock.token_write_back", resource=r, token=choices[r].token,
                                returned_token=len(choices[r].committed),
                                written_back=len(choices[r].write_back),
                                committed=len(committed[r]))
            validity = validity_left(settings, ttl, started, self.clock())
            short = [r for r in resources if not rule.met(committed[r])]
            too_big = [r for r in resources if choices[r].token >= TOKEN_LIMIT]
            if not short and not too_big and validity > 0:
                return AttemptResult(self.held(opening, ttl, started, {
                    r: c.token for r, c in choices.items()}, held_kind, len(granted), value),
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
            yield deadline.cap(self.holding.release_calls(
                resources, value, ttl, leave=False, nodes=maybe_set, kind=kind,
                ticket=opening.ticket))
        rule = self.membership.rule
        healthy = [i for i, r in enumerate(outcomes)
                   if r.outcome in (Outcome.GRANTED, Outcome.REFUSED)]
        relearnt = rule.epoch != epoch  # refused for our epoch: try again at once
        unavailable = not rule.met(healthy) and not relearnt
        if all(isinstance(reply, NodeFailure) and reply.kind is FailureKind.TIMEOUT
               for reply in replies):
            reason += (f"; every node timed out after {request.timeout * 1000:.0f} ms:"
                       + (" node_timeout is too short for this network (leave it unset"
                          " to adapt to the measured round trips)"
                          if settings.node_timeout is not None else
                          " check the network, and connect_timeout if new connections"
                          " are slow"))
        if unavailable and any(r.outcome is Outcome.INCOMPATIBLE for r in outcomes):
            # Nodes a newer release initialised (§4.1) kept the quorum out of reach: no
            # retry can help (acquire() releases the call and leaves its lines).
            raise self.amnesia.incompatible_error(kind.describe(resources), name, outcomes)
        permanent = unavailable and any(
            isinstance(reply, NodeFailure) and reply.permanent for reply in replies)
        logger.debug("redlock.quorum_failed", resource=name, reason=reason,
                     granted=len(granted), needed=rule.needed, nodes=self.n,
                     unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, retry_now=relearnt,
                             reason=reason, next_kind=kind.next_attempt(replies))

    def held(self, opening: Opening, ttl: float, started: float, tokens: dict[str, int],
              kind: Kind, granted: int, value: str) -> LockState:
        """The acquisition of the call's attempt that started at ``started`` and won (``tokens``:
        per resource; ``granted``: by that many nodes), holding that attempt's lock value (§2.1);
        its validity is measured from that start, less the drift (docs/design.md §2.2)."""
        state = LockState(opening.name, value, ttl, max(tokens.values()),
                          started + ttl - self.settings.drift(ttl), self.clock,
                          self.env.new_mutex(), tokens=tokens, kind=kind)
        if logger.isEnabledFor(DEBUG):  # (every acquisition passes here: fields if logged)
            logger.debug("redlock.acquired", resource=opening.name, token=state.token,
                         kind=kind.name, validity_ms=round(state.validity() * 1000, 3),
                         granted=granted, nodes=self.n)
        return state

    def _handed_off(self, heard: Sequence[object], backoff: Backoff, opening: Opening,
                    ttl: float, kind: Kind, attempt: int, attempt_started: float,
                    outcomes: Sequence[NodeResult]) -> Flow[AttemptResult | None]:
        """The lock, if the hand-offs heard while we waited make an acquisition (docs/design.md
        §6.7): our latest ``attempt``'s messages from a quorum, the token committed, validity
        left from that attempt's start. None: the next attempt takes the reservations."""
        if not isinstance(heard, Handoffs) or not heard:
            return None
        deadline = opening.deadline
        # The reservations become a value no attempt sent, so that a late command of the
        # attempt that queued cannot touch them (§2.1); the next attempt, if this comes to
        # nothing, is the one that sends it.
        value = lock_value(opening.secret, attempt + 1)
        refused = {i for i, r in enumerate(outcomes) if r.outcome is Outcome.REFUSED}
        health, membership = self.amnesia.health, self.membership
        counters = counted(heard, attempt, membership.rule.epoch, health.benched(), refused)
        if counters and not enough(counters, membership.rule) and not deadline.passed():
            # Some nodes handed off: the others' messages are on their way (or lost). Each
            # message ends a wait: wait again for the rest, within one request timeout, as
            # long as the nodes yet to be heard could make a quorum.
            until = self.clock() + self.timeout(ttl)
            total, latest = heard.total, heard
            while not enough(counters, membership.rule) and not deadline.passed():
                left = until - self.clock()
                if left <= 0 or not may_still(latest, counters, attempt, health.benched(),
                                              refused, membership.rule):
                    break
                more = yield replace(backoff, seconds=deadline.pause(left), patient=None,
                                     heard_before=total,
                                     wake_at=wake_at(latest, counters, attempt, membership.rule))
                if not isinstance(more, Handoffs) or more.total <= total:
                    break  # nothing new came in time
                total, latest = more.total, more
                counters = counted(more, attempt, membership.rule.epoch, health.benched(), refused)
        rule = membership.rule
        if not enough(counters, rule):
            return None
        [resource] = opening.resources
        self.floors.raise_to(kind.buckets(opening.resources), max(counters.values()))
        choice = choose_token(counters)
        committed = set(choice.committed)
        if not rule.met(committed):
            layout = self.layout
            calls = with_epoch((kind.write_back_call(layout.of(i, resource), i, resource, value,
                                                     choice.token)
                                for i in choice.write_back), layout, rule.epoch)
            write_backs = [(resource, call) for call in calls]
            acks = yield Broadcast(calls, deadline.bound(self.timeout(ttl)),
                                   enough=commit_enough(write_backs, {resource: set(committed)},
                                                        rule))
            rule = membership.rule
            committed |= {call.node for call, ack in zip(calls, acks, strict=True) if acked(ack)}
            logger.info("redlock.token_write_back", resource=resource, token=choice.token,
                        returned_token=len(choice.committed),
                        written_back=len(choice.write_back), committed=len(committed))
        validity = validity_left(self.settings, ttl, attempt_started, self.clock())
        if not rule.met(committed) or choice.token >= TOKEN_LIMIT or validity <= 0:
            logger.debug("redlock.handoff_unused", resource=resource, token=choice.token,
                         committed=len(committed), validity_ms=round(validity * 1000, 3))
            return None
        logger.debug("redlock.handed_off", resource=resource, token=choice.token,
                     heard=len(counters), committed=len(committed))
        state = self.held(opening, ttl, attempt_started, {resource: choice.token}, kind,
                           len(counters), value)
        handed = [NodeResult(self.addresses[i], Outcome.GRANTED, "handed off by a release",
                             counter=counters[i]) if i in counters else result
                  for i, result in enumerate(outcomes)]
        return AttemptResult(state, tuple(handed))

    def repair(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.repair` (and the one below)."""
        return (yield from repair(self.amnesia, force=force))

    def initialise(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.initialise`."""
        return (yield from initialise(self.amnesia, force=force))


# -- when an acquire's rounds are decided (docs/design.md §2.4, §3.2) -------------------


def commit_enough(write_backs: Sequence[tuple[str, Call]], committed: dict[str, set[int]],
                  rule: Rule) -> Decision:
    """The write-back round is decided once every resource's token is committed on a
    quorum of the rule (the nodes that returned it, plus those that acked so far)."""
    def decided(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
        now = {r: set(nodes) for r, nodes in committed.items()}
        for (resource, call), ack in zip(write_backs, replies, strict=True):
            if acked(ack):
                now[resource].add(call.node)
        return all(rule.met(nodes) for nodes in now.values())
    return decided


# The usual attempt's decision (no suspect node, one group of grants), per node count,
# rule and kind of vote: made once, not on every attempt. A few rules are ever in use
# (a new one per membership epoch); should many be, the oldest are dropped together.
_USUAL: dict[tuple[int, Rule, Callable[[object], int | None]], Decision] = {}
_USUAL_KEPT = 32


def grant_enough(n: int, suspect: Mapping[int, object], rule: Rule,
                 votes: Callable[[object], int | None],
                 group: Callable[[object], object] | None = None) -> Decision:
    """An early decision on an attempt's replies (docs/design.md §2.4): ``votes(reply)`` is 1,
    0 or None (unknown). Decided once a quorum said yes, or more said no than a quorum can spare,
    by the membership ``rule`` (§13.2). A ``suspect`` node (restarted, being judged, another
    format; or found so by this request's new connection, §4.4) never votes yes. Yes votes count
    per ``group`` (a permit's slot, §12.2; None: one group). Asked after every reply: kept lean."""
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

    def decided(replies: Sequence[object], identities: Mapping[int, object]) -> bool:
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
    return decided
