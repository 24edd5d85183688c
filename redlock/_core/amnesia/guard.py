"""Node amnesia: detection, exclusion, repair and rejoin (docs/design.md §4).

A node that lost its data may have forgotten lock keys (breaking mutual exclusion)
and fence counters (letting tokens go backwards). Two things betray it:

* its marker key is missing (a total loss: restart without persistence, FLUSHALL, a
  replica that never had it); the acquire script refuses on such a node by itself;
* its marker was stamped by another server run than the one answering (a restart, or
  a promoted replica): its data may be an older copy. Every new connection identifies
  the server first (IDENTIFY, sent by the transports ahead of the first call); until
  the node is judged, its grants do not count. A durable restart (``appendonly yes``,
  ``appendfsync always``, not a promoted replica) is re-stamped; anything else becomes
  a total loss: the marker is removed and an episode begins.

An episode key records on the node itself, by its own clock and with its run id, when
it was first seen without its marker. A repair (re-seed every fence counter from a
majority of healthy nodes, then give the marker back) succeeds only once the episode is
one ``max_ttl`` old, checked by the node in the script that writes the marker: every
client measures the same delay, and a new loss restarts it. Judging and repairing run
in the manager's background maintenance, never on an acquire's path.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from redlock._core.amnesia.repair import (
    RepairReport,
    identity,
    initialise,
    repair,
    repair_node,
    stamped_run,
    text,
)
from redlock._core.requests import PENDING, Broadcast, Call, Protocol, Sleep, Wakeable, ask_one
from redlock._core.rules import Keys, Settings, quorum, unsafe_config
from redlock._core.state import AttemptResult
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock.errors import ClusterAmnesiaError, NodeResult, Outcome

logger = get_logger("redlock.nodes")

# How many times a new cluster's initialiser asks again the nodes that did not answer.
_INIT_RETRIES = 3

class NodeHealth:
    """What one manager knows about its nodes' data (thread-safe)."""

    def __init__(self) -> None:
        self.marker_seen = False  # this manager has seen an initialised cluster
        self.inspected = False  # node configurations were read once (see unsafe_config)
        # Restarted: the marker value to judge, and the run id of the server judged.
        self.suspect: dict[int, tuple[bytes, str]] = {}
        self.unidentifiable: set[int] = set()  # may not run INFO: restarts go unseen
        self.unmarked: dict[int, float | None] = {}  # lost data: when it may rejoin
        self.last_try: dict[int, float] = {}  # last repair attempt (rate limit)
        # Markers without a known run (written by a release before run ids, or by a user
        # who may not run INFO): to be stamped with the server's run id, as found.
        self.adopt: dict[int, tuple[bytes, str]] = {}
        self.news = False  # a node needs the maintenance since its last round
        self._initialising = 0  # new-cluster initialisations of this manager in flight
        self._mutex = threading.Lock()

    def initialising(self, change: int) -> None:
        with self._mutex:
            self._initialising += change

    def initialising_now(self) -> bool:
        return self._initialising > 0

    def after_fork(self) -> None:
        self._mutex = threading.Lock()  # a parent thread may have held it at the fork

    def identified(self, node: int, run_id: str, marker: bytes | None) -> bool:
        """Record what a new connection found; True if the node became a suspect."""
        with self._mutex:
            if marker is None:
                # No marker: the acquire script refuses there by itself, and the acquire
                # tells a new cluster from a node that lost its data.
                self.suspect.pop(node, None)
                return False
            self.marker_seen = True
            stamped = stamped_run(marker)
            if stamped == run_id or run_id == "unknown":
                # The same server run, or we cannot tell (our user may not run INFO:
                # restart detection is off for this node, and the manager warned).
                self.suspect.pop(node, None)
                self.unmarked.pop(node, None)
                return False
            if stamped in (None, "unknown"):
                # Whoever wrote the marker could not tell restarts apart either: what it
                # promised holds, from now on with restart detection (it is adopted).
                self.suspect.pop(node, None)
                self.news |= node not in self.adopt
                self.adopt[node] = (marker, run_id)
                return False
            known = node in self.suspect
            self.suspect[node] = (marker, run_id)
            self.news |= not known
            return not known

    def benched(self) -> set[int]:
        with self._mutex:
            return set(self.suspect) | set(self.unmarked)

    def rejoins_in(self, node: int, now: float) -> float | None:
        with self._mutex:
            due = self.unmarked.get(node)
        return None if due is None else max(0.0, due - now)

    def healthy(self, node: int) -> None:
        with self._mutex:
            self.suspect.pop(node, None)
            self.unmarked.pop(node, None)

    def marked(self, node: int) -> None:
        """The node has its marker again (whether its server may be trusted is the
        suspects' business)."""
        with self._mutex:
            self.unmarked.pop(node, None)

    def lost_data(self, node: int) -> bool:
        """Note a node without its marker; True the first time."""
        with self._mutex:
            self.suspect.pop(node, None)
            if node in self.unmarked:
                return False
            self.unmarked[node] = None
            self.news = True
            return True

    def episode_unknown(self, node: int) -> None:
        """Its episode must be looked at again (it began anew, or could not be read)."""
        with self._mutex:
            if node in self.unmarked:
                self.unmarked[node] = None

    def rejoins_at(self, node: int, at: float) -> None:
        with self._mutex:
            if node in self.unmarked:
                self.unmarked[node] = at

    def pending(self) -> bool:
        return bool(self.suspect or self.unmarked or self.adopt)


