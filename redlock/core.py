"""The Redlock algorithm with quorum fencing, free of I/O.

Everything that decides anything lives here: quorum, validity, token choice and
commit, retries and backoff, amnesia detection and repair, extend and the
watchdog. The two clients (:mod:`redlock.client` and :mod:`redlock.aio`) are thin
shells: they run the *protocols* below, which are generators that yield I/O
requests and receive their replies (the "sans-IO" shape)::

    request = next(protocol)
    while True:
        reply = <send request.calls to their nodes in parallel> or <sleep>
        request = protocol.send(reply)        # StopIteration carries the result

A :class:`Broadcast` asks the shell to run some calls on some nodes *in
parallel*, each bounded by ``timeout``; the reply is a list, one entry per call,
holding the node's reply or the exception it raised (never raised into the
protocol). A :class:`Sleep` asks it to wait. If the caller is interrupted
(asyncio cancellation, KeyboardInterrupt) the shell throws the exception into
the protocol, which cleans up (releases keys it may have set) and re-raises.

Clock and randomness are injected so the logic can be unit-tested without
monkeypatching.
"""

from __future__ import annotations

import math
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
import tenacity

from redlock import scripts
from redlock.errors import (
    ClusterAmnesiaError,
    LockLost,
    NodeResult,
    NotHeld,
    Outcome,
    describe,
)
from redlock.scripts import Script

logger = structlog.get_logger(__name__)

T = TypeVar("T")

MAX_TOKEN = 2**53  # tokens are Lua numbers on the nodes: exact below 2**53
DEFAULT_MAX_TTL = 3600.0
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")

# ---------------------------------------------------------------------------
# I/O requests the shells execute
# ---------------------------------------------------------------------------

CommandArg = str | bytes | int | float


@dataclass(frozen=True)
class Call:
    """One command for one node: a script (EVALSHA, EVAL on NOSCRIPT) or a plain command."""

    node: int
    args: tuple[CommandArg, ...]
    script: Script | None = None
    keys: tuple[str, ...] = ()


# How long a release's handoff to the longest local waiter holds off other local
# attempts on that resource: long enough for the woken thread or task to be scheduled, short
# enough that a waiter that died or stalls costs the others little.
HANDOFF_GRACE = 0.1


@dataclass(frozen=True)
class Broadcast:
    """Run ``calls`` in parallel; each must answer within ``timeout`` seconds.

    ``one_at_a_time``: broadcasts with the same key from one manager must not overlap.
    Acquire attempts on one resource carry it (the resource's release channel, the
    ``wake_channel`` of its waits): two attempts racing from the same process split the
    nodes between them (each wins some, neither a quorum), and both fail and back off;
    taking turns costs at most one attempt's wait.
    """

    calls: tuple[Call, ...]
    timeout: float
    one_at_a_time: str | None = None


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``. ``wake_channel``: a release channel the shell may wake early on."""

    seconds: float
    wake_channel: str | None = None


Request = Broadcast | Sleep
Replies = Sequence[object]  # per call: the reply, or the exception the node raised
Protocol = Generator[Request, Replies | None, T]


def run_to_completion(protocol: Protocol[T], execute: Callable[[Request], Replies | None]) -> T:
    """Drive a protocol with a blocking ``execute``; used by the sync shell and by tests."""
    request = next(protocol)
    while True:
        try:
            reply = execute(request)
        except BaseException as exc:  # interruption: let the protocol clean up
            request = protocol.throw(exc)
            continue
        try:
            request = protocol.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------
# Validation (bad input fails at the call site with TypeError / ValueError)
# ---------------------------------------------------------------------------


def validate_resource(resource: object) -> str:
    if not isinstance(resource, str):
        raise TypeError(f"resource must be a str, not {type(resource).__name__}")
    if not resource:
        raise ValueError("resource must be a non-empty string")
    return resource


def validate_seconds(name: str, value: object, *, upper: float | None = None) -> float:
    """A finite, positive number of seconds (bool is rejected: True is not a duration)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range: absurd, not a crash
        raise ValueError(f"{name}={value!r} s is larger than any usable duration") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if seconds <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if upper is not None and seconds > upper:
        raise ValueError(f"{name}={value!r} s is larger than the maximum {upper:g} s")
    return seconds


