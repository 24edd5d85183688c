"""Several resources at once: all or nothing, a token per resource (docs/design.md §11.2).

One acquisition over a set of resources. Each node runs one ACQUIRE_MANY script for
the whole set, atomically: either every resource's key is free (or already ours) and
all are set, each counter raised like a single ACQUIRE does, or the node refuses and
sets nothing. So a node never holds part of a set, nobody holds one resource while
waiting for another (no hold-and-wait, hence no deadlock between overlapping sets),
and the cost is one round trip whatever the size of the set. The quorum, validity,
failure release and backoff are those of one resource (§2, §6); the token rule (§3)
is applied to each resource separately: its token is the highest counter the
granting nodes returned for it, committed (written back where lower, owner-checked)
on a quorum. Keys are those of single locks, so single and multi acquisitions of a
resource exclude each other and share its fence counter.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import tenacity

from redlock import _scripts as scripts
from redlock._algorithm import RedlockCore, _Backoff
from redlock._log import get_logger
from redlock._protocol import Broadcast, Call, CommandArg, Invoke, Protocol, Sleep, T, Wakeable
from redlock._rules import (
    TOKEN_LIMIT,
    choose_token,
    error_detail,
    is_permanent_error,
    validate_resource,
    validate_timeout,
    validity_left,
)
from redlock._scripts import Script
from redlock._state import AcquireResult, AttemptResult, LockState, Status
from redlock._telemetry import observe, observe_watchdog
from redlock.errors import (
    AlreadyHeld,
    LockNotAcquired,
    NodeResult,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    describe,
)

logger = get_logger(__name__)

ACQUIRE_MANY = Script(
    "acquire_many",
    """
