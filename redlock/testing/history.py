"""A history recorder and checker for tests of locks, the lock family and fenced
stores: the library's own fault tests use it, and so can yours (the pytest plugin's
``redlock_history`` fixture gives each test a fresh :class:`History`).

    history = redlock_history
    with election.campaign() as lead:
        start = time.monotonic()
        ...
        history.held(Hold("me", "cron", lead.token, start, time.monotonic()))
    assert history.violations(exclusive=True) == []

A run records, with ``time.monotonic`` times (CLOCK_MONOTONIC: one clock for every
process on the machine), fenced writes (:class:`Write`: invoked, completed, outcome)
and, for lock runs, committed acquisitions as hold intervals (:class:`Hold`: from the
acquire's completion to the release's invocation, cut at the lock's validity deadline).

Checks, per resource:

* accepted writes never go backwards: when accepted write A completed before accepted
  write B was invoked, A.token <= B.token (otherwise B, with a lower token, overwrote
  A: A's update is *lost*) -- :func:`check` for the fenced stores, where equal tokens
  are legitimate, and :meth:`History.violations` for lock runs, where an equal token
  must also come from the same holder (one holder writing again);
* every rejection was deserved (:func:`check`): the highest token the store reported
  is larger than the offered one and was offered by an accepted write invoked before
  the rejection completed; and the final state is the highest accepted write;
* no two committed acquisitions share a token, and an acquisition invoked after another
  one completed has a larger token (:meth:`History.violations`);
* optionally (runs without clock or pause faults): no two hold intervals overlap.

The lock family (docs/design.md §12) records holds with a ``mode``: a leadership is a
lock (one leader per term, terms increasing: the checks above); a permit is a hold of
its slot's name (``sem:permit:3``), exclusive per slot, and :meth:`History.most_at_once`
counts permits held at once; a read-write lock's holds are ``"r"`` or ``"w"``
(:meth:`History.rw_violations`: a write overlaps nothing, write tokens increase, a read's
token is at least every earlier write's and below every later write's)."""

from __future__ import annotations

import bisect
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

ACCEPTED = "accepted"
REJECTED = "rejected"
ERROR = "error"  # the write ended without a verdict


@dataclass(frozen=True)
class Write:
    """One fenced write."""

    writer: str
    resource: str
    token: int
    start: float  # invoked
    end: float  # completed
    outcome: str  # ACCEPTED, REJECTED or ERROR
    value: str = ""
    highest: int | None = None  # the store's highest token, reported by StaleTokenError
    detail: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> Write:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class Hold:
    """One committed acquisition."""

    client: str
    resource: str
    token: int
    start: float  # the acquire completed
    end: float  # released, lost, or its validity ran out (whichever came first)
    invoked: float | None = None  # the acquire was invoked (None: same as start)
    mode: str = ""  # a read-write lock's "r" or "w"; "" for every other kind


Top = tuple[int, frozenset[str]]  # a token and the writers accepted with it
NOTHING_BEFORE: Top = (-1, frozenset())


def highest_accepted_before(accepted: Sequence[Write]) -> Callable[[Write], Top]:
    """For writes of one resource: a function giving, for any write W, the highest token
    among the ``accepted`` writes that completed before W was invoked, and the writers
    that were accepted with that token."""
    done = sorted(accepted, key=lambda w: w.end)
    ends = [w.end for w in done]
    tops: list[Top] = []
    top, writers = NOTHING_BEFORE
    for write in done:
        if write.token > top:
            top, writers = write.token, frozenset({write.writer})
        elif write.token == top:
            writers = writers | {write.writer}
        tops.append((top, writers))

    def before(write: Write) -> Top:
        index = bisect.bisect_left(ends, write.start)
        return tops[index - 1] if index else NOTHING_BEFORE

    return before


def _holds_by_resource(holds: Iterable[Hold]) -> dict[str, list[Hold]]:
    grouped: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        grouped[hold.resource].append(hold)
    return grouped


def _by_resource(writes: Iterable[Write]) -> dict[str, list[Write]]:
    grouped: dict[str, list[Write]] = defaultdict(list)
    for write in writes:
        grouped[write.resource].append(write)
    return grouped


# ---------------------------------------------------------------------------
# Lock runs: holds and the writes their holders made
# ---------------------------------------------------------------------------


