"""The Redlock algorithm with quorum fencing, free of I/O (docs/design.md §2-§5).

Everything that decides anything about locks lives here: the acquire attempt, its
quorum, validity and token commit, retries and backoff, release, extend and the
watchdog's renewals. Each operation is a protocol (see :mod:`redlock._protocol`)
that the sync and asyncio shells drive; node amnesia is delegated to
:class:`redlock._amnesia.AmnesiaGuard`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tenacity

from redlock import _scripts as scripts
from redlock._amnesia import AmnesiaGuard, RepairReport
from redlock._log import get_logger
from redlock._protocol import Broadcast, Call, CommandArg, Protocol, Sleep
from redlock._rules import (
    TOKEN_LIMIT,
    Keys,
    Settings,
    choose_token,
    classify_ack_reply,
    classify_acquire_reply,
    is_permanent_error,
    quorum,
    validate_node_addresses,
    validity_left,
)
from redlock._scripts import Script
from redlock._state import AcquireResult, AttemptResult, LockState, Status, TokenFloors
from redlock.errors import NodeResult, Outcome, describe

logger = get_logger(__name__)


@dataclass
class _Backoff:
    """Jittered exponential backoff between attempts, computed by tenacity's strategy."""

    wait: tenacity.wait.wait_base
    state: tenacity.RetryCallState = field(init=False)

    def __post_init__(self) -> None:
        self.state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})

    def next_delay(self, attempt: int) -> float:
        self.state.attempt_number = attempt
        return float(self.wait(self.state))