-- KEYS[1] node marker; KEYS[2..k+1] lock keys; KEYS[k+2..2k+1] fence keys (same order)
-- ARGV[1] owner value, ARGV[2] ttl in ms, ARGV[3..k+2] token floors (same order)
-- returns {-1, 0}          no node marker: amnesiac node, refuses
--         {0, pttl}        some key is held by another owner: nothing set; pttl = the
--                          longest PTTL among those keys (-1: a key without expiry)
--         {1, c1, ..., ck} every key set (or already ours: TTL refreshed, counter as
--                          is); ci = resource i's fence counter, raised like ACQUIRE
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {-1, 0}
end
local k = (#KEYS - 1) / 2
local blocked, longest = false, -1
for i = 1, k do
    local holder = redis.call('GET', KEYS[1 + i])
    if holder and holder ~= ARGV[1] then
        blocked = true
        local pttl = redis.call('PTTL', KEYS[1 + i])
        if pttl < 0 then
            longest = -1
            break
        end
        if pttl > longest then
            longest = pttl
        end
    end
end
if blocked then
    return {0, longest}
end
local reply = {1}
for i = 1, k do
    local lock, fence = KEYS[1 + i], KEYS[1 + k + i]
    local counter = tonumber(redis.call('GET', fence) or '0')
    if redis.call('GET', lock) == ARGV[1] then
        redis.call('PEXPIRE', lock, ARGV[2])
        reply[#reply + 1] = counter
    else
        redis.call('SET', lock, ARGV[1], 'PX', ARGV[2])
        local target = math.max(counter, tonumber(ARGV[2 + i])) + 1
        reply[#reply + 1] = redis.call('INCRBY', fence, target - counter)
    end
end
return reply
""",
)

EXTEND_MANY = Script(
    "extend_many",
    """
-- KEYS[1..k] lock keys
-- ARGV[1] owner value, ARGV[2] new ttl in ms
-- returns {a1, ..., ak}: ai = 1 when key i was still ours and its TTL was reset, else 0
local acks = {}
for i = 1, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[1] then
        redis.call('PEXPIRE', KEYS[i], ARGV[2])
        acks[i] = 1
    else
        acks[i] = 0
    end
end
return acks
""",
)

RELEASE_MANY = Script(
    "release_many",
    """
-- KEYS[1..k] lock keys, KEYS[k+1..2k] release notification channels (same order)
-- ARGV[1] owner value
-- returns how many of the keys were ours and are now deleted
local k = #KEYS / 2
local deleted = 0
for i = 1, k do
    if redis.call('GET', KEYS[i]) == ARGV[1] then
        redis.call('DEL', KEYS[i])
        redis.pcall('PUBLISH', KEYS[k + i], '1')
        deleted = deleted + 1
    end
end
return deleted
""",
)


def canonical_resources(resources: object) -> tuple[str, ...]:
    """The set, validated, without duplicates, sorted (the order keys are sent in)."""
    if isinstance(resources, str | bytes) or not isinstance(resources, Iterable):
        raise TypeError("resources must be a collection of resource names (str), not"
                        f" {type(resources).__name__}")
    names = tuple(sorted({validate_resource(r) for r in resources}))
    if not names:
        raise ValueError("at least one resource is needed")
    return names


def label(resources: Sequence[str]) -> str:
    """How a set is named in messages and logs."""
    return "[" + ", ".join(repr(r) for r in resources) + "]"


class MultiState(LockState):
    """One acquisition of a set: one owner value, one deadline, a token per resource."""

    def __init__(self, resources: tuple[str, ...], owner: str, ttl: float,
                 tokens: dict[str, int], deadline: float, clock: Callable[[], float]) -> None:
        super().__init__(label(resources), owner, ttl, max(tokens.values()), deadline, clock)
        self.resources = resources
        self.tokens = dict(tokens)


class MultiCore:
    """The protocols for sets of resources, on top of one manager's :class:`RedlockCore`
    (its nodes, settings, floors and amnesia guard)."""

    def __init__(self, core: RedlockCore) -> None:
        self.core = core

    def line(self, resources: Sequence[str]) -> str:
        """The local line of a set: its acquire attempts from one manager take turns."""
        return self.core.keys.channel("\x00".join(resources))

    def _release_calls(self, resources: Sequence[str], owner: str) -> Broadcast:
        keys = self.core.keys
        names = (*(keys.lock(r) for r in resources), *(keys.channel(r) for r in resources))
        return Broadcast(tuple(Call(i, (owner,), RELEASE_MANY, names)
                               for i in range(self.core.n)), self.core.settings.node_timeout)

    # -- acquire ---------------------------------------------------------------

    def acquire(self, resources: tuple[str, ...], ttl: float, *, blocking: bool,
                timeout: float | None) -> Protocol[AcquireResult]:
        core = self.core
        owner = secrets.token_hex(16)
        started = core.clock()
        deadline = None if timeout is None else started + timeout
        backoff: _Backoff | None = None
        attempts = 0
        if not core.amnesia.health.inspected:
            yield from core.amnesia.inspect_nodes()
        while True:
            yield from core.amnesia.repair_due(force=False)
            attempts += 1
            result = yield from self._attempt(resources, owner, ttl)
            if result.retry_now and attempts < 3:
                continue
            if result.state is not None or not blocking or result.permanent:
                return AcquireResult(result.state, result.outcomes, attempts,
                                     result.unavailable, result.reason)
            now = core.clock()
            if backoff is None:
                backoff = _Backoff(tenacity.wait_random_exponential(
                    multiplier=core.settings.retry_delay_min,
                    max=core.settings.retry_delay_max))
            delay = max(core.settings.retry_delay_min, backoff.next_delay(attempts))
            pttls = [r.pttl_ms for r in result.outcomes if r.pttl_ms is not None and r.pttl_ms > 0]
            if pttls:  # a node frees up for us once its longest blocker expires
                delay = min(delay, max(min(pttls) / 1000.0, core.settings.retry_delay_min))
            if deadline is not None:
                if now >= deadline:
                    return AcquireResult(None, result.outcomes, attempts, result.unavailable,
                                         result.reason)
                delay = min(delay, deadline - now)
            yield Sleep(delay, line=self.line(resources))

    def _attempt(self, resources: tuple[str, ...], owner: str,
                 ttl: float) -> Protocol[AttemptResult]:
        core, keys, settings = self.core, self.core.keys, self.core.settings
        k = len(resources)
        ttl_ms = max(1, int(ttl * 1000))
        started = core.clock()
        script_keys = (keys.marker, *(keys.lock(r) for r in resources),
                       *(keys.fence(r) for r in resources))
        args: tuple[CommandArg, ...] = (owner, ttl_ms, *(core.floors.get(r) for r in resources))
        request = Broadcast(tuple(Call(i, args, ACQUIRE_MANY, script_keys)
                                  for i in range(core.n)),
                            settings.node_timeout, line=self.line(resources))
        try:
            replies = yield request
            classified = [_classify_acquire(core.addresses[i], reply, k)
                          for i, reply in enumerate(replies)]
            outcomes = tuple(result for result, _ in classified)
            amnesia = yield from core.amnesia.check(outcomes, started)
            if amnesia is not None:
                yield self._release_calls(resources, owner)
                return amnesia
            granted = {i: counters for i, (_, counters) in enumerate(classified)
                       if counters is not None}
            if len(granted) >= core.quorum:
                tokens, committed, write_backs = {}, {}, []
                for j, resource in enumerate(resources):
                    choice = choose_token({i: counters[j] for i, counters in granted.items()})
                    tokens[resource] = choice.token
                    committed[resource] = len(choice.committed)
                    if committed[resource] < core.quorum:
                        write_backs += [
                            (resource, Call(i, (owner, choice.token), scripts.WRITE_BACK,
                                            (keys.lock(resource), keys.fence(resource),
                                             keys.marker)))
                            for i in choice.write_back]
                if write_backs:
                    acks = yield Broadcast(tuple(call for _, call in write_backs),
                                           settings.node_timeout)
                    for (resource, _), ack in zip(write_backs, acks, strict=True):
                        committed[resource] += int(ack == 1)
                    logger.info("redlock.token_write_back", resource=label(resources),
                                tokens=tokens, committed=committed)
                validity = validity_left(settings, ttl, started, core.clock())
                short = [r for r in resources if committed[r] < core.quorum]
                too_big = [r for r in resources if tokens[r] >= TOKEN_LIMIT]
                if not short and not too_big and validity > 0:
                    for resource, token in tokens.items():
                        core.floors.raise_to(resource, token)
                    state = MultiState(resources, owner, ttl, tokens,
                                       started + ttl - settings.drift(ttl), core.clock)
                    logger.debug("redlock.acquired", resource=label(resources), tokens=tokens,
                                 validity_ms=round(validity * 1000, 3), granted=len(granted),
                                 nodes=core.n)
                    return AttemptResult(state, outcomes)
                if too_big:
                    reason = f"fence counter reached {TOKEN_LIMIT} for {too_big[0]!r}"
                elif short:
                    reason = (f"token of {short[0]!r} committed on {committed[short[0]]}"
                              f" nodes, need {core.quorum}")
                else:
                    reason = "validity ran out during the attempt"
            else:
                reason = (f"{len(granted)} of {core.n} nodes granted all {k} resources,"
                          f" need {core.quorum}")
        except GeneratorExit:
            raise
        except BaseException:
            yield self._release_calls(resources, owner)
            raise
        yield self._release_calls(resources, owner)
        healthy = sum(1 for r in outcomes if r.outcome in (Outcome.GRANTED, Outcome.REFUSED))
        unavailable = healthy < core.quorum
        permanent = unavailable and any(
            isinstance(reply, BaseException) and is_permanent_error(reply) for reply in replies)
        logger.debug("redlock.quorum_failed", resource=label(resources), reason=reason,
                     granted=len(granted), needed=core.quorum, nodes=core.n,
                     unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, reason=reason)

    # -- release / extend --------------------------------------------------------

    def release(self, state: MultiState) -> Protocol[tuple[NodeResult, ...]]:
        with state.mutex:
            if state.status == Status.HELD:
                state.status = Status.RELEASED
        replies = yield self._release_calls(state.resources, state.owner)
        outcomes = tuple(
            NodeResult(self.core.addresses[i], Outcome.ERROR, error_detail(reply))
            if isinstance(reply, BaseException)
            else NodeResult(self.core.addresses[i], Outcome.GRANTED, f"{reply} keys deleted")
            for i, reply in enumerate(replies))
        errors = [r for r in outcomes if r.outcome is Outcome.ERROR]
        if errors:
            logger.warning("redlock.release_incomplete", resource=state.resource,
                           outcomes=describe(errors), expires_within_s=state.ttl)
        else:
            logger.debug("redlock.released", resource=state.resource, tokens=state.tokens)
        return outcomes

    def extend(self, state: MultiState,
               ttl: float) -> Protocol[tuple[NodeResult, ...] | None]:
        """One extend round; None on success (every resource acked by a quorum of nodes
        before the old deadline), else per-node outcomes (REFUSED: a key is gone)."""
        core = self.core
        started = core.clock()
        if state.status != Status.HELD or started >= state.deadline:
            return ()
        ttl_ms = max(1, int(ttl * 1000))
        replies = yield Broadcast(
            tuple(Call(i, (state.owner, ttl_ms), EXTEND_MANY,
                       tuple(core.keys.lock(r) for r in state.resources))
                  for i in range(core.n)),
            min(core.settings.node_timeout, state.deadline - started))
        acks = [0] * len(state.resources)
        outcomes = []
        for i, reply in enumerate(replies):
            node = core.addresses[i]
            if isinstance(reply, BaseException):
                outcomes.append(NodeResult(node, Outcome.ERROR, error_detail(reply)))
                continue
            flags = list(reply) if isinstance(reply, list | tuple) else []
            if len(flags) != len(state.resources):
                outcomes.append(NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}"))
                continue
            for j, flag in enumerate(flags):
                acks[j] += int(flag == 1)
            if all(flag == 1 for flag in flags):
                outcomes.append(NodeResult(node, Outcome.GRANTED))
            else:
                gone = [r for r, flag in zip(state.resources, flags, strict=True) if flag != 1]
                outcomes.append(NodeResult(node, Outcome.REFUSED,
                                           f"our key is gone for {label(gone)}"))
        if min(acks) >= core.quorum and core.clock() < state.deadline:
            with state.mutex:
                if state.status == Status.HELD:
                    state.deadline = started + ttl - core.settings.drift(ttl)
                    state.ttl = ttl
            logger.debug("redlock.extended", resource=state.resource, tokens=state.tokens,
                         ttl_s=ttl)
            return None
        return tuple(outcomes)

    def extend_or_lose(self, state: MultiState, ttl: float) -> Protocol[None]:
        state.check()
        failure = yield from self.extend(state, ttl)
        if failure is None:
            return
        yield from self.lose(state, "extend did not reach a quorum within the remaining"
                             " validity", failure)
        state.check()

    def lose(self, state: MultiState, reason: str,
             outcomes: Sequence[NodeResult]) -> Protocol[bool]:
        first = state.mark_lost(reason, outcomes)
        if first:
            logger.warning("redlock.lost", resource=state.resource, tokens=state.tokens,
                           reason=reason, outcomes=describe(outcomes))
            yield self._release_calls(state.resources, state.owner)
        return first

    def watchdog(self, state: MultiState, stop: Wakeable) -> Protocol[bool]:
        """Like :meth:`RedlockCore.watchdog`, for a set."""
        core = self.core
        while True:
            with state.mutex:
                if state.status != Status.HELD:
                    return state.status == Status.LOST
                interval = state.ttl / 3.0
            yield Sleep(interval, until=stop)
            retry_delay = core.settings.retry_delay_min
            while True:
                if state.status != Status.HELD:
                    return state.status == Status.LOST
                failure = yield from self.extend(state, state.ttl)
                if failure is None:
                    break
                gone = sum(1 for r in failure if r.outcome is Outcome.REFUSED)
                left = state.deadline - core.clock()
                if gone > core.n - core.quorum or left <= 0:
                    reason = ("a majority of nodes no longer hold all our keys" if left > 0
                              else "renewal failed until the validity ran out")
                    return (yield from self.lose(state, reason, failure))
                logger.warning("redlock.extend_retry", resource=state.resource,
                               validity_left_s=round(left, 3), outcomes=describe(failure))
                yield Sleep(min(retry_delay, left), until=stop)
                retry_delay = min(retry_delay * 2, core.settings.retry_delay_max)


def _classify_acquire(node: str, reply: object, k: int) -> tuple[NodeResult, list[int] | None]:
    """ACQUIRE_MANY's reply as an outcome, and the counters when the node granted."""
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, error_detail(reply)), None
    try:
        values = [int(v) for v in reply]  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}"), None
    if values and values[0] == 1 and len(values) == k + 1:
        return NodeResult(node, Outcome.GRANTED, counter=max(values[1:])), values[1:]
    if len(values) == 2 and values[0] == 0:
        return NodeResult(node, Outcome.REFUSED, f"a key is held by another owner,"
                          f" {values[1]} ms left", pttl_ms=values[1]), None
    if len(values) == 2 and values[0] == -1:
        return NodeResult(node, Outcome.AMNESIAC, "no node marker: new, or lost its data"), None
    return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}"), None