def validate_timeout(timeout: object) -> float | None:
    """``None`` waits without a deadline; 0 means a single attempt."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond float range
        raise ValueError(f"timeout={timeout!r} s is larger than any usable duration") from None
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"timeout must be a finite number >= 0 or None, got {timeout!r}")
    return seconds


def validate_node_addresses(addresses: Sequence[str]) -> None:
    if not addresses:
        raise ValueError("at least one Redis node is needed")
    seen: set[str] = set()
    for address in addresses:
        if address in seen:
            raise ValueError(f"node {address} is listed twice: each node must be independent")
        seen.add(address)


def quorum(node_count: int) -> int:
    """Majority of N: N // 2 + 1."""
    return node_count // 2 + 1


# ---------------------------------------------------------------------------
# Settings and key naming
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Tuning shared by every lock of one :class:`Redlock` instance (all in seconds)."""

    namespace: str = "redlock"
    node_timeout: float = 0.05
    drift_factor: float = 0.01
    drift_constant: float = 0.002
    retry_delay_min: float = 0.005
    retry_delay_max: float = 0.25
    max_ttl: float = DEFAULT_MAX_TTL
    repair_interval: float = 5.0
    repair_timeout: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or not _NAMESPACE_RE.match(self.namespace):
            raise ValueError(
                f"namespace must match {_NAMESPACE_RE.pattern} (no braces or glob characters),"
                f" got {self.namespace!r}"
            )
        for name in ("node_timeout", "retry_delay_min", "retry_delay_max", "max_ttl",
                     "repair_interval", "repair_timeout"):
            validate_seconds(name, getattr(self, name))
        if isinstance(self.drift_factor, bool) or not 0 <= self.drift_factor < 0.5:
            raise ValueError(f"drift_factor must be in [0, 0.5), got {self.drift_factor!r}")
        if self.retry_delay_min > self.retry_delay_max:
            raise ValueError("retry_delay_min must not exceed retry_delay_max")

    def drift(self, ttl: float) -> float:
        """Clock drift allowance: ttl * drift_factor + a constant for timer granularity."""
        return ttl * self.drift_factor + self.drift_constant


@dataclass(frozen=True)
class Keys:
    namespace: str

    def lock(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:lock"

    def fence(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:fence"

    def channel(self, resource: str) -> str:
        return f"{self.namespace}:{{{resource}}}:released"

    @property
    def marker(self) -> str:
        return f"{self.namespace}:node-marker"

    @property
    def repair_guard(self) -> str:
        return f"{self.namespace}:node-repair"

    @property
    def fence_pattern(self) -> str:
        return f"{self.namespace}:{{*}}:fence"


# ---------------------------------------------------------------------------
# Reply interpretation: the one place reply codes become outcomes
# ---------------------------------------------------------------------------


def error_detail(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def is_permanent_error(exc: BaseException) -> bool:
    """Errors that retrying will not fix: credentials, permissions, wrong node type."""
    name = type(exc).__name__
    if name in {"AuthenticationError", "AuthenticationWrongNumberOfArgsError", "NoPermissionError"}:
        return True
    text = str(exc)
    return text.startswith(("NOPERM", "WRONGPASS", "NOAUTH", "READONLY", "MOVED", "CROSSSLOT"))


def classify_acquire_reply(node: str, reply: object) -> NodeResult:
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, error_detail(reply))
    if not isinstance(reply, list | tuple) or len(reply) != 2:
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    try:
        code, value = int(reply[0]), int(reply[1])
    except (TypeError, ValueError):  # a proxy or a foreign script answering: not ours
        return NodeResult(node, Outcome.ERROR, f"unexpected reply {reply!r}")
    if code in (scripts.ACQUIRE_GRANTED, scripts.ACQUIRE_ALREADY_OURS):
        return NodeResult(node, Outcome.GRANTED, counter=value)
    if code == scripts.ACQUIRE_REFUSED:
        return NodeResult(node, Outcome.REFUSED, f"held by another owner, {value} ms left",
                          pttl_ms=value)
    if code == scripts.ACQUIRE_AMNESIAC:
        return NodeResult(node, Outcome.AMNESIAC, "no node marker: new, or lost its data")
    return NodeResult(node, Outcome.ERROR, f"unexpected reply code {code}")


def classify_ack_reply(node: str, reply: object, *, refused: str) -> NodeResult:
    """Replies of the owner-checked scripts (extend, write-back, release): 1 = done."""
    if isinstance(reply, BaseException):
        return NodeResult(node, Outcome.ERROR, error_detail(reply))
    if reply == 1:
        return NodeResult(node, Outcome.GRANTED)
    return NodeResult(node, Outcome.REFUSED, refused)


def unsafe_config(info: object) -> list[str]:
    """What in a node's ``INFO`` reply makes it unsafe for locks (DESIGN.md §3): a replica
    (writes go elsewhere, and a failover can promote a copy that lacks our keys), or a
    memory limit with an eviction policy (lock keys carry a TTL, so even the volatile-*
    policies can evict them; allkeys-* also evicts fence counters). Anything unreadable
    yields no findings: this is advice, not a gate."""
    if isinstance(info, bytes):
        info = info.decode("utf-8", "replace")
    if not isinstance(info, str):
        return []
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    findings = []
    if fields.get("role", "").strip() == "slave":
        findings.append("node is a replica (role:slave): lock writes belong on primaries")
    policy = fields.get("maxmemory_policy", "noeviction").strip()
    if fields.get("maxmemory", "0").strip() not in ("", "0") and policy != "noeviction":
        findings.append(f"maxmemory is set with maxmemory-policy {policy}: Redis may evict"
                        " lock keys or fence counters under memory pressure (use noeviction)")
    return findings


# ---------------------------------------------------------------------------
# Token rule (DESIGN.md §3): pure decisions
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenChoice:
    token: int
    committed: tuple[int, ...]  # nodes known to hold counter >= token under our key
    write_back: tuple[int, ...]  # granting nodes whose counter is lower: need the write-back


def choose_token(counters: dict[int, int]) -> TokenChoice:
    """Token = max over the granting nodes; nodes that returned it are already committed."""
    token = max(counters.values())
    committed = tuple(i for i, c in counters.items() if c == token)
    lower = tuple(i for i, c in counters.items() if c < token)
    return TokenChoice(token, committed, lower)


def validity_left(settings: Settings, ttl: float, started: float, now: float) -> float:
    """ttl - elapsed - drift, measured from the attempt's start on a monotonic clock."""
    return ttl - (now - started) - settings.drift(ttl)