class RedlockCore:
    """Quorum acquire with fencing, release, extend and the watchdog, for N nodes."""

    def __init__(self, addresses: Sequence[str], settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        validate_node_addresses(addresses)
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.clock = clock
        self.n = len(addresses)
        self.quorum = quorum(self.n)
        self.floors = TokenFloors()
        self.amnesia = AmnesiaGuard(self.addresses, settings, self.keys, clock)
        if self.n % 2 == 0:
            logger.warning("redlock.even_node_count", nodes=self.n, quorum=self.quorum,
                           tolerated_failures=self.n - self.quorum,
                           hint="an odd N tolerates as many failures with one node fewer")

    def _all(self, script: Script, keys: tuple[str, ...], args: tuple[CommandArg, ...],
             nodes: Sequence[int] | None = None) -> tuple[Call, ...]:
        targets = range(self.n) if nodes is None else nodes
        return tuple(Call(i, args, script, keys) for i in targets)

    def _release_calls(self, resource: str, owner: str) -> Broadcast:
        keys = (self.keys.lock(resource), self.keys.channel(resource))
        return Broadcast(self._all(scripts.RELEASE, keys, (owner,)), self.settings.node_timeout)

    # -- acquire ---------------------------------------------------------------

    def acquire(self, resource: str, ttl: float, *, blocking: bool,
                timeout: float | None) -> Protocol[AcquireResult]:
        """Attempts until success, the deadline, or (non-blocking) after one attempt.

        A blocking acquire also gives up once the cluster has been unavailable (too few
        nodes answering, not contention) for ``outage_timeout``: waiting longer would
        hide an outage from the caller."""
        owner = secrets.token_hex(16)  # 128 bits, secret: only we can release our key
        started = self.clock()
        deadline = None if timeout is None else started + timeout
        outage_limit = self.settings.outage_timeout
        outage_since: float | None = None
        backoff: _Backoff | None = None  # built on the first retry: most acquires need none
        attempts = 0
        if not self.amnesia.health.inspected:
            yield from self.amnesia.inspect_nodes()
        while True:
            yield from self.amnesia.repair_due(force=False)
            attempts += 1
            attempt_started = self.clock()
            result = yield from self._attempt(resource, owner, ttl)
            if result.retry_now and attempts < 3:
                continue
            if result.state is not None or not blocking or result.permanent:
                return AcquireResult(result.state, result.outcomes, attempts,
                                     result.unavailable, result.reason)
            now = self.clock()
            if result.unavailable:
                outage_since = attempt_started if outage_since is None else outage_since
                if outage_limit is not None and now - outage_since >= outage_limit:
                    return AcquireResult(None, result.outcomes, attempts, True,
                                         f"{result.reason}; the cluster has been unavailable"
                                         f" for {now - outage_since:.1f} s (outage_timeout)")
            else:
                outage_since = None
            if backoff is None:
                backoff = _Backoff(tenacity.wait_random_exponential(
                    multiplier=self.settings.retry_delay_min, max=self.settings.retry_delay_max))
            # tenacity's full jitter draws from [0, cap]; retry_delay_min is the floor its
            # name promises (a near-zero wait only hammers the nodes the holder still owns).
            delay = max(self.settings.retry_delay_min, backoff.next_delay(attempts))
            # The holder's key cannot free itself before its PTTL: no point polling faster
            # than that, but never sleep past it either.
            pttls = [r.pttl_ms for r in result.outcomes if r.pttl_ms is not None and r.pttl_ms > 0]
            if pttls:
                delay = min(delay, max(min(pttls) / 1000.0, self.settings.retry_delay_min))
            if deadline is not None:
                if now >= deadline:
                    return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                         result.reason)
                delay = min(delay, deadline - now)
            yield Sleep(delay, line=self.keys.channel(resource))

    def _attempt(self, resource: str, owner: str, ttl: float) -> Protocol[AttemptResult]:
        settings = self.settings
        lock_key, fence_key = self.keys.lock(resource), self.keys.fence(resource)
        ttl_ms = max(1, int(ttl * 1000))
        started = self.clock()
        request = Broadcast(
            self._all(scripts.ACQUIRE, (lock_key, fence_key, self.keys.marker),
                      (owner, ttl_ms, self.floors.get(resource))),
            settings.node_timeout, line=self.keys.channel(resource))
        try:
            replies = yield request
            outcomes = tuple(classify_acquire_reply(self.addresses[i], reply)
                             for i, reply in enumerate(replies))
            amnesia = yield from self.amnesia.check(outcomes, started)
            if amnesia is not None:
                yield self._release_calls(resource, owner)
                return amnesia
            granted = {i: r.counter for i, r in enumerate(outcomes)
                       if r.outcome is Outcome.GRANTED and r.counter is not None}
            if len(granted) >= self.quorum:
                choice = choose_token(granted)
                committed = len(choice.committed)
                if committed < self.quorum and choice.write_back:
                    # Counters diverged: raise the lower ones to the token, but only on
                    # nodes that still hold our key (the script checks the owner).
                    acks = yield Broadcast(
                        self._all(scripts.WRITE_BACK, (lock_key, fence_key, self.keys.marker),
                                  (owner, choice.token), choice.write_back),
                        settings.node_timeout)
                    committed += sum(1 for ack in acks if ack == 1)
                    logger.info("redlock.token_write_back", resource=resource,
                                token=choice.token, returned_token=len(choice.committed),
                                written_back=len(choice.write_back), committed=committed)
                validity = validity_left(settings, ttl, started, self.clock())
                if committed >= self.quorum and validity > 0 and choice.token < TOKEN_LIMIT:
                    self.floors.raise_to(resource, choice.token)
                    state = LockState(resource, owner, ttl, choice.token,
                                      started + ttl - settings.drift(ttl), self.clock)
                    logger.debug("redlock.acquired", resource=resource, token=choice.token,
                                 validity_ms=round(validity * 1000, 3), granted=len(granted),
                                 nodes=self.n)
                    return AttemptResult(state, outcomes)
                reason = ("validity ran out during the attempt" if validity <= 0 else
                          f"token committed on {committed} nodes, need {self.quorum}")
                if choice.token >= TOKEN_LIMIT:
                    reason = f"fence counter reached {TOKEN_LIMIT}"
            else:
                reason = f"{len(granted)} of {self.n} nodes granted, need {self.quorum}"
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted (cancelled) after sending: the SET may have happened anywhere.
            yield self._release_calls(resource, owner)
            raise
        # Failure: release everywhere, including nodes that timed out (reply lost after SET).
        yield self._release_calls(resource, owner)
        healthy = sum(1 for r in outcomes if r.outcome in (Outcome.GRANTED, Outcome.REFUSED))
        unavailable = healthy < self.quorum
        permanent = unavailable and any(
            isinstance(reply, BaseException) and is_permanent_error(reply) for reply in replies)
        logger.debug("redlock.quorum_failed", resource=resource, reason=reason,
                     granted=len(granted), needed=self.quorum, nodes=self.n,
                     unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, reason=reason)

    # -- release / extend --------------------------------------------------------

    def release(self, state: LockState) -> Protocol[tuple[NodeResult, ...]]:
        """Compare-and-delete on every node; idempotent; never deletes another's key.

        The acquisition counts as released only once the release was sent: if the
        caller is interrupted (cancelled) meanwhile, it is sent again before the
        interruption propagates, as a cancelled acquire does."""
        request = self._release_calls(state.resource, state.owner)
        try:
            replies = yield request
        except GeneratorExit:
            raise
        except BaseException:
            yield request
            state.mark_released()
            raise
        state.mark_released()
        outcomes = tuple(classify_ack_reply(self.addresses[i], reply, refused="key already gone")
                         for i, reply in enumerate(replies))
        errors = [r for r in outcomes if r.outcome is Outcome.ERROR]
        if errors:
            # The keys on those nodes expire by their TTL; say so rather than hide it.
            logger.warning("redlock.release_incomplete", resource=state.resource,
                           outcomes=describe(errors), expires_within_s=state.ttl)
        else:
            logger.debug("redlock.released", resource=state.resource, token=state.token)
        return outcomes

    def extend_many(self, items: Sequence[tuple[LockState, float]],
                    ) -> Protocol[list[tuple[NodeResult, ...] | None]]:
        """One extend round for several acquisitions (one request: each node gets its
        calls pipelined). Per acquisition: None on success, else the per-node outcomes.
        Success needs a quorum of acks before the old validity ran out; the new
        validity is measured from this round's start."""
        started = self.clock()
        live = [(state, ttl) for state, ttl in items
                if state.status == Status.HELD and started < state.deadline]
        results: dict[LockState, tuple[NodeResult, ...] | None] = {}
        if live:
            calls = tuple(call for state, ttl in live for call in self._all(
                scripts.EXTEND, (self.keys.lock(state.resource),),
                (state.owner, max(1, int(ttl * 1000)))))
            replies = yield Broadcast(calls, min(self.settings.node_timeout,
                                                 min(s.deadline for s, _ in live) - started))
            finished = self.clock()
            for k, (state, ttl) in enumerate(live):
                outcomes = tuple(classify_ack_reply(self.addresses[i], reply,
                                                    refused="our key is gone (expired or taken)")
                                 for i, reply in enumerate(replies[k * self.n:(k + 1) * self.n]))
                acks = sum(1 for r in outcomes if r.outcome is Outcome.GRANTED)
                if acks >= self.quorum and finished < state.deadline and state.renewed(
                        started + ttl - self.settings.drift(ttl), ttl):
                    logger.debug("redlock.extended", resource=state.resource,
                                 token=state.token, acks=acks, ttl_s=ttl)
                    results[state] = None
                else:
                    results[state] = outcomes
        return [results.get(state, ()) for state, _ in items]

    def extend(self, state: LockState, ttl: float) -> Protocol[tuple[NodeResult, ...] | None]:
        """One extend round for one acquisition (see :meth:`extend_many`)."""
        [failure] = yield from self.extend_many([(state, ttl)])
        return failure

    def extend_or_lose(self, state: LockState, ttl: float) -> Protocol[None]:
        """Explicit extend(): success, or the lock is marked lost, released and LockLost raised."""
        state.check()
        failure = yield from self.extend(state, ttl)
        if failure is None:
            return
        reason = "extend did not reach a quorum within the remaining validity"
        yield from self.lose(state, reason, failure)
        state.check()  # raises LockLost with the reason

    def lose(self, state: LockState, reason: str,
             outcomes: Sequence[NodeResult]) -> Protocol[bool]:
        """Mark the lock lost and drop what is left of our keys; True the first time."""
        first = state.mark_lost(reason, outcomes)
        if first:
            logger.warning("redlock.lost", resource=state.resource, token=state.token,
                           reason=reason, outcomes=describe(outcomes))
            # Drop what is left of our keys so the next holder need not wait for the TTL.
            yield self._release_calls(state.resource, state.owner)
        return first

    # -- repair ------------------------------------------------------------------

    def repair(self, *, force: bool) -> Protocol[list[RepairReport]]:
        """See :meth:`redlock._amnesia.AmnesiaGuard.repair`."""
        return (yield from self.amnesia.repair(force=force))