class MultiLockBase:
    """A set of resources' lock handle: options, per-owner state, and the flows.

    Like a single lock's handle, it may be shared by threads (sync) or tasks (asyncio):
    each owner that acquires through it gets its own acquisition. Not reentrant.
    """

    def __init__(self, manager: Any, resources: Iterable[str], ttl: float = 10.0, *,
                 blocking: bool = True, timeout: float | None = None,
                 auto_extend: bool = False,
                 on_lost: Callable[[Any], object] | None = None) -> None:
        self._manager = manager
        self._multi: MultiCore = manager._multi_core
        self.resources = canonical_resources(resources)
        self.ttl = manager._core.settings.check_ttl(ttl)
        self.blocking = bool(blocking)
        self.timeout = validate_timeout(timeout)
        self.auto_extend = bool(auto_extend)
        self.on_lost = on_lost
        self.last_failure: LockNotAcquired | None = None
        self._states: dict[Hashable, MultiState] = {}
        self._watchdog_stops: dict[MultiState, Wakeable] = {}
        self._mutex = threading.Lock()

    def _owner_key(self) -> Hashable:
        from redlock._base import _ACTING_FOR  # the same "acting for" as single handles

        acting_for = _ACTING_FOR.get()
        return acting_for if acting_for is not None else self._manager._current_owner()

    @property
    def _label(self) -> str:
        return label(self.resources)

    # -- flows -------------------------------------------------------------------

    def _acquire_flow(self, blocking: bool | None, timeout: float | None) -> Protocol[bool]:
        owner = self._owner_key()
        blocking = self.blocking if blocking is None else bool(blocking)
        timeout = self.timeout if timeout is None else validate_timeout(timeout)
        with self._mutex:
            current = self._states.get(owner)
        if current is not None and current.status == Status.HELD:
            raise AlreadyHeld(f"this owner already holds {self._label} through this handle:"
                              " release it first", resource=self._label)
        result = yield from self._multi.acquire(self.resources, self.ttl, blocking=blocking,
                                                timeout=timeout)
        if result.state is None:
            failure_type = QuorumUnavailable if result.unavailable else LockNotAcquired
            self.last_failure = failure_type(
                f"could not acquire {self._label} after {result.attempts} attempt(s):"
                f" {result.reason}; {describe(result.outcomes)}",
                resource=self._label, outcomes=result.outcomes)
            if result.unavailable:
                raise self.last_failure
            return False
        state = result.state
        assert isinstance(state, MultiState)
        with self._mutex:
            self._states[owner] = state
        if self.auto_extend:
            stop = self._watchdog_stops[state] = self._manager._new_event()
            self._manager._spawn(observe_watchdog(self._manager._telemetry,
                                                  self._watchdog_flow(state, owner, stop),
                                                  self, state),
                                 f"redlock-watchdog:{self._label}")
        return True

    def _observed(self, op: str, protocol: Protocol[T]) -> Protocol[T]:
        """The protocol, wrapped for OpenTelemetry when something records (§11.5)."""
        return observe(self._manager._telemetry, op, protocol, self,
                       self._multi.core.amnesia.health)

    def _release_flow(self) -> Protocol[None]:
        state = self._held()
        stop = self._watchdog_stops.pop(state, None)
        if stop is not None:
            stop.set()
        if state.status != Status.HELD:
            return
        try:
            yield from self._multi.release(state)
        finally:
            lines = self._manager._lines
            lines.notify(self._multi.line(self.resources))
            for resource in self.resources:
                lines.notify(self._multi.core.keys.channel(resource))

    def _extend_flow(self, ttl: float | None) -> Protocol[None]:
        state = self._held()
        ttl = self.ttl if ttl is None else self._multi.core.settings.check_ttl(ttl)
        yield from self._multi.extend_or_lose(state, ttl)

    def _watchdog_flow(self, state: MultiState, owner: Hashable,
                       stop: Wakeable) -> Protocol[None]:
        from redlock._base import _ACTING_FOR

        try:
            lost = yield from self._multi.watchdog(state, stop)
        except Exception:
            logger.exception("redlock.watchdog_crashed", resource=self._label)
            lost = state.mark_lost("the auto-extend watchdog crashed")
        self._watchdog_stops.pop(state, None)
        if not lost or self.on_lost is None:
            return
        acting = _ACTING_FOR.set(owner)
        try:
            yield Invoke(self.on_lost, (self,))
        except Exception:
            logger.exception("redlock.on_lost_failed", resource=self._label)
        finally:
            _ACTING_FOR.reset(acting)

    # -- the caller's own acquisition --------------------------------------------

    def _current(self) -> MultiState | None:
        with self._mutex:
            return self._states.get(self._owner_key())

    def _held(self) -> MultiState:
        state = self._current()
        if state is None:
            raise NotHeld(f"{self._label} is not held by this owner through this handle",
                          resource=self._label)
        return state

    def _entered_failure(self) -> LockNotAcquired:
        return self.last_failure or LockNotAcquired(f"could not acquire {self._label}",
                                                    resource=self._label)

    @property
    def tokens(self) -> dict[str, int]:
        """The fencing token of each resource (raises :class:`LockLost` once lost or
        expired): pass ``tokens[resource]`` to that resource's fenced store."""
        state = self._held()
        state.check()
        return dict(state.tokens)

    @property
    def validity(self) -> float:
        """Seconds of validity left (one deadline for the whole set); 0 when not held."""
        state = self._current()
        return 0.0 if state is None else state.validity()

    @property
    def lost(self) -> bool:
        state = self._current()
        return state is not None and state.status == Status.LOST

    def locked(self) -> bool:
        """True while the caller holds every resource of the set, still valid."""
        return self.validity > 0

    def check(self) -> None:
        """Raise :class:`LockLost` if the set was lost or its validity ran out."""
        self._held().check()

    def __repr__(self) -> str:
        state = self._current()
        status = "unlocked" if state is None else state.status
        return f"<{type(self).__name__} {self._label} ttl={self.ttl:g}s {status}>"