class History:
    """Thread-safe log of one lock run."""

    def __init__(self) -> None:
        self.holds: list[Hold] = []
        self.writes: list[Write] = []
        self._mutex = threading.Lock()

    def held(self, hold: Hold) -> None:
        with self._mutex:
            self.holds.append(hold)

    def wrote(self, write: Write) -> None:
        with self._mutex:
            self.writes.append(write)

    def count(self, outcome: str) -> int:
        return sum(1 for w in self.writes if w.outcome == outcome)

    def duplicate_tokens(self) -> list[str]:
        seen: dict[tuple[str, int], Hold] = {}
        problems = []
        for hold in self.holds:
            key = (hold.resource, hold.token)
            if key in seen:
                problems.append(f"token {hold.token} of {hold.resource} committed twice: "
                                f"{seen[key]} and {hold}")
            seen[key] = hold
        return problems

    def tokens_out_of_order(self) -> list[str]:
        """Holds whose token is not above every token of the same resource acquired
        before the hold's acquire was invoked (per resource, by start: O(n log n))."""
        problems = []
        for holds in _holds_by_resource(self.holds).values():
            ordered = sorted(holds, key=lambda h: h.start)
            starts = [h.start for h in ordered]
            highest: list[Hold] = []  # highest[i]: the hold of the top token in ordered[:i+1]
            for hold in ordered:
                highest.append(hold if not highest or hold.token > highest[-1].token
                               else highest[-1])
            for later in ordered:
                invoked = later.start if later.invoked is None else later.invoked
                index = bisect.bisect_left(starts, invoked)
                if index and highest[index - 1].token >= later.token:
                    problems.append(f"{later.resource}: token {later.token} acquired after "
                                    f"token {highest[index - 1].token} was")
        return problems

    def writes_out_of_order(self) -> list[str]:
        """Accepted writes that went backwards, or reused another holder's token."""
        problems = []
        for resource, writes in _by_resource(self.writes).items():
            accepted = [w for w in writes if w.outcome == ACCEPTED]
            before = highest_accepted_before(accepted)
            for write in accepted:
                top, writers = before(write)
                if top > write.token or (top == write.token and writers - {write.writer}):
                    problems.append(f"{resource}: write with token {write.token} "
                                    f"accepted after one with {top}")
        return problems

    def overlaps(self) -> list[tuple[Hold, Hold]]:
        """Holds of one resource that overlap in time: each hold with the one that ends
        last among those that started before it, when that one ends after it starts
        (per resource, by start: O(n log n))."""
        pairs = []
        for holds in _holds_by_resource(self.holds).values():
            latest: Hold | None = None  # of the holds so far, the one that ends last
            for hold in sorted(holds, key=lambda h: h.start):
                if latest is not None and hold.start < latest.end:
                    pairs.append((latest, hold))
                if latest is None or hold.end > latest.end:
                    latest = hold
        return pairs

    def most_at_once(self, prefix: str = "") -> int:
        """The most holds of resources starting with ``prefix`` that were held at one
        moment (a semaphore's permits: its slots' names share a prefix)."""
        events = sorted([(h.start, 1) for h in self.holds if h.resource.startswith(prefix)]
                        + [(h.end, -1) for h in self.holds if h.resource.startswith(prefix)],
                        key=lambda e: (e[0], e[1]))  # an end before a start at one instant
        most = now = 0
        for _, step in events:
            now += step
            most = max(most, now)
        return most

    def rw_violations(self, resource: str) -> list[str]:
        """A read-write lock's rules (docs/design.md §12.3), on holds cut at validity:
        no write overlaps another hold; write tokens are distinct and increase; a read's
        token is at least every write committed before the read was invoked, and below
        every write invoked after the read ended."""
        holds = [h for h in self.holds if h.resource == resource]
        writes = [h for h in holds if h.mode == "w"]
        reads = [h for h in holds if h.mode == "r"]
        problems = []
        for w in writes:
            for other in holds:
                if other is not w and other.start < w.end and w.start < other.end:
                    problems.append(f"write {w} overlaps {other}")
        seen: dict[int, Hold] = {}
        for w in writes:
            if w.token in seen:
                problems.append(f"write token {w.token} twice: {seen[w.token]} and {w}")
            seen[w.token] = w
        for later in writes:
            invoked = later.start if later.invoked is None else later.invoked
            problems += [f"write token {later.token} acquired after write token {w.token}"
                         for w in writes if w.start < invoked and w.token >= later.token]
        for r in reads:
            invoked = r.start if r.invoked is None else r.invoked
            for w in writes:
                w_invoked = w.start if w.invoked is None else w.invoked
                if w.start < invoked and w.token > r.token:
                    problems.append(f"read {r} saw token {r.token} below earlier write {w}")
                if w_invoked > r.end and w.token <= r.token:
                    problems.append(f"write {w} after read {r} has no larger token")
        return problems

    def violations(self, *, exclusive: bool) -> list[str]:
        """Safety violations; hold overlaps count only when ``exclusive`` (no clock or
        pause faults in the run)."""
        problems = (self.duplicate_tokens() + self.tokens_out_of_order()
                    + self.writes_out_of_order())
        if exclusive:
            problems += [f"holds overlap: {a} and {b}" for a, b in self.overlaps()]
        return problems