class AmnesiaGuard:
    """Amnesia decisions, judging and repair for one manager's nodes."""

    def __init__(self, addresses: Sequence[str], settings: Settings, keys: Keys,
                 clock: Callable[[], float], timeout: Callable[[], float]) -> None:
        self.addresses = tuple(addresses)
        self.settings = settings
        self.keys = keys
        self.clock = clock
        self.timeout = timeout  # a request's wait on the acquire path (adaptive or set)
        self.n = len(self.addresses)
        self.quorum = quorum(self.n)
        self.health = NodeHealth()

    def identify_call(self, node: int) -> Call:
        """What a transport sends first on every new connection to ``node`` (an EVAL with
        the body, not EVALSHA: it never meets NOSCRIPT, and it is rare)."""
        return Call(node, ("EVAL", node_scripts.IDENTIFY.source, 1, self.keys.marker))

    def identified(self, identities: Mapping[int, object]) -> None:
        """The replies to :meth:`identify_call` that a request's new connections got."""
        for node, reply in identities.items():
            found = identity(reply)
            if found is not None:
                run_id, marker = found
                if run_id == "unknown" and node not in self.health.unidentifiable:
                    self.health.unidentifiable.add(node)
                    logger.warning("redlock.node_unidentifiable", node=self.addresses[node],
                                   problem="the lock user may not run INFO (ACL"
                                   " -@dangerous): restarts and rollbacks of this node"
                                   " cannot be detected; allow +info")
                if self.health.identified(node, run_id, marker):
                    logger.info("redlock.node_restarted", node=self.addresses[node],
                                run_id=run_id, stamped=stamped_run(marker) or "")

    def needs_maintenance(self) -> bool:
        return self.health.pending()

    # -- on the acquire path (no waiting on repairs) ------------------------------

    def inspect_nodes(self) -> Protocol[None]:
        """Once per manager, on its first acquire: read every node's INFO and warn about
        configurations that break the lock's assumptions. One round, in parallel,
        bounded by the node timeout; a node that does not answer is not asked again
        (its acquire replies say what is wrong with it)."""
        self.health.inspected = True
        quorum = self.quorum
        replies = yield Broadcast(
            tuple(Call(i, ("INFO",)) for i in range(self.n)), self.timeout(),
            # Advice only: a quorum's answers (and whoever answers as fast) will do.
            enough=lambda got: sum(1 for r in got if r is not PENDING) >= quorum)
        for i, reply in enumerate(replies):
            for finding in unsafe_config(reply):
                logger.warning("redlock.node_unsafe_config", node=self.addresses[i],
                               problem=finding)

    def screen(self, outcomes: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
        """A restarted node's grant does not count until it is judged: its data may be an
        older copy (its counters behind committed tokens, its lock keys missing)."""
        suspect = self.health.suspect
        if not suspect:  # hot path
            return tuple(outcomes)
        return tuple(NodeResult(r.node, Outcome.AMNESIAC,
                                "restarted since its marker was written: checking its"
                                " persistence") if i in suspect and r.outcome in
                     (Outcome.GRANTED, Outcome.REFUSED) else r
                     for i, r in enumerate(outcomes))

    def check(self, outcomes: Sequence[NodeResult],
              now: float) -> Protocol[AttemptResult | None]:
        """What amnesiac replies in an attempt mean: None (carry on with the others), an
        attempt result to return (the cluster is new or being initialised), or
        :class:`ClusterAmnesiaError` (a majority lost its data)."""
        amnesiac = [i for i, r in enumerate(outcomes) if r.outcome is Outcome.AMNESIAC]
        with_marker = [i for i, r in enumerate(outcomes)
                       if r.outcome in (Outcome.GRANTED, Outcome.REFUSED)]
        if with_marker:
            self.health.marker_seen = True
        if not amnesiac:
            return None
        missing = [i for i in amnesiac if i not in self.health.suspect]
        if len(missing) == self.n and not self.health.marker_seen:
            # Every node answered and none has a marker: a new cluster. Initialise it.
            self.health.initialising(+1)
            try:
                written = list((yield self._init_markers(range(self.n))))
                # Every node answered the acquire a moment ago: one that did not answer
                # the initialisation in time (a busy client) is asked again, a few
                # times, rather than left unmarked (it would be benched for max_ttl).
                for _ in range(_INIT_RETRIES):
                    unanswered = [i for i, reply in enumerate(written) if reply not in (1, 0, -1)]
                    if not unanswered:
                        break
                    again = yield self._init_markers(unanswered)
                    for i, reply in zip(unanswered, again, strict=True):
                        written[i] = reply
            finally:
                self.health.initialising(-1)
            if sum(1 for reply in written if reply == -1) >= self.quorum:
                # A quorum would not take one: each holds an amnesia episode. Not a new
                # cluster: one whose nodes lost their data (another client saw it).
                raise self._majority_lost(self.n, outcomes)
            logger.info("redlock.cluster_initialised", nodes=self.n,
                        marked=sum(1 for reply in written if reply == 1))
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
        newly_missing = [i for i in missing if i not in self.health.unmarked]
        if newly_missing and self.health.initialising_now():
            # Another acquire of this manager is initialising the cluster right now: its
            # markers have not reached these nodes yet (on a busy event loop, or with
            # many threads, that can take longer than a request). Wait, then try again.
            yield Sleep(self.timeout())
            return AttemptResult(None, tuple(outcomes), retry_now=True,
                                 reason="cluster initialisation in progress")
        if newly_missing:
            # A marker missing beside markers present is most often another client
            # initialising a new cluster right now: its broadcast is still in flight.
            # Look again once it must have landed before calling it amnesia.
            yield Sleep(self.timeout())
            probe = yield Broadcast(tuple(Call(i, ("EXISTS", self.keys.marker))
                                          for i in newly_missing), self.timeout())
            if any(reply == 1 for reply in probe):
                return AttemptResult(None, tuple(outcomes), retry_now=True,
                                     reason="cluster initialisation in progress")
            # Only a node that answered the second look without its marker lost its data;
            # one that did not answer (a busy or slow node, a loaded client) is neither
            # benched nor counted towards a majority loss: it is looked at again next time
            # (it refuses to grant without its marker anyway).
            unconfirmed = {i for i, reply in zip(newly_missing, probe, strict=True)
                           if reply != 0}
            missing = [i for i in missing if i not in unconfirmed]
        if len(missing) >= self.quorum:
            raise self._majority_lost(len(missing), outcomes)
        for i in missing:
            if self.health.lost_data(i):
                logger.warning("redlock.node_amnesiac", node=self.addresses[i],
                               rejoins_after_s=self.settings.max_ttl)
        return None

    def _majority_lost(self, missing: int, outcomes: Sequence[NodeResult]) -> ClusterAmnesiaError:
        return ClusterAmnesiaError(
            f"{missing} of {self.n} nodes have no node marker (they lost their data: restart"
            " without persistence, FLUSHALL, failover to an empty replica; or a new"
            " cluster's initialisation was interrupted): fence tokens could go backwards,"
            " so redlock refuses. Restore the nodes' data if you can; else, once every lock"
            " held before has expired (max_ttl), run `redlock initialise --force`"
            " (Redlock.initialise(force=True)). An interrupted initialisation, where fewer"
            " than a quorum of nodes ever had a marker, needs only `redlock initialise`.",
            outcomes=outcomes)

    def _init_markers(self, nodes: Sequence[int] | range) -> Broadcast:
        text = f"initialised at={time.time():.3f} by={secrets.token_hex(8)}"
        return Broadcast(tuple(Call(i, (text,), node_scripts.INIT_MARKER,
                                    (self.keys.marker, self.keys.episode)) for i in nodes),
                         self.timeout())

    # -- background maintenance ---------------------------------------------------

    def maintenance(self, stop: Wakeable, news: Wakeable) -> Protocol[None]:
        """Judge restarted nodes, adopt unstamped markers, open episodes and repair nodes
        whose rejoin delay has passed; returns when no node needs it any more, or
        ``stop`` is set (the manager closed). Between rounds it waits for the next
        repair due, or ``news`` (set when a node newly needs it, and on close).
        Rate-limited; each step is bounded by ``repair_timeout``."""
        health, settings = self.health, self.settings
        while health.pending() and not stop.is_set():
            news.clear()
            health.news = False
            if health.adopt:
                yield from self.adopt_markers(dict(health.adopt))
            if health.suspect:
                yield from self.judge(dict(health.suspect))
            unknown = [i for i, due in list(health.unmarked.items()) if due is None]
            if unknown:
                yield from self.open_episodes(unknown)
            now = self.clock()
            for node, due in list(health.unmarked.items()):
                tried = health.last_try.get(node)
                if due is not None and due <= now and (
                        tried is None or now - tried >= settings.repair_interval):
                    health.last_try[node] = now
                    yield from repair_node(self, node, force=False)
            if not health.pending():
                return
            now = self.clock()
            waits = [settings.repair_interval]
            for node, due in list(health.unmarked.items()):
                if due is not None:
                    tried = health.last_try.get(node)
                    ready = max(due, tried + settings.repair_interval if tried else due)
                    waits.append(ready - now)
            yield Sleep(max(0.01, min(waits)), until=news)

    def adopt_markers(self, markers: dict[int, tuple[bytes, str]]) -> Protocol[None]:
        """Stamp unstamped markers (see NodeHealth.identified) with the run id found."""
        calls = tuple(Call(node, (marker, f"adopted at={time.time():.3f}", run_id),
                           node_scripts.RESTAMP, (self.keys.marker,))
                      for node, (marker, run_id) in markers.items())
        replies = yield Broadcast(calls, self.settings.repair_timeout)
        for (node, found), reply in zip(markers.items(), replies, strict=True):
            with self.health._mutex:
                if self.health.adopt.get(node) == found:
                    del self.health.adopt[node]
            if reply == 1:
                logger.info("redlock.node_marker_adopted", node=self.addresses[node],
                            run_id=found[1])
            # Otherwise the marker or the server changed meanwhile: the next connection
            # identifies it again (a node that did not answer is looked at then, too).

    def judge(self, suspects: dict[int, tuple[bytes, str]]) -> Protocol[None]:
        """A restarted node: re-stamp it if nothing it acknowledged can have been lost,
        else turn the restart into an amnesia episode."""
        timeout = self.settings.repair_timeout
        nodes = list(suspects)
        calls = tuple(call for i in nodes for call in (
            Call(i, ("CONFIG", "GET", "appendonly")), Call(i, ("CONFIG", "GET", "appendfsync")),
            Call(i, ("INFO", "replication"))))
        replies = yield Broadcast(calls, timeout)
        for k, node in enumerate(nodes):
            appendonly, appendfsync, replication = replies[3 * k:3 * k + 3]
            why = _not_durable(appendonly, appendfsync, replication)
            marker, run_id = suspects[node]
            if why is None and not isinstance(replication, BaseException):
                done = yield from ask_one(Call(
                    node, (marker, f"restamped at={time.time():.3f}", run_id),
                    node_scripts.RESTAMP, (self.keys.marker,)), timeout)
                if done == 1:
                    self.health.healthy(node)
                    logger.info("redlock.node_restamped", node=self.addresses[node])
                    continue
            elif why is not None:
                done = yield from ask_one(Call(
                    node, (marker, why), node_scripts.DEMOTE,
                    (self.keys.marker, self.keys.episode)), timeout)
                if done == 1:
                    self.health.lost_data(node)
                    logger.warning("redlock.node_amnesiac", node=self.addresses[node],
                                   rejoins_after_s=self.settings.max_ttl)
                    continue
            # Unreachable, or the marker changed meanwhile: look at the node again.
            again = identity((yield from ask_one(self.identify_call(node), timeout)))
            if again is not None:
                self.health.identified(node, *again)

    def open_episodes(self, nodes: Sequence[int]) -> Protocol[None]:
        """Begin (or read) the amnesia episode of nodes without their marker, and from it
        when each may rejoin."""
        if not nodes:
            return
        replies = yield Broadcast(tuple(
            Call(i, ("lost its node marker",), node_scripts.OPEN_EPISODE,
                 (self.keys.marker, self.keys.episode)) for i in nodes),
            self.settings.repair_timeout)
        now = self.clock()
        for node, reply in zip(nodes, replies, strict=True):
            if not isinstance(reply, list | tuple) or not reply:
                continue  # unreachable: try again later
            if int(reply[0]) == 0:
                self.health.marked(node)  # repaired meanwhile (by another client)
                continue
            age = (int(reply[2]) - int(reply[1])) / 1000.0
            self.health.rejoins_at(node, now + max(0.0, self.settings.max_ttl - age))

    # -- admin steps (redlock/_repair.py) -----------------------------------------

    def repair(self, *, force: bool) -> Protocol[list[RepairReport]]:
        return repair(self, force=force)

    def initialise(self, *, force: bool) -> Protocol[list[RepairReport]]:
        return initialise(self, force=force)


def _not_durable(appendonly: object, appendfsync: object, replication: object) -> str | None:
    """Why a restarted node may have lost acknowledged writes (None: it cannot have)."""
    def setting(reply: object) -> str:  # CONFIG GET: a map (RESP3) or a pair (RESP2)
        if isinstance(reply, dict) and len(reply) == 1:
            return text(next(iter(reply.values())))
        if isinstance(reply, list | tuple) and len(reply) == 2:
            return text(reply[1])
        return "unknown"

    if isinstance(replication, BaseException):
        return None  # unreachable: judged again later
    fields = dict(line.split(":", 1) for line in text(replication).splitlines() if ":" in line)
    if fields.get("second_repl_offset", "-1").strip() != "-1":
        return "a promoted replica (its copy may lag behind the old primary)"
    if setting(appendonly) != "yes" or setting(appendfsync) != "always":
        return (f"restarted with appendonly {setting(appendonly)}, appendfsync"
                f" {setting(appendfsync)}: the last writes may be lost")
    return None