# ---------------------------------------------------------------------------
# Shared mutable state
# ---------------------------------------------------------------------------


class Status:
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


class LockState:
    """One acquisition: shared by the handles that re-entered it and by its watchdog."""

    def __init__(self, resource: str, owner: str, ttl: float, token: int, deadline: float,
                 clock: Callable[[], float]) -> None:
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.token = token
        self.deadline = deadline  # monotonic time when validity runs out
        self.depth = 1  # re-entries by the same owner (reentrant locks)
        self.status = Status.HELD
        self.lost_reason = ""
        self.lost_outcomes: tuple[NodeResult, ...] = ()
        self.mutex = threading.Lock()
        self._clock = clock

    def validity(self) -> float:
        if self.status != Status.HELD:
            return 0.0
        return max(0.0, self.deadline - self._clock())

    def check(self) -> None:
        """Raise unless the lock is held and still valid."""
        if self.status == Status.LOST:
            raise LockLost(f"lock on {self.resource!r} was lost: {self.lost_reason}",
                           resource=self.resource, outcomes=self.lost_outcomes)
        if self.status == Status.RELEASED:
            raise NotHeld(f"lock on {self.resource!r} was released")
        if self._clock() >= self.deadline:
            raise LockLost(f"lock on {self.resource!r} expired: its validity ran out",
                           resource=self.resource)

    def mark_lost(self, reason: str, outcomes: Sequence[NodeResult] = ()) -> bool:
        """Returns True for the caller that made the transition (it fires callbacks)."""
        with self.mutex:
            if self.status != Status.HELD:
                return False
            self.status = Status.LOST
            self.lost_reason = reason
            self.lost_outcomes = tuple(outcomes)
            return True


