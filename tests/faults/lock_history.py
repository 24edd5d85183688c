"""A small history recorder and checker for the clock and randomised fault tests.

Records, with ``time.monotonic`` invoke/completion times: committed acquisitions as
hold intervals (from the acquire's completion to the release's invocation, cut at the
lock's validity deadline), and fenced writes with their outcome. Checks:

* no two committed acquisitions of a resource share a token, and an acquisition
  invoked after another one completed has a larger token;
* accepted fenced writes never go backwards per resource: when accepted write A
  completed before accepted write B was invoked, A.token <= B.token, and equal tokens
  come from the same acquisition (one holder writing again); so across holders the
  accepted tokens are strictly increasing;
* optionally (runs without clock or pause faults): no two hold intervals overlap.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

ACCEPTED = "accepted"
REJECTED = "rejected"
ERROR = "error"


@dataclass(frozen=True)
class Hold:
    client: str
    resource: str
    token: int
    start: float  # the acquire completed
    end: float  # released, lost, or its validity ran out (whichever came first)
    invoked: float | None = None  # the acquire was invoked (None: same as start)


@dataclass(frozen=True)
class WriteRecord:
    client: str
    resource: str
    token: int
    invoke: float
    complete: float
    outcome: str


class History:
    """Thread-safe log of one run."""

    def __init__(self) -> None:
        self.holds: list[Hold] = []
        self.writes: list[WriteRecord] = []
        self._mutex = threading.Lock()

    def held(self, hold: Hold) -> None:
        with self._mutex:
            self.holds.append(hold)

    def wrote(self, write: WriteRecord) -> None:
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
        problems = []
        for later in self.holds:
            invoked = later.start if later.invoked is None else later.invoked
            for earlier in self.holds:
                if (earlier.resource == later.resource and earlier.start < invoked
                        and earlier.token >= later.token):
                    problems.append(f"{later.resource}: token {later.token} acquired after "
                                    f"token {earlier.token} was")
        return problems

    def writes_out_of_order(self) -> list[str]:
        accepted = [w for w in self.writes if w.outcome == ACCEPTED]
        problems = []
        for later in accepted:
            for earlier in accepted:
                if earlier.resource != later.resource or earlier.complete >= later.invoke:
                    continue
                same_holder = (earlier.client, earlier.token) == (later.client, later.token)
                if earlier.token > later.token or (earlier.token == later.token
                                                   and not same_holder):
                    problems.append(f"{later.resource}: write with token {later.token} "
                                    f"accepted after one with {earlier.token}")
        return problems

    def overlaps(self) -> list[tuple[Hold, Hold]]:
        pairs = []
        ordered = sorted(self.holds, key=lambda h: h.start)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1:]:
                if second.start >= first.end:
                    continue
                if second.resource == first.resource:
                    pairs.append((first, second))
        return pairs

    def violations(self, *, exclusive: bool) -> list[str]:
        """Safety violations; hold overlaps count only when ``exclusive`` (no clock or
        pause faults in the run)."""
        problems = (self.duplicate_tokens() + self.tokens_out_of_order()
                    + self.writes_out_of_order())
        if exclusive:
            problems += [f"holds overlap: {a} and {b}" for a, b in self.overlaps()]
        return problems
