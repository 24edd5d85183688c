"""Node amnesia: detection, exclusion, repair and rejoin (docs/design.md §4).

A node that lost its data may have forgotten lock keys (breaking mutual exclusion)
and fence counters (letting tokens go backwards). Each node carries a marker key;
the acquire script refuses with "amnesiac" where it is missing. This module decides
what such a reply means (a new cluster to initialise, another client initialising
right now, a node to bench, a majority that lost its data), and repairs benched
nodes: re-seed every fence counter from a majority of healthy nodes, then give the
marker back. Everything here is a protocol (see :mod:`redlock._protocol`).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redlock import _scripts as scripts
from redlock._log import get_logger
from redlock._protocol import Broadcast, Call, CommandArg, Protocol, Sleep, ask_one
from redlock._rules import Keys, Settings, error_detail, quorum, unsafe_config
from redlock._state import AttemptResult
from redlock.errors import ClusterAmnesiaError, NodeResult, Outcome

logger = get_logger(__name__)

_SEED_BATCH = 500  # fence counters per SEED_COUNTERS call


@dataclass(frozen=True)
class RepairReport:
    node: str
    status: str  # "healthy", "repaired", "waiting", "failed"
    detail: str = ""


class NodeHealth:
    """What one manager has learned about its nodes (thread-safe)."""

    def __init__(self) -> None:
        self.marker_seen = False  # this manager has seen an initialised cluster
        self.amnesiac_since: dict[int, float] = {}
        self.last_repair_try: dict[int, float] = {}
        self.inspected = False  # node configurations were read once (see unsafe_config)
        self._mutex = threading.Lock()

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


class AmnesiaGuard:
    """Amnesia decisions and repair for one manager's nodes."""

    def __init__(self, addresses: Sequence[str], settings: Settings, keys: Keys,
                 clock: Callable[[], float]) -> None:
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = keys
        self.clock = clock
        self.n = len(self.addresses)
        self.quorum = quorum(self.n)
        self.health = NodeHealth()

    # -- on the acquire path ---------------------------------------------------

    def inspect_nodes(self) -> Protocol[None]:
        """Once per manager, on its first acquire: read every node's INFO and warn about
        configurations that break the lock's assumptions. One round, in parallel,
        bounded by the node timeout; a node that does not answer is not asked again
        (its acquire replies say what is wrong with it)."""
        self.health.inspected = True
        replies = yield Broadcast(tuple(Call(i, ("INFO",)) for i in range(self.n)),
                                  self.settings.node_timeout)
        for i, reply in enumerate(replies):
            for finding in unsafe_config(reply):
                logger.warning("redlock.node_unsafe_config", node=self.addresses[i],
                               problem=finding)

    def check(self, outcomes: Sequence[NodeResult],
              now: float) -> Protocol[AttemptResult | None]:
        """What amnesiac replies in an attempt mean: None (carry on with the others), an
        attempt result to return (the cluster is new or being initialised), or
        :class:`ClusterAmnesiaError` (a majority lost its data)."""
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
            if any(reply == 1 for reply in probe):
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

    def repair_due(self, *, force: bool) -> Protocol[list[RepairReport]]:
        """Repair the benched nodes whose rejoin delay has passed (rate-limited)."""
        if not self.health.amnesiac_since:  # hot path: nothing to do, no lock taken
            return []
        reports = []
        for node in self.health.due_for_repair(self.clock(), self.settings, force=force):
            reports.append((yield from self._repair_node(node)))
        return reports

    # -- explicit repair -------------------------------------------------------

    def repair(self, *, force: bool) -> Protocol[list[RepairReport]]:
        """Find amnesiac nodes and repair those whose rejoin delay has passed (or all: force)."""
        probe = yield Broadcast(tuple(Call(i, ("EXISTS", self.keys.marker)) for i in range(self.n)),
                                self.settings.repair_timeout)
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
        for report in (yield from self.repair_due(force=force)):
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
        claimed = yield from ask_one(Call(target, ("SET", guard, repair_id, "NX", "PX", ttl_ms)),
                                     timeout)
        if isinstance(claimed, BaseException) or claimed is None:
            detail = error_detail(claimed) if isinstance(claimed, BaseException) else "busy"
            return RepairReport(address, "failed", f"could not claim the repair: {detail}")
        others = [i for i in range(self.n) if i != target]
        probe = yield Broadcast(tuple(Call(i, ("EXISTS", marker)) for i in others), timeout)
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
            yield from ask_one(Call(target, ("DEL", guard)), timeout)
            return RepairReport(address, "failed",
                                f"read counters from {complete} healthy nodes, need {self.quorum}")
        items = sorted(counters.items())
        for start in range(0, len(items), _SEED_BATCH):
            batch = items[start:start + _SEED_BATCH]
            seeded = yield from ask_one(Call(
                target, (repair_id, *(value for _, value in batch)), scripts.SEED_COUNTERS,
                (guard, *(key for key, _ in batch))), timeout)
            if seeded != 1:
                return RepairReport(address, "failed", f"seeding interrupted: {seeded!r}")
        marker_value = f"repaired {time.time():.3f} by {repair_id}"
        done = yield from ask_one(Call(target, (repair_id, marker_value), scripts.FINISH_REPAIR,
                                       (guard, marker)), timeout)
        if done != 1:
            return RepairReport(address, "failed", f"marker not written: {done!r}")
        self.health.note_healthy(target)
        logger.warning("redlock.node_repaired", node=address, counters_seeded=len(items),
                       sources=complete)
        return RepairReport(address, "repaired", f"{len(items)} fence counters re-seeded")

    def _read_counters(self, node: int) -> Protocol[dict[str, int] | None]:
        """Every fence counter of the namespace on one node (SCAN + MGET), or None."""
        cursor: CommandArg = 0
        values: dict[str, int] = {}
        timeout = self.settings.repair_timeout
        for _ in range(1_000_000):  # bounded: SCAN terminates, this only guards a bug
            page = yield from ask_one(Call(node, ("SCAN", cursor, "MATCH",
                                                  self.keys.fence_pattern, "COUNT", 1000)),
                                      timeout)
            if isinstance(page, BaseException) or not isinstance(page, list | tuple):
                return None
            cursor, keys = page[0], [_text(k) for k in page[1]]
            if keys:
                got = yield from ask_one(Call(node, ("MGET", *keys)), timeout)
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