class NodeHealth:
    """What one Redlock instance has learned about its nodes (thread-safe)."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = tuple(addresses)
        self.marker_seen = False  # this instance has seen an initialised cluster
        self.amnesiac_since: dict[int, float] = {}
        self.last_repair_try: dict[int, float] = {}
        self.inspected = False  # node configurations were read once (see unsafe_config)
        self._floors: OrderedDict[str, int] = OrderedDict()
        self._mutex = threading.Lock()

    _FLOOR_CAPACITY = 4096  # an optimisation only: forgetting a floor is safe

    def floor(self, resource: str) -> int:
        with self._mutex:
            return self._floors.get(resource, 0)

    def raise_floor(self, resource: str, token: int) -> None:
        with self._mutex:
            if token > self._floors.get(resource, 0):
                self._floors[resource] = token
            self._floors.move_to_end(resource)
            while len(self._floors) > self._FLOOR_CAPACITY:
                self._floors.popitem(last=False)

    def note_amnesiac(self, node: int, now: float) -> bool:
        """Record a node seen without its marker; True the first time."""
        with self._mutex:
            if node in self.amnesiac_since:
                return False
            self.amnesiac_since[node] = now
            return True

    def is_amnesiac(self, node: int) -> bool:
        with self._mutex:
            return node in self.amnesiac_since

    def note_healthy(self, node: int) -> None:
        with self._mutex:
            self.amnesiac_since.pop(node, None)

    def due_for_repair(self, now: float, settings: Settings, *, force: bool) -> list[int]:
        with self._mutex:
            due = []
            for node, since in self.amnesiac_since.items():
                waited_enough = force or now - since >= settings.max_ttl
                last = self.last_repair_try.get(node)
                rate_ok = force or last is None or now - last >= settings.repair_interval
                if waited_enough and rate_ok:
                    due.append(node)
                    self.last_repair_try[node] = now
            return due


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptResult:
    state: LockState | None
    outcomes: tuple[NodeResult, ...]
    unavailable: bool = False  # fewer than a quorum of nodes answered healthily
    permanent: bool = False  # ...and retrying cannot help (auth, permissions)
    retry_now: bool = False  # the cluster was just initialised: try again at once
    reason: str = ""


@dataclass(frozen=True)
class AcquireResult:
    state: LockState | None
    outcomes: tuple[NodeResult, ...]
    attempts: int
    unavailable: bool
    reason: str


@dataclass(frozen=True)
class RepairReport:
    node: str
    status: str  # "healthy", "repaired", "waiting", "failed"
    detail: str = ""


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


# ---------------------------------------------------------------------------
# The algorithm
# ---------------------------------------------------------------------------


class RedlockCore:
    """Quorum acquire with fencing, release, extend, watchdog and node repair."""

    def __init__(self, addresses: Sequence[str], settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        validate_node_addresses(addresses)
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.clock = clock
        self.n = len(addresses)
        self.quorum = quorum(self.n)
        self.health = NodeHealth(addresses)
        self._reentrant: dict[tuple[str, Hashable], LockState] = {}
        self._reentrant_mutex = threading.Lock()
        if self.n % 2 == 0:
            logger.warning("redlock.even_node_count", nodes=self.n, quorum=self.quorum,
                           tolerated_failures=self.n - self.quorum,
                           hint="an odd N tolerates as many failures with one node fewer")

    # -- helpers -----------------------------------------------------------

    def check_ttl(self, ttl: object) -> float:
        seconds = validate_seconds("ttl", ttl, upper=self.settings.max_ttl)
        if seconds <= self.settings.drift(seconds):
            raise ValueError(f"ttl={ttl!r} s is not larger than the clock-drift allowance")
        return seconds

    def _all(self, script: Script, keys: tuple[str, ...], args: tuple[CommandArg, ...],
             nodes: Sequence[int] | None = None) -> tuple[Call, ...]:
        targets = range(self.n) if nodes is None else nodes
        return tuple(Call(i, args, script, keys) for i in targets)

    def _release_calls(self, resource: str, owner: str) -> Broadcast:
        keys = (self.keys.lock(resource), self.keys.channel(resource))
        return Broadcast(self._all(scripts.RELEASE, keys, (owner,)), self.settings.node_timeout)

    # -- reentrancy ----------------------------------------------------------

    def reenter(self, resource: str, owner_key: Hashable) -> LockState | None:
        """Re-enter a lock this owner (thread/task) already holds, without any I/O."""
        with self._reentrant_mutex:
            state = self._reentrant.get((resource, owner_key))
            if state is None:
                return None
            if state.status != Status.HELD:
                del self._reentrant[(resource, owner_key)]
                return None
        state.check()  # re-entering a lock whose validity ran out must not pass silently
        with state.mutex:
            state.depth += 1
        return state

    def register_reentrant(self, state: LockState, owner_key: Hashable) -> None:
        with self._reentrant_mutex:
            self._reentrant[(state.resource, owner_key)] = state

    def forget_reentrant(self, state: LockState) -> None:
        with self._reentrant_mutex:
            for key in [k for k, v in self._reentrant.items() if v is state]:
                del self._reentrant[key]

    # -- acquire -------------------------------------------------------------

    def acquire(self, resource: str, ttl: float, *, blocking: bool,
                timeout: float | None) -> Protocol[AcquireResult]:
        """Attempts until success, the deadline, or (non-blocking) after one attempt."""
        owner = secrets.token_hex(16)  # 128 bits, secret: only we can release our key
        started = self.clock()
        deadline = None if timeout is None else started + timeout
        backoff: _Backoff | None = None  # built on the first retry: most acquires need none
        attempts = 0
        if not self.health.inspected:
            yield from self._inspect_nodes()
        while True:
            yield from self._repair_due_nodes(force=False)
            attempts += 1
            result = yield from self._attempt(resource, owner, ttl)
            if result.retry_now and attempts < 3:
                continue
            if result.state is not None or not blocking or result.permanent:
                return AcquireResult(result.state, result.outcomes, attempts,
                                     result.unavailable, result.reason)
            now = self.clock()
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
            yield Sleep(delay, self.keys.channel(resource))

    def _inspect_nodes(self) -> Protocol[None]:
        """Once per client, on its first acquire: read every node's INFO and warn about
        configurations that break the lock's assumptions (DESIGN.md §3). One round, in
        parallel, bounded by the node timeout; a node that does not answer is not asked
        again (its acquire replies say what is wrong with it)."""
        self.health.inspected = True
        replies = yield Broadcast(tuple(Call(i, ("INFO",)) for i in range(self.n)),
                                  self.settings.node_timeout)
        assert replies is not None
        for i, reply in enumerate(replies):
            for finding in unsafe_config(reply):
                logger.warning("redlock.node_unsafe_config", node=self.addresses[i],
                               problem=finding)

    def _attempt(self, resource: str, owner: str, ttl: float) -> Protocol[AttemptResult]:
        settings = self.settings
        lock_key, fence_key = self.keys.lock(resource), self.keys.fence(resource)
        ttl_ms = max(1, int(ttl * 1000))
        started = self.clock()
        request = Broadcast(
            self._all(scripts.ACQUIRE, (lock_key, fence_key, self.keys.marker),
                      (owner, ttl_ms, self.health.floor(resource))),
            settings.node_timeout, one_at_a_time=self.keys.channel(resource))
        try:
            replies = yield request
            assert replies is not None
            outcomes = tuple(classify_acquire_reply(self.addresses[i], reply)
                             for i, reply in enumerate(replies))
            amnesia = yield from self._handle_amnesia(outcomes, started)
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
                    assert acks is not None
                    committed += sum(1 for ack in acks if ack == 1)
                    logger.info("redlock.token_write_back", resource=resource,
                                token=choice.token, returned_token=len(choice.committed),
                                written_back=len(choice.write_back), committed=committed)
                validity = validity_left(settings, ttl, started, self.clock())
                if committed >= self.quorum and validity > 0 and choice.token < MAX_TOKEN:
                    self.health.raise_floor(resource, choice.token)
                    state = LockState(resource, owner, ttl, choice.token,
                                      started + ttl - settings.drift(ttl), self.clock)
                    logger.debug("redlock.acquired", resource=resource, token=choice.token,
                                 validity_ms=round(validity * 1000, 3), granted=len(granted),
                                 nodes=self.n)
                    return AttemptResult(state, outcomes)
                reason = ("validity ran out during the attempt" if validity <= 0 else
                          f"token committed on {committed} nodes, need {self.quorum}")
                if choice.token >= MAX_TOKEN:
                    reason = f"fence counter reached {MAX_TOKEN}"
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
        logger.info("redlock.quorum_failed", resource=resource, reason=reason,
                    granted=len(granted), needed=self.quorum, nodes=self.n,
                    unavailable=unavailable, outcomes=describe(outcomes))
        return AttemptResult(None, outcomes, unavailable, permanent, reason=reason)

    def _handle_amnesia(self, outcomes: Sequence[NodeResult],
                        now: float) -> Protocol[AttemptResult | None]:
        """Fresh-cluster initialisation and amnesia detection (DESIGN.md §3)."""
        amnesiac = [i for i, r in enumerate(outcomes) if r.outcome is Outcome.AMNESIAC]
        with_marker = [i for i, r in enumerate(outcomes)
                       if r.outcome in (Outcome.GRANTED, Outcome.REFUSED)]
        for i in with_marker:
            self.health.note_healthy(i)
        if with_marker:
            self.health.marker_seen = True
        if not amnesiac:
            return None
        if len(amnesiac) == self.n and not self.health.marker_seen:
            # Every node answered and none has a marker: a new cluster. Initialise it.
            marker_value = f"initialised {time.time():.3f} by {secrets.token_hex(8)}"
            yield Broadcast(tuple(Call(i, ("SET", self.keys.marker, marker_value, "NX"))
                                  for i in range(self.n)), self.settings.node_timeout)
            logger.info("redlock.cluster_initialised", nodes=self.n)
            return AttemptResult(None, tuple(outcomes), retry_now=True,
                                 reason="cluster initialised")
        if not with_marker and not self.health.marker_seen:
            # No node we reached has a marker and we never saw one: most likely a new
            # cluster with some node not answering. Only a full view may initialise it
            # (a partial one could be a majority that lost its data), and these nodes
            # are not amnesiac as far as anyone knows: do not bench them.
            silent = self.n - len(amnesiac)
            return AttemptResult(None, tuple(outcomes), unavailable=True, reason=(
                f"new cluster not initialised yet: all {self.n} nodes must answer once,"
                f" {silent} did not"))
        newly_missing = [i for i in amnesiac if not self.health.is_amnesiac(i)]
        if newly_missing:
            # A marker missing beside markers present is most often another client
            # initialising a new cluster right now: its SET NX broadcast is still in
            # flight. Look again once that broadcast must have landed before calling it
            # amnesia (which would bench the node for max_ttl).
            yield Sleep(self.settings.node_timeout)
            probe = yield Broadcast(tuple(Call(i, ("EXISTS", self.keys.marker))
                                          for i in newly_missing), self.settings.node_timeout)
            assert probe is not None
            arrived = [i for i, reply in zip(newly_missing, probe, strict=True) if reply == 1]
            if arrived:
                return AttemptResult(None, tuple(outcomes), retry_now=True,
                                     reason="cluster initialisation in progress")
        if len(amnesiac) >= self.quorum and (with_marker or self.health.marker_seen):
            raise ClusterAmnesiaError(
                f"{len(amnesiac)} of {self.n} nodes lost their node marker at once (restart"
                " without persistence, FLUSHALL or failover to an empty replica): fence tokens"
                " could go backwards, so redlock refuses. Restore the nodes' data, or after"
                " one max_ttl has passed call repair(force=True) once a majority is healthy.",
                outcomes=outcomes)
        for i in amnesiac:
            if self.health.note_amnesiac(i, now):
                logger.warning("redlock.node_amnesiac", node=self.addresses[i],
                               rejoins_after_s=self.settings.max_ttl)
        return None

    # -- release / extend ----------------------------------------------------

    def release(self, state: LockState) -> Protocol[tuple[NodeResult, ...]]:
        """Compare-and-delete on every node; idempotent; never deletes another's key."""
        with state.mutex:
            if state.status == Status.HELD:
                state.status = Status.RELEASED
        self.forget_reentrant(state)
        replies = yield self._release_calls(state.resource, state.owner)
        assert replies is not None
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

    def extend(self, state: LockState, ttl: float) -> Protocol[tuple[NodeResult, ...] | None]:
        """One extend round; returns None on success, else the per-node outcomes."""
        started = self.clock()
        if state.status != Status.HELD or started >= state.deadline:
            return ()
        ttl_ms = max(1, int(ttl * 1000))
        replies = yield Broadcast(
            self._all(scripts.EXTEND, (self.keys.lock(state.resource),), (state.owner, ttl_ms)),
            min(self.settings.node_timeout, state.deadline - started))
        assert replies is not None
        outcomes = tuple(classify_ack_reply(self.addresses[i], reply,
                                            refused="our key is gone (expired or taken)")
                         for i, reply in enumerate(replies))
        acks = sum(1 for r in outcomes if r.outcome is Outcome.GRANTED)
        # Success needs a quorum of acks *before* the old validity ran out.
        if acks >= self.quorum and self.clock() < state.deadline:
            with state.mutex:
                if state.status == Status.HELD:
                    state.deadline = started + ttl - self.settings.drift(ttl)
                    state.ttl = ttl
            logger.debug("redlock.extended", resource=state.resource, token=state.token,
                         acks=acks, ttl_s=ttl)
            return None
        return outcomes

    def extend_or_lose(self, state: LockState, ttl: float) -> Protocol[None]:
        """Explicit extend(): success, or the lock is marked lost, released and LockLost raised."""
        state.check()
        failure = yield from self.extend(state, ttl)
        if failure is None:
            return
        reason = "extend did not reach a quorum within the remaining validity"
        yield from self._lose(state, reason, failure)
        state.check()  # raises LockLost with the reason

    def _lose(self, state: LockState, reason: str,
              outcomes: Sequence[NodeResult]) -> Protocol[bool]:
        first = state.mark_lost(reason, outcomes)
        if first:
            logger.warning("redlock.lost", resource=state.resource, token=state.token,
                           reason=reason, outcomes=describe(outcomes))
            self.forget_reentrant(state)
            # Drop what is left of our keys so the next holder need not wait for the TTL.
            yield self._release_calls(state.resource, state.owner)
        return first

    def watchdog(self, state: LockState) -> Protocol[bool]:
        """Auto-extend at about ttl/3 until released; True if it ended by losing the lock.

        A failed renewal is retried quickly while validity remains; when validity runs
        out (or a majority says our key is gone) the lock is marked lost, so the holder
        learns it: ``check()``/``token`` raise and the shell fires ``on_lost``.
        """
        while True:
            with state.mutex:
                if state.status != Status.HELD:
                    return state.status == Status.LOST
                interval = state.ttl / 3.0
            yield Sleep(interval)
            retry_delay = self.settings.retry_delay_min
            while True:
                if state.status != Status.HELD:
                    return state.status == Status.LOST
                failure = yield from self.extend(state, state.ttl)
                if failure is None:
                    break
                gone = sum(1 for r in failure if r.outcome is Outcome.REFUSED)
                left = state.deadline - self.clock()
                if gone > self.n - self.quorum or left <= 0:
                    reason = ("a majority of nodes no longer hold our key" if left > 0
                              else "renewal failed until the validity ran out")
                    return (yield from self._lose(state, reason, failure))
                logger.warning("redlock.extend_retry", resource=state.resource,
                               validity_left_s=round(left, 3), outcomes=describe(failure))
                yield Sleep(min(retry_delay, left))
                retry_delay = min(retry_delay * 2, self.settings.retry_delay_max)

    # -- amnesia repair ------------------------------------------------------

    def _repair_due_nodes(self, *, force: bool) -> Protocol[list[RepairReport]]:
        if not self.health.amnesiac_since:  # hot path: nothing to do, no lock taken
            return []
        reports = []
        for node in self.health.due_for_repair(self.clock(), self.settings, force=force):
            reports.append((yield from self._repair_node(node)))
        return reports

    def repair(self, *, force: bool) -> Protocol[list[RepairReport]]:
        """Find amnesiac nodes and repair those whose rejoin delay has passed (or all: force)."""
        probe = yield Broadcast(tuple(Call(i, ("EXISTS", self.keys.marker)) for i in range(self.n)),
                                self.settings.repair_timeout)
        assert probe is not None
        now = self.clock()
        reports: dict[int, RepairReport] = {}
        missing = [i for i, reply in enumerate(probe) if reply == 0]
        present = [i for i, reply in enumerate(probe) if reply == 1]
        if present:
            self.health.marker_seen = True
        for i, reply in enumerate(probe):
            if isinstance(reply, BaseException):
                reports[i] = RepairReport(self.addresses[i], "failed", error_detail(reply))
            elif reply == 1:
                self.health.note_healthy(i)
                reports[i] = RepairReport(self.addresses[i], "healthy")
        if missing and not present and not self.health.marker_seen:
            for i in missing:
                reports[i] = RepairReport(self.addresses[i], "healthy", "uninitialised cluster")
            return [reports[i] for i in sorted(reports)]
        for i in missing:
            self.health.note_amnesiac(i, now)
        for report in (yield from self._repair_due_nodes(force=force)):
            reports[self.addresses.index(report.node)] = report
        for i in missing:
            if i not in reports:
                since = self.health.amnesiac_since.get(i, now)
                wait = max(0.0, self.settings.max_ttl - (now - since))
                reports[i] = RepairReport(self.addresses[i], "waiting",
                                          f"rejoins in {wait:.1f} s (one max_ttl after amnesia)")
        return [reports[i] for i in sorted(reports)]

    def _repair_node(self, target: int) -> Protocol[RepairReport]:
        """Re-seed every fence counter on an amnesiac node, then give it its marker back."""
        address = self.addresses[target]
        timeout = self.settings.repair_timeout
        repair_id = secrets.token_hex(8)
        guard, marker = self.keys.repair_guard, self.keys.marker
        ttl_ms = int(timeout * 1000 * 30)
        claimed = yield from self._one(Call(target, ("SET", guard, repair_id, "NX", "PX", ttl_ms)),
                                        timeout)
        if isinstance(claimed, BaseException) or claimed is None:
            detail = error_detail(claimed) if isinstance(claimed, BaseException) else "busy"
            return RepairReport(address, "failed", f"could not claim the repair: {detail}")
        others = [i for i in range(self.n) if i != target]
        probe = yield Broadcast(tuple(Call(i, ("EXISTS", marker)) for i in others), timeout)
        assert probe is not None
        sources = [i for i, reply in zip(others, probe, strict=True) if reply == 1]
        counters: dict[str, int] = {}
        complete = 0
        for source in sources:
            values = yield from self._read_counters(source)
            if values is None:
                continue
            complete += 1
            for key, value in values.items():
                if value > counters.get(key, 0):
                    counters[key] = value
        # Max over a majority of the healthy nodes intersects every committed token's
        # commit set (q - 1 healthy members + q readers > N - 1 healthy nodes).
        if complete < self.quorum:
            yield from self._one(Call(target, ("DEL", guard)), timeout)
            return RepairReport(address, "failed",
                                f"read counters from {complete} healthy nodes, need {self.quorum}")
        items = sorted(counters.items())
        for start in range(0, len(items), 500):
            batch = items[start:start + 500]
            seeded = yield from self._one(Call(
                target, (repair_id, *(value for _, value in batch)), scripts.SEED_COUNTERS,
                (guard, *(key for key, _ in batch))), timeout)
            if seeded != 1:
                return RepairReport(address, "failed", f"seeding interrupted: {seeded!r}")
        marker_value = f"repaired {time.time():.3f} by {repair_id}"
        done = yield from self._one(Call(target, (repair_id, marker_value), scripts.FINISH_REPAIR,
                                         (guard, marker)), timeout)
        if done != 1:
            return RepairReport(address, "failed", f"marker not written: {done!r}")
        self.health.note_healthy(target)
        logger.warning("redlock.node_repaired", node=address, counters_seeded=len(items),
                       sources=complete)
        return RepairReport(address, "repaired", f"{len(items)} fence counters re-seeded")

    @staticmethod
    def _one(call: Call, timeout: float) -> Protocol[object]:
        replies = yield Broadcast((call,), timeout)
        assert replies is not None
        return replies[0]

    def _read_counters(self, node: int) -> Protocol[dict[str, int] | None]:
        cursor: CommandArg = 0
        values: dict[str, int] = {}
        for _ in range(1_000_000):  # bounded: SCAN terminates, this only guards a bug
            page = yield from self._one(Call(node, ("SCAN", cursor, "MATCH",
                                                    self.keys.fence_pattern, "COUNT", 1000)),
                                        self.settings.repair_timeout)
            if isinstance(page, BaseException) or not isinstance(page, list | tuple):
                return None
            cursor, keys = page[0], [_text(k) for k in page[1]]
            if keys:
                got = yield from self._one(Call(node, ("MGET", *keys)),
                                           self.settings.repair_timeout)
                if isinstance(got, BaseException) or not isinstance(got, list | tuple):
                    return None
                for key, value in zip(keys, got, strict=True):
                    if value is not None:
                        values[key] = int(value)
            if int(cursor) == 0:
                return values
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

