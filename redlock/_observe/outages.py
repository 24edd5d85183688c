"""Repeated node failures logged once per node and outage, then counted (docs/events.md, "A
node that keeps failing"): a down node would otherwise fail every release and renewal, one
warning each.

Per node: the first missed release and the first failed renewal log their event, later ones are
counted; ``redlock.node_still_failing`` gives the counts at most once per ``summary_every_s``; once
the node has answered again and not failed for ``settle_s`` (long enough that the failures in
flight, and the reconnections after a restart, belong to the same outage),
``redlock.node_answers_again`` ends the outage. With every node answering the hot path pays one
truth test of an empty dict (``current``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from redlock._observe.log import EventLogger
from redlock.errors import NodeResult, Outcome, describe

RELEASES, RENEWALS = "releases", "renewals"  # what failed on a node, counted apart
_ANSWERS = (Outcome.GRANTED, Outcome.REFUSED)  # the node answered (REFUSED: key gone)
# The summaries of an outage are about the node: the nodes logger, whoever reported it.
_NODES_LOG = EventLogger("redlock.nodes")


class _Outage:
    """One node's trouble, from its first failure until it answers again."""

    __slots__ = ("counts", "last_failure", "last_line", "since", "started")

    def __init__(self, now: float, wall: float) -> None:
        self.since = wall  # wall clock of the first failure, for people
        self.started = self.last_failure = self.last_line = now  # the manager's clock
        self.counts = {RELEASES: 0, RENEWALS: 0}


@dataclass(frozen=True)
class OutageSummary:
    """What a summary line says about one node's outage."""

    node: str
    releases_missed: int
    renewals_failed: int
    since: str  # the first failure: ISO 8601, local time with its offset
    outage_s: float  # from the first failure to the last one seen


@dataclass(frozen=True)
class Failure:
    """What a failure counted on a node calls for: its event's first line of this outage
    (``first``), a summary of the outage so far (``summary``), or neither."""

    first: bool
    summary: OutageSummary | None


class NodeOutages:
    """Per node, the failures of its current outage (thread-safe)."""

    def __init__(self, clock: Callable[[], float], wall_clock: Callable[[], float],
                 mutex: AbstractContextManager[object], *, summary_every_s: float = 60.0,
                 settle_s: float = 5.0) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self.summary_every_s = summary_every_s
        self.settle_s = settle_s
        self._mutex = mutex
        # Per node in trouble, its outage. Its truth tells whether some node is (read
        # without the lock, by every release: a stale answer only delays an ``answered``
        # to the next call; failures are always counted).
        self.current: dict[str, _Outage] = {}

    def after_fork(self, mutex: AbstractContextManager[object]) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def __bool__(self) -> bool:
        """Is some node in trouble? (``current``, read without the lock.)"""
        return bool(self.current)

    def failed(self, node: str, what: str) -> Failure:
        """Count one failure of ``what`` (RELEASES or RENEWALS) on ``node``."""
        now = self._clock()
        with self._mutex:
            outage = self.current.get(node)
            if outage is None:
                outage = self.current[node] = _Outage(now, self._wall_clock())
            outage.last_failure = now
            outage.counts[what] += 1
            if outage.counts[what] == 1:
                outage.last_line = now
                return Failure(True, None)
            if now - outage.last_line < self.summary_every_s:
                return Failure(False, None)
            outage.last_line = now
            return Failure(False, self._summary(node, outage))

    def answered(self, node: str) -> OutageSummary | None:
        """``node`` answered: the summary of its outage if that ends it, else None."""
        if node not in self.current:  # read without the lock: most nodes are fine
            return None
        now = self._clock()
        with self._mutex:
            outage = self.current.get(node)
            if outage is None or now - outage.last_failure < self.settle_s:
                return None
            del self.current[node]
            return self._summary(node, outage)

    @staticmethod
    def _summary(node: str, outage: _Outage) -> OutageSummary:
        since = datetime.fromtimestamp(outage.since).astimezone().isoformat(timespec="seconds")
        return OutageSummary(node, outage.counts[RELEASES], outage.counts[RENEWALS], since,
                             round(outage.last_failure - outage.started, 1))

    # -- what the call sites log ----------------------------------------------------------

    def release(self, log: EventLogger, resource: str, ttl: float,
                outcomes: Sequence[NodeResult]) -> None:
        """A release's outcomes: a node that did not answer (ERROR) missed it; one that
        answered (GRANTED, REFUSED) may end its outage."""
        for result in outcomes:
            if result.outcome is Outcome.ERROR:
                failure = self.failed(result.node, RELEASES)
                if failure.first:
                    log.warning("redlock.release_incomplete", resource=resource,
                                node=result.node, error=result.detail, expires_within_s=ttl)
                elif failure.summary is not None:
                    _still_failing(log, failure.summary)
            elif result.outcome in _ANSWERS and self:
                self._answered(log, result.node)

    def renewal_failed(self, log: EventLogger, resource: str, validity_left_s: float,
                       outcomes: Sequence[NodeResult]) -> None:
        """A renewal that reached no quorum: counted on each node that did not answer
        (ERROR, or not awaited: known to be slow), or, when all answered (some refused),
        on those that refused."""
        failing = [r for r in outcomes if r.outcome in (Outcome.ERROR, Outcome.NOT_AWAITED)]
        for result in failing or [r for r in outcomes if r.outcome is not Outcome.GRANTED]:
            failure = self.failed(result.node, RENEWALS)
            if failure.first:
                log.warning("redlock.extend_retry", resource=resource, node=result.node,
                            error=result.detail or result.outcome.value,
                            validity_left_s=validity_left_s, outcomes=describe(outcomes))
            elif failure.summary is not None:
                _still_failing(log, failure.summary)

    def answers(self, log: EventLogger, outcomes: Sequence[NodeResult]) -> None:
        """Outcomes of a request that may show nodes in trouble answering again."""
        for result in outcomes:
            if result.outcome in _ANSWERS:
                self._answered(log, result.node)

    def _answered(self, log: EventLogger, node: str) -> None:
        summary = self.answered(node)
        if summary is not None:
            _NODES_LOG.info("redlock.node_answers_again", node=node,
                     releases_missed=summary.releases_missed,
                     renewals_failed=summary.renewals_failed, since=summary.since,
                     outage_s=summary.outage_s)



def _still_failing(log: EventLogger, summary: OutageSummary) -> None:
    _NODES_LOG.warning("redlock.node_still_failing", node=summary.node,
                releases_missed=summary.releases_missed,
                renewals_failed=summary.renewals_failed, since=summary.since,
                outage_s=summary.outage_s)