# ---------------------------------------------------------------------------
# Fenced-store runs: writers with random tokens, and the store's final state
# ---------------------------------------------------------------------------


@dataclass
class Stats:
    tried: int = 0
    accepted: int = 0
    rejected: int = 0
    errors: int = 0
    lost: int = 0  # accepted writes overwritten by a lower token, or missing at the end
    undeserved_rejections: int = 0
    equal_token_accepts: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self, store: str) -> str:
        return (f"{store}: tried={self.tried} accepted={self.accepted} "
                f"rejected={self.rejected} lost={self.lost} errors={self.errors} "
                f"undeserved_rejections={self.undeserved_rejections} "
                f"equal_token_accepts={self.equal_token_accepts}")

    def assert_clean(self) -> None:
        assert not self.problems, "\n".join(self.problems[:20])
        assert self.lost == 0 and self.errors == 0 and self.undeserved_rejections == 0
        assert self.tried == self.accepted + self.rejected


def check(writes: Iterable[Write], finals: Mapping[str, tuple[bytes | None, int]]) -> Stats:
    """Check a fenced-store history; ``finals`` maps each resource to the store's
    (value, highest)."""
    stats = Stats()
    by_resource = _by_resource(writes)
    for history in by_resource.values():
        for write in history:
            stats.tried += 1
            if write.outcome == ACCEPTED:
                stats.accepted += 1
            elif write.outcome == REJECTED:
                stats.rejected += 1
            else:
                stats.errors += 1
                stats.problems.append(f"write failed without a verdict: {write}")
    for resource in set(by_resource) | set(finals):
        history = by_resource.get(resource, [])
        accepted = [w for w in history if w.outcome == ACCEPTED]
        before = highest_accepted_before(accepted)
        for write in accepted:
            top, _ = before(write)
            if top > write.token:
                stats.lost += 1
                stats.problems.append(
                    f"{resource}: token {write.token} ({write.value}) accepted after token "
                    f"{top} had been accepted: an update was lost")
            elif top == write.token:
                stats.equal_token_accepts += 1
        # Each rejection must name a higher token that some accepted write had offered,
        # invoked before the rejection completed.
        started = sorted(accepted, key=lambda w: w.start)
        starts = [w.start for w in started]
        best: list[int] = []
        for write in started:
            best.append(max(write.token, best[-1] if best else -1))
        tokens = {w.token for w in accepted}
        for write in history:
            if write.outcome != REJECTED:
                continue
            seen = bisect.bisect_right(starts, write.end)
            if write.highest is None or write.highest <= write.token \
                    or write.highest not in tokens or not seen or best[seen - 1] <= write.token:
                stats.undeserved_rejections += 1
                stats.problems.append(f"{resource}: rejection not explained: {write}")
        value, highest = finals.get(resource, (None, 0))
        if not accepted:
            if value is not None:
                stats.problems.append(f"{resource}: value {value!r} but no accepted write")
            continue
        top_token = max(w.token for w in accepted)
        top_values = {w.value.encode() for w in accepted if w.token == top_token}
        if highest != top_token or value not in top_values:
            stats.lost += 1
            stats.problems.append(
                f"{resource}: final state (value={value!r}, highest={highest}) is not the "
                f"highest accepted write (token {top_token}, values {sorted(top_values)[:3]})")
    return stats
