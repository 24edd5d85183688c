"""Mutable state shared between threads or tasks: one acquisition."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from redlock import _fork
from redlock._core.environment import Mutex
from redlock._core.kinds import MUTEX, Kind
from redlock._core.requests import TIMEOUT_FLOOR
from redlock.errors import LockLost, NodeResult, NotHeld


def _nobody() -> None:
    return None


class Status(str, enum.Enum):
    """Where one acquisition stands (compares equal to its text: ``"held"``...)."""

    __str__ = str.__str__  # "held", on every Python (not "Status.HELD")

    HELD = "held"
    RELEASED = "released"
    LOST = "lost"
    HANDED_OVER = "handed over"  # exported: another handle (maybe elsewhere) holds it now


class Lease(Protocol):
    """An acquisition's deadline as two processes share it (the holder and its renewer,
    docs/design.md §5.2): each writes its own renewals' deadline, and the acquisition is
    valid until the later of the two, unless the renewer lost it."""

    def read(self, own: float) -> float:
        """The deadline: ``own`` (this process's latest), the other's if later; 0 once
        the renewer lost the acquisition."""
        ...

    def write(self, deadline: float) -> None:
        """This process renewed it until ``deadline``."""
        ...

    def lose(self) -> None:
        """This process lost it (the renewer's word counts; the holder's changes nothing there)."""
        ...


class LockState:
    """One acquisition (of one resource, or of a set: ``tokens`` has one per resource): shared by
    the handles that re-entered it and by the renewal loop. ``resource`` is what it is called in
    messages (the resource's name, or the set's label) and ``token`` its largest token."""

    __slots__ = ("__weakref__", "_clock", "_deadline", "auto_extended", "depth", "generation",
                 "holder", "kind", "lease", "lost_outcomes", "lost_reason", "mutex",
                 "release_called", "resource", "resources", "status", "token", "tokens", "ttl",
                 "value")

    def __init__(self, resource: str, value: str, ttl: float, token: int, deadline: float,
                 clock: Callable[[], float], mutex: Mutex, *,
                 tokens: Mapping[str, int] | None = None, kind: Kind = MUTEX) -> None:
        self.resource = resource
        self.kind = kind  # what is held on the nodes (docs/design.md §12.0)
        self.value = value
        self.ttl = ttl
        self.tokens: dict[str, int] = dict(tokens) if tokens else {resource: token}
        self.resources = tuple(self.tokens)
        self.token = token
        self._deadline = deadline  # monotonic time when validity runs out
        # Renewed by the renewer too: the later of its deadline and ours counts (§5.2).
        self.lease: Lease | None = None
        self.depth = 1  # re-entries by the same owner (reentrant locks)
        self.status = Status.HELD
        self.lost_reason = ""
        self.lost_outcomes: tuple[NodeResult, ...] = ()
        self.release_called = False  # the owner released it (a second release is a no-op)
        # A renewal loop (or the renewer) was given it: its release or export takes it
        # out there (most acquisitions never are, and their releases do not ask).
        self.auto_extended = False
        self.holder: Callable[[], object] = _nobody  # the owner thread or task, weakly
        self.mutex = mutex
        self._clock = clock
        self.generation = _fork.generation  # made in this process, not an ancestor

    @property
    def deadline(self) -> float:
        """When validity runs out (monotonic); while the renewer renews it too, the later
        of its renewals and ours (§5.2)."""
        lease = self.lease
        return self._deadline if lease is None else lease.read(self._deadline)

    @property
    def inherited(self) -> bool:
        """Acquired by an ancestor process before it forked this one: it is that
        process's (its renewal loop renews it there); this process neither renews nor
        releases it, and a thread lock another thread held at the fork may never be
        released here, so ``mutex`` must not be taken (docs/design.md §5.7)."""
        return self.generation != _fork.generation

    def validity(self) -> float:
        if self.status != Status.HELD or self.inherited:
            return 0.0
        return max(0.0, self.deadline - self._clock())

    def check(self) -> None:
        """Raise unless the lock is held and still valid."""
        if self.inherited:
            raise NotHeld(f"{self.kind.describe(self.resources)} was acquired by the parent"
                          " process before it forked this one: it is the parent's",
                          resource=self.resource)
        if self.status == Status.LOST:
            raise LockLost(f"{self.kind.describe(self.resources)} was lost: {self.lost_reason}",
                           resource=self.resource, outcomes=self.lost_outcomes)
        if self.status == Status.RELEASED:
            raise NotHeld(f"{self.kind.describe(self.resources)} was released",
                          resource=self.resource)
        if self.status == Status.HANDED_OVER:
            raise NotHeld(f"{self.kind.describe(self.resources)} was handed over (exported): the"
                          " adopter holds it now", resource=self.resource)
        if self._clock() >= self.deadline:
            raise LockLost(f"{self.kind.describe(self.resources)} expired: its validity ran out",
                           resource=self.resource)

    def expired(self) -> bool:
        """Held, but its validity ran out (or it was lost, or it is an ancestor
        process's): it no longer protects this process."""
        return self.inherited or self.status == Status.LOST or (
            self.status == Status.HELD and self._clock() >= self.deadline)

    def renewed(self, deadline: float, ttl: float) -> bool:
        """Record a successful extend; False if the acquisition ended meanwhile."""
        with self.mutex:
            if self.status != Status.HELD:
                return False
            self._deadline = deadline
            self.ttl = ttl
            lease = self.lease
            if lease is not None:
                lease.write(deadline)
            return True

    def mark_released(self) -> None:
        with self.mutex:
            if self.status == Status.HELD:
                self.status = Status.RELEASED

    def mark_lost(self, reason: str, outcomes: Sequence[NodeResult] = ()) -> bool:
        """Returns True for the caller that made the transition (it fires callbacks)."""
        with self.mutex:
            if self.status != Status.HELD:
                return False
            self.status = Status.LOST
            self.lost_reason = reason
            self.lost_outcomes = tuple(outcomes)
            lease = self.lease
            if lease is not None:
                lease.lose()
            return True


# (Not frozen: one of each is made per acquire, and a frozen dataclass takes three times
# as long to make. Nothing changes one once made.)
@dataclass(slots=True)
class AcquireResult:
    """What an acquire flow ended with: a state, or why not."""

    state: LockState | None
    outcomes: tuple[NodeResult, ...]
    attempts: int
    unavailable: bool  # fewer than a quorum of nodes answered healthily
    reason: str


@dataclass(slots=True)
class AttemptResult:
    """What one acquire attempt ended with."""

    state: LockState | None
    outcomes: tuple[NodeResult, ...]
    unavailable: bool = False  # fewer than a quorum of nodes answered healthily
    permanent: bool = False  # ...and retrying cannot help (auth, permissions)
    retry_now: bool = False  # the cluster was just initialised: try again at once
    reason: str = ""
    next_kind: Kind | None = None  # what the next attempt asks for (a permit's slot)


class RoundTrips:
    """Per node, a smoothed round-trip time and its variation, as TCP keeps them
    (RFC 6298: alpha 1/8, beta 1/4), fed by the transports; the adaptive request
    timeout is read from them (docs/design.md §2.4)."""

    FLOOR = TIMEOUT_FLOOR  # never less: a busy machine's hiccup is not an outage

    def __init__(self, node_count: int, mutex: Mutex) -> None:
        self._srtt: list[float | None] = [None] * node_count
        self._rttvar = [0.0] * node_count
        self._measured = 0
        # The measured nodes' estimates, fastest first: remade by each sample (under the
        # lock, and replaced whole), read by timeout() on every request without one.
        self._ranked: list[float] = []
        self._estimates: list[float | None] = [None] * node_count  # SRTT + 4 RTTVAR
        self._mutex = mutex

    def after_fork(self, mutex: Mutex) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def sample_many(self, measured: Mapping[int, float]) -> None:
        """Round trips measured by one request: node -> seconds."""
        srtts, rttvars, estimates = self._srtt, self._rttvar, self._estimates
        if self._measured == len(estimates):
            # Every node measured (nearly always: on every request): without the lock.
            # Threads that sample one node at once may lose one of their samples, which
            # an estimate can spare; the ranking is replaced whole.
            for node, seconds in measured.items():
                srtt = srtts[node]
                rttvar = 0.75 * rttvars[node] + 0.25 * abs(srtt - seconds)  # type: ignore[operator]
                srtt = 0.875 * srtt + 0.125 * seconds  # type: ignore[operator]
                srtts[node], rttvars[node] = srtt, rttvar
                estimates[node] = srtt + 4 * rttvar
            self._ranked = sorted(estimates)  # type: ignore[arg-type]
            return
        with self._mutex:  # (the nodes not measured yet: counted once each)
            for node, seconds in measured.items():
                srtt = srtts[node]
                first = srtt is None
                if srtt is None:
                    srtt, rttvar = seconds, seconds / 2
                else:
                    rttvar = 0.75 * rttvars[node] + 0.25 * abs(srtt - seconds)
                    srtt = 0.875 * srtt + 0.125 * seconds
                srtts[node], rttvars[node] = srtt, rttvar
                estimates[node] = srtt + 4 * rttvar
                if first:  # (counted once its estimate is there: see above)
                    self._measured += 1
            self._ranked = sorted(e for e in estimates if e is not None)

    def measured(self) -> int:
        """How many nodes have a round trip measured."""
        return self._measured  # (asked on every attempt: counted as nodes are measured)

    def estimate(self, node: int) -> float | None:
        """The node's retransmission-timeout estimate, SRTT + 4 RTTVAR (None: unknown)."""
        with self._mutex:
            return self._estimates[node]

    def timeout(self, quorum: int, ceiling: float) -> float:
        """Time enough for a quorum to answer: twice the estimate of the quorum-th
        fastest node, at least FLOOR, at most ``ceiling`` (until a quorum of nodes has
        been measured: ``ceiling``)."""
        known = self._ranked  # (on every request: no lock, no pass)
        if len(known) < quorum:
            return ceiling
        return min(ceiling, max(self.FLOOR, 2 * known[quorum - 1]))
