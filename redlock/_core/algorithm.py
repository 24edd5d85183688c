"""The Redlock algorithm with quorum fencing, free of I/O (docs/design.md §2-§5).

Everything that decides anything about locks lives here: the acquire attempt, its
quorum, validity and token commit, retries and backoff, release, extend and the
watchdog's renewals. Each operation is a protocol (see :mod:`redlock._core.requests`)
that the sync and asyncio shells drive; node amnesia is delegated to
:class:`redlock._core.amnesia.guard.AmnesiaGuard`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.amnesia.repair import RepairReport, initialise, repair
from redlock._core.environment import Environment
from redlock._core.requests import (
    PENDING,
    Backoff,
    Broadcast,
    Call,
    CommandArg,
    Decision,
    Flow,
    Pause,
    Replies,
)
from redlock._core.rules import (
    TOKEN_LIMIT,
    Keys,
    Settings,
    choose_token,
    classify_ack_reply,
    classify_acquire_reply,
    is_permanent_error,
    label,
    quorum,
    validate_node_addresses,
    validity_left,
    waiter_id,
)
from redlock._core.state import (
    AcquireResult,
    AttemptResult,
    LockState,
    RoundTrips,
    Status,
    TokenFloors,
)
from redlock._core.waiting import Waits, patience
from redlock._observe.log import get_logger
from redlock._observe.outages import NodeOutages
from redlock._scripts import lock as scripts
from redlock._scripts.lock import Script
from redlock._scripts.replies import restarted
from redlock.errors import NodeResult, Outcome, describe

logger = get_logger("redlock.locks")
nodes_logger = get_logger("redlock.nodes")

# The least a holder's release waits for a quorum's answers (see _release_calls).
_RELEASE_FLOOR = 0.25


class RedlockCore:
    """Quorum acquire with fencing, release, extend and the watchdog, for N nodes."""

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
        self.floors = TokenFloors(env.new_mutex())
        self.amnesia = AmnesiaGuard(self.addresses, settings, self.keys, env, self.timeout)
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

    def timeout(self, ttl: float | None = None) -> float:
        """How long a request waits for the nodes: ``node_timeout`` if the user set one,
        else adapted to the measured round trips, within a fifth of ``ttl``."""
        if self.settings.node_timeout is not None:
            return self.settings.node_timeout
        return self.round_trips.timeout(self.quorum, self.settings.request_ceiling(ttl))

    def absorb(self, replies: Replies) -> None:
        """What a broadcast learnt on the way (the drivers call this before its flow goes
        on): round trips measured, servers identified on new connections."""
        for node, seconds in replies.round_trips.items():
            self.round_trips.sample(node, seconds)
        if replies.identities:
            self.amnesia.identified(replies.identities)

    def _enough(self, votes: Callable[[object], int | None]) -> Decision:
        """An early decision on one-call-per-node replies: ``votes(reply)`` is 1 (yes),
        0 (no), None (unknown: an error, or not read yet). Decided once a quorum said
        yes, or more nodes said no than a quorum can spare. A node whose grants do not
        count yet (restarted, being judged; or found restarted by this very request's new
        connection, docs/design.md §4.4) never votes yes."""
        q, n, suspect = self.quorum, self.n, set(self.amnesia.health.suspect)

        def enough(replies: Sequence[object], identities: Mapping[int, object]) -> bool:
            yes = no = 0
            for node, reply in enumerate(replies):
                vote = votes(reply)
                if vote == 1 and node not in suspect and not (
                        node in identities and restarted(identities[node])):
                    yes += 1
                elif vote == 0:
                    no += 1
            return yes >= q or no > n - q
        return enough

    def _all(self, script: Script, keys: tuple[str, ...], args: tuple[CommandArg, ...],
             nodes: Sequence[int] | None = None) -> tuple[Call, ...]:
        targets = range(self.n) if nodes is None else nodes
        return tuple(Call(i, args, script, keys) for i in targets)

    def _release_calls(self, resources: Sequence[str], owner: str, ttl: float | None = None,
                       *, leave: bool = True, nodes: Sequence[int] | None = None,
                       patient: bool = False) -> Broadcast:
        """Compare-and-delete of each resource's key on every node (a set's calls to one
        node go out pipelined), and with ``leave`` the owner's entry in the waiting lines
        is dropped too. Decided once a quorum of the nodes asked answered (see
        :meth:`_settled`); later answers are read in the background."""
        keys = self.keys
        # A failed attempt keeps its place in line for the patience (the ACQUIRE that
        # granted it cut its entry to the key's TTL).
        args: tuple[CommandArg, ...] = (owner, "1") if leave else (
            owner, "0", int(patience(self.settings, self.timeout(ttl)) * 1000))
        calls = tuple(
            Call(i, args, scripts.RELEASE,
                 (keys.lock(r), keys.channel(r), keys.line(r), keys.line_deadlines(r)))
            for i in (range(self.n) if nodes is None else nodes) for r in resources)
        timeout = self.timeout(ttl)
        if patient:
            # A holder's release is decided as soon as a quorum answered; the timeout
            # only bounds it when fewer do. A client thread starved of the GIL (dozens
            # of threads on two cores) or a busy event loop reads healthy nodes' answers
            # late: give them that long before calling them unreachable.
            timeout = max(timeout, min(self.settings.request_ceiling(ttl), _RELEASE_FLOOR))
        return Broadcast(calls, timeout, enough=self._settled(calls))

    def _settled(self, calls: Sequence[Call], *, acks: bool = False) -> Decision:
        """When a release or extend is decided (docs/design.md §2.4, §5.1): once every key
        in it (one acquisition's key of one resource) is settled, i.e. a quorum of the
        nodes asked answered for it (``acks``: acknowledged it, replied 1, as an extend
        needs; or more nodes answered "our key is gone" than a quorum can spare: it
        cannot be extended). The stragglers then get the transport's grace, as long
        again as the decision took; what they answer later is read in the background.
        Until then the request waits for every node, up to its timeout: it never gives
        up on a node that may still answer in time."""
        keys: dict[tuple[object, tuple[str, ...]], list[int]] = {}
        nodes = set()
        for index, call in enumerate(calls):
            nodes.add(call.node)
            keys.setdefault((call.args[0], call.keys), []).append(index)
        per_key = list(keys.values())
        spare, needed = self.n - self.quorum, min(self.quorum, len(nodes))

        def key_settled(indexes: list[int], replies: Sequence[object]) -> bool:
            if not acks:
                return sum(1 for i in indexes if replies[i] is not PENDING) >= needed
            return (sum(1 for i in indexes if replies[i] == 1) >= needed
                    or sum(1 for i in indexes if replies[i] == 0) > spare)

        def settled(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
            return all(key_settled(indexes, replies) for indexes in per_key)
        return settled

    def _per_node(self, replies: Sequence[object], resources: int,
                  refused: str) -> tuple[list[NodeResult], list[int]]:
        """Replies of an owner-checked script sent per node and resource (node-major):
        each node's outcome (GRANTED only if it acked every resource) and, per
        resource, how many nodes acked."""
        outcomes, acks = [], [0] * resources
        for i in range(self.n):
            mine = replies[i * resources:(i + 1) * resources]
            results = [classify_ack_reply(self.addresses[i], reply, refused=refused)
                       for reply in mine]
            for j, result in enumerate(results):
                acks[j] += result.outcome is Outcome.GRANTED
            worst = next((r for r in results if r.outcome is Outcome.ERROR),
                         next((r for r in results if r.outcome is Outcome.REFUSED), results[0]))
            outcomes.append(worst)
        return outcomes, acks

    # -- acquire ---------------------------------------------------------------

    def acquire(self, resources: str | tuple[str, ...], ttl: float, *, blocking: bool,
                timeout: float | None) -> Flow[AcquireResult]:
        """Attempts until success, the deadline, or (non-blocking) after one attempt.

        A blocking acquire also gives up once the cluster has been unavailable (too few
        nodes answering, not contention) for ``outage_timeout``: waiting longer would
        hide an outage from the caller."""
        resources = (resources,) if isinstance(resources, str) else resources
        owner = self.env.random_hex(16)  # 128 bits, secret: only we can release our key
        # A blocking acquire of one resource waits in the nodes' line for it; its ticket
        # (wall-clock microseconds: comparable across hosts, see docs/design.md §6) is
        # its place, the same on every node and every attempt. A single try, or a set,
        # does not queue.
        queued = blocking and timeout != 0 and len(resources) == 1
        ticket = str(int(self.env.wall_clock() * 1_000_000)) if queued else ""
        started = self.clock()
        deadline = None if timeout is None else started + timeout
        outage_limit = self.settings.outage_timeout
        outage_since: float | None = None
        waits = Waits(self.settings, queued=queued)
        attempts = 0
        if not self.amnesia.health.inspected:
            yield from self.amnesia.inspect_nodes()
        while True:
            attempts += 1
            attempt_started = self.clock()
            result = yield from self._attempt(resources, owner, ttl, ticket)
            if result.retry_now and attempts < 3:
                continue
            if result.state is not None or not blocking or result.permanent:
                if result.state is None:
                    yield from self._leave_line(resources, owner, ttl, ticket)
                return AcquireResult(result.state, result.outcomes, attempts,
                                     result.unavailable, result.reason)
            now = self.clock()
            if result.unavailable:
                outage_since = attempt_started if outage_since is None else outage_since
                if outage_limit is not None and now - outage_since >= outage_limit:
                    yield from self._leave_line(resources, owner, ttl, ticket)
                    return AcquireResult(None, result.outcomes, attempts, True,
                                         f"{result.reason}; the cluster has been unavailable"
                                         f" for {now - outage_since:.1f} s (outage_timeout)")
            else:
                outage_since = None
            if deadline is not None and now >= deadline:
                yield from self._leave_line(resources, owner, ttl, ticket)
                return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                     result.reason)
            delay, patient = waits.next(attempts, result.outcomes,
                                        unavailable=result.unavailable,
                                        left=None if deadline is None else deadline - now)
            try:
                yield Backoff(delay, line=self.line(resources),
                              channels=tuple(self.keys.channel(r) for r in resources),
                              waiter=waiter_id(owner) if queued else None, patient=patient)
            except GeneratorExit:
                raise
            except BaseException:  # interrupted (cancelled) while waiting: leave the line
                yield from self._leave_line(resources, owner, ttl, ticket)
                raise

    def _leave_line(self, resources: tuple[str, ...], owner: str, ttl: float,
                    ticket: str) -> Flow[None]:
        """A queued acquire call that ends without the lock drops its entries from the
        waiting lines at once: the next in line need not wait for them to lapse."""
        if ticket:
            yield self._release_calls(resources, owner, ttl, leave=True)

    def line(self, resources: Sequence[str]) -> str:
        """The local line of an acquisition: a resource's release channel (a set has one
        of its own). Attempts in one line from one manager take turns."""
        return self.keys.channel(resources[0] if len(resources) == 1 else "\x00".join(resources))

    def _acquire_calls(self, resources: tuple[str, ...], owner: str, ttl: float,
                       ticket: str) -> tuple[Call, ...]:
        keys, floors, ttl_ms = self.keys, self.floors, max(1, int(ttl * 1000))
        if len(resources) == 1:
            [resource] = resources
            return self._all(scripts.ACQUIRE,
                             (keys.lock(resource), keys.fence(resource), keys.marker,
                              keys.line(resource), keys.line_deadlines(resource)),
                             (owner, ttl_ms, floors.get(resource), ticket,
                              int(patience(self.settings, self.timeout(ttl)) * 1000)))
        return self._all(scripts.ACQUIRE_MANY,
                         (keys.marker, *(keys.lock(r) for r in resources),
                          *(keys.fence(r) for r in resources)),
                         (owner, ttl_ms, *(floors.get(r) for r in resources)))

    def _attempt(self, resources: tuple[str, ...], owner: str, ttl: float,
                 ticket: str) -> Flow[AttemptResult]:
        settings, keys, name = self.settings, self.keys, label(resources)
        started = self.clock()
        request = Broadcast(self._acquire_calls(resources, owner, ttl, ticket),
                            self.timeout(ttl), line=self.line(resources),
                            turns=not ticket, enough=self._enough(_acquire_vote))
        try:
            replies = yield request
            outcomes = self.amnesia.screen([
                classify_acquire_reply(self.addresses[i], reply, len(resources))
                for i, reply in enumerate(replies)])
            amnesia = yield from self.amnesia.check(outcomes, started)
            if amnesia is not None:  # the call may try again: it keeps its place in line
                yield self._release_calls(resources, owner, ttl, leave=False)
                return amnesia
            # Per granting node, its counter for each resource (in the set's order).
            granted = {i: [int(c) for c in replies[i][1:]]  # type: ignore[index]
                       for i, r in enumerate(outcomes) if r.outcome is Outcome.GRANTED}
            if len(granted) >= self.quorum:
                # The token rule, resource by resource (docs/design.md §3).
                choices = {r: choose_token({i: c[j] for i, c in granted.items()})
                           for j, r in enumerate(resources)}
                committed = {r: len(c.committed) for r, c in choices.items()}
                write_backs = [(r, Call(i, (owner, c.token), scripts.WRITE_BACK,
                                        (keys.lock(r), keys.fence(r), keys.marker)))
                               for r, c in choices.items() if committed[r] < self.quorum
                               for i in c.write_back]
                if write_backs:
                    # Counters diverged: raise the lower ones to the token, but only on
                    # nodes that still hold our key (the script checks the owner).
                    acks = yield Broadcast(tuple(call for _, call in write_backs),
                                           self.timeout(ttl),
                                           enough=_commit_enough(write_backs, committed,
                                                                 self.quorum))
                    for (r, _), ack in zip(write_backs, acks, strict=True):
                        committed[r] += int(ack == 1)
                    for r in {r for r, _ in write_backs}:
                        logger.info("redlock.token_write_back", resource=r,
                                    token=choices[r].token,
                                    returned_token=len(choices[r].committed),
                                    written_back=len(choices[r].write_back),
                                    committed=committed[r])
                validity = validity_left(settings, ttl, started, self.clock())
                short = [r for r in resources if committed[r] < self.quorum]
                too_big = [r for r in resources if choices[r].token >= TOKEN_LIMIT]
                if not short and not too_big and validity > 0:
                    tokens = {r: c.token for r, c in choices.items()}
                    for r, token in tokens.items():
                        self.floors.raise_to(r, token)
                    state = LockState(name, owner, ttl, max(tokens.values()),
                                      started + ttl - settings.drift(ttl), self.clock,
                                      self.env.new_mutex(), tokens=tokens)
                    logger.debug("redlock.acquired", resource=name, token=state.token,
                                 validity_ms=round(validity * 1000, 3), granted=len(granted),
                                 nodes=self.n)
                    return AttemptResult(state, outcomes)
                if too_big:
                    reason = f"fence counter reached {TOKEN_LIMIT}"
                elif short:
                    reason = f"token committed on {committed[short[0]]} nodes, need {self.quorum}"
                else:
                    reason = "validity ran out during the attempt"
            else:
                reason = f"{len(granted)} of {self.n} nodes granted, need {self.quorum}"
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted (cancelled) after sending: the SET may have happened anywhere.
            yield self._release_calls(resources, owner, ttl)
            raise
        # Failure: release wherever our key may be, including nodes that timed out (reply
        # lost after SET); not where the script refused (it set nothing). The waiter
        # keeps its place in line: the acquire call may try again.
        maybe_set = [i for i, reply in enumerate(replies) if not _refused(reply)]
        if maybe_set:
            yield self._release_calls(resources, owner, ttl, leave=False, nodes=maybe_set)
        healthy = sum(1 for r in outcomes if r.outcome in (Outcome.GRANTED, Outcome.REFUSED))
        unavailable = healthy < self.quorum
        if all(type(reply).__name__ == "TimeoutError" for reply in replies):
            reason += (f"; every node timed out after {request.timeout * 1000:.0f} ms:"
                       + (" node_timeout is too short for this network (leave it unset"
                          " to adapt to the measured round trips)"
                          if self.settings.node_timeout is not None else
                          " check the network, and connect_timeout if new connections"
                          " are slow"))
        permanent = unavailable and any(
            isinstance(reply, BaseException) and is_permanent_error(reply) for reply in replies)
        logger.debug("redlock.quorum_failed", resource=name, reason=reason,
                     granted=len(granted), needed=self.quorum, nodes=self.n,
                     unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, reason=reason)

    # -- release / extend --------------------------------------------------------

    def release(self, state: LockState) -> Flow[tuple[NodeResult, ...]]:
        """Compare-and-delete on every node; idempotent; never deletes another's key.
        Per node: GRANTED (deleted our key of every resource), REFUSED (some key was
        not ours any more) or ERROR.

        The acquisition counts as released only once the release was sent: if the
        caller is interrupted (cancelled) meanwhile, it is sent again before the
        interruption propagates, as a cancelled acquire does."""
        request = self._release_calls(state.resources, state.owner, state.ttl, patient=True)
        try:
            replies = yield request
        except GeneratorExit:
            raise
        except BaseException:
            yield request
            state.mark_released()
            raise
        state.mark_released()
        outcomes, _ = self._per_node(replies, len(state.resources), refused="key already gone")
        errors = [r for r in outcomes if r.outcome is Outcome.ERROR]
        if errors or self.node_outages:
            # The keys on nodes it missed expire by their TTL; say so (once per node and
            # outage: redlock.release_incomplete) rather than hide it.
            self.node_outages.release(logger, state.resource, state.ttl, outcomes)
        if not errors:
            logger.debug("redlock.released", resource=state.resource, token=state.token)
        return tuple(outcomes)

    def extend_many(self, items: Sequence[tuple[LockState, float]], *, lane: str | None = None,
                    ) -> Flow[list[tuple[NodeResult, ...] | None]]:
        """One extend round for several acquisitions (one request: each node gets its
        calls pipelined). Per acquisition: None on success, else the per-node outcomes.
        Success needs a quorum of acks for every resource before the old validity ran
        out; the new validity is measured from this round's start."""
        started = self.clock()
        live = [(state, ttl) for state, ttl in items
                if state.status == Status.HELD and started < state.deadline]
        results: dict[LockState, tuple[NodeResult, ...] | None] = {}
        if live:
            calls = tuple(
                Call(i, (state.owner, max(1, int(ttl * 1000))), scripts.EXTEND,
                     (self.keys.lock(r),))
                for state, ttl in live for i in range(self.n) for r in state.resources)
            # A round may take up to half the validity left (and at least a request
            # timeout): an answer that comes later than a round trip is still in time
            # while the lock is valid, and a round given up too early is only sent again
            # (a batch of 200 renewals on a busy event loop took longer than the 50 ms a
            # single round trip gave it, again and again, until 33 of 200 locks were
            # lost). Early decisions end it as soon as a quorum answered (§2.4).
            validity_left = min(s.deadline for s, _ in live) - started
            timeout = min(max(self.timeout(max(t for _, t in live)), validity_left / 2),
                          validity_left)
            replies = yield Broadcast(calls, timeout, enough=self._settled(calls, acks=True),
                                      lane=lane)
            finished, offset = self.clock(), 0
            for state, ttl in live:
                size = self.n * len(state.resources)
                outcomes, acks = self._per_node(replies[offset:offset + size],
                                                len(state.resources),
                                                refused="our key is gone (expired or taken)")
                offset += size
                if self.node_outages:
                    self.node_outages.answers(logger, outcomes)
                if min(acks) >= self.quorum and finished < state.deadline and state.renewed(
                        started + ttl - self.settings.drift(ttl), ttl):
                    logger.debug("redlock.extended", resource=state.resource,
                                 token=state.token, acks=min(acks), ttl_s=ttl)
                    results[state] = None
                else:
                    results[state] = tuple(outcomes)
        return [results.get(state, ()) for state, _ in items]

    def extend(self, state: LockState, ttl: float) -> Flow[tuple[NodeResult, ...] | None]:
        """One extend round for one acquisition (see :meth:`extend_many`)."""
        [failure] = yield from self.extend_many([(state, ttl)])
        return failure

    def extend_or_lose(self, state: LockState, ttl: float) -> Flow[None]:
        """Explicit extend(): renewed on a quorum, or the lock is lost (marked, what is left
        of its keys released, LockLost raised with the nodes' answers).

        A round that fails while no majority says our key is gone (timeouts, errors: the
        nodes were slow or briefly unreachable) is tried again, with backoff, as long as
        validity is left, as the renewal loop does: the lock is still ours until then,
        and giving it up would delete a lock we hold because of replies we did not get."""
        state.check()
        delay = 0.0
        answers: tuple[NodeResult, ...] = ()  # the last round's, for the loss report
        while True:
            failure = yield from self.extend(state, ttl)
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
        """More nodes answered that our key is gone than a quorum can spare: no extend
        can succeed any more. Only answers count: an error or a reply not read says
        nothing about our key."""
        return sum(1 for r in outcomes if r.outcome is Outcome.REFUSED) > self.n - self.quorum

    def loss_reason(self, outcomes: Sequence[NodeResult]) -> str:
        """Why a held lock is lost, in the nodes' words."""
        gone = sum(1 for r in outcomes if r.outcome is Outcome.REFUSED)
        if gone > self.n - self.quorum:
            return (f"{gone} of {self.n} nodes answered that our key is gone (it expired,"
                    " or an operator force-released it), more than a quorum can spare")
        return (f"no quorum of the {self.n} nodes renewed it before its validity ran out"
                f" ({gone} answered that our key is gone, the others did not answer in time)")

    def lose(self, state: LockState, reason: str,
             outcomes: Sequence[NodeResult]) -> Flow[bool]:
        """Mark the lock lost and drop what is left of our keys; True the first time."""
        first = state.mark_lost(reason, outcomes)
        if first:
            logger.warning("redlock.lost", resource=state.resource, token=state.token,
                           reason=reason, outcomes=describe(outcomes))
            # Drop what is left of our keys so the next holder need not wait for the TTL.
            yield self._release_calls(state.resources, state.owner, state.ttl)
        return first

    # -- repair ------------------------------------------------------------------

    def repair(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.repair`."""
        return (yield from repair(self.amnesia, force=force))

    def initialise(self, *, force: bool) -> Flow[list[RepairReport]]:
        """See :func:`redlock._core.amnesia.repair.initialise`."""
        return (yield from initialise(self.amnesia, force=force))


def _acquire_vote(reply: object) -> int | None:
    """An ACQUIRE / ACQUIRE_MANY reply as a vote: granted (1), held by another or
    another's turn (0)."""
    if isinstance(reply, list | tuple) and reply:
        code = reply[0]
        if code in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS):
            return 1
        if code in (scripts.ACQUIRE_REFUSED, scripts.ACQUIRE_NOT_YOUR_TURN):
            return 0
    return None


def _refused(reply: object) -> bool:
    """An ACQUIRE / ACQUIRE_MANY reply that set nothing on its node."""
    return isinstance(reply, list | tuple) and bool(reply) and reply[0] in (
        scripts.ACQUIRE_REFUSED, scripts.ACQUIRE_NOT_YOUR_TURN, scripts.ACQUIRE_AMNESIAC)


def _commit_enough(write_backs: Sequence[tuple[str, Call]], committed: dict[str, int],
                   quorum: int) -> Decision:
    """The write-back round is decided once every resource's token is committed on a
    quorum (what the token already had, plus the acks so far)."""
    def enough(replies: Sequence[object], _identities: Mapping[int, object]) -> bool:
        now = dict(committed)
        for (resource, _), ack in zip(write_backs, replies, strict=True):
            now[resource] += ack == 1
        return all(count >= quorum for count in now.values())
    return enough
