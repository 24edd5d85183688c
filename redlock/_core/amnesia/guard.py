"""Node amnesia: detection, exclusion, repair and rejoin (docs/design.md §4).

A node that lost its data may have forgotten lock keys and fence counters. Its marker betrays it:
missing (a total loss; the acquire script refuses by itself), or stamped by another server run
than the one answering (a restart, a promoted replica: until judged, its grants do not count; a
durable restart is re-stamped, anything else becomes a total loss). A node of another format
(§4.1) is not used at all. An episode key on the node records when it may rejoin (§4.3.1); a
repair succeeds only from then on, checked by the node itself. Judging and repairing run in the
manager's background maintenance, never on an acquire's path.

The unit of all this is a *place* (docs/design.md §11.4): a standalone node, or one hash slot
of a cluster node (:class:`~redlock._core.layout.Layout`); the health is kept by place, and
every call for a place uses its keys and is routed by its marker key."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from redlock._core.amnesia.health import NodeHealth
from redlock._core.environment import Environment
from redlock._core.layout import Layout
from redlock._core.members import Membership
from redlock._core.requests import Broadcast, Call, CommandArg, Deadline, Flow, Pause
from redlock._core.settings import Keys, Settings
from redlock._core.state import AttemptResult
from redlock._core.tokens import quorum
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock._scripts.node_config import unsafe_config
from redlock._scripts.replies import (
    Initialised,
    identity,
    initialised,
    marker_exists,
    marker_format,
    other_format,
    ours,
    stamped_run,
)
from redlock._scripts.script import Script
from redlock.errors import ClusterAmnesiaError, NodeFormatError, NodeResult, Outcome

logger = get_logger("redlock.nodes")

# How many times a new cluster's initialiser asks again the nodes that did not answer.
_INIT_RETRIES = 3


class AmnesiaGuard:
    """Amnesia decisions, judging and repair for one manager's nodes."""

    def __init__(self, addresses: Sequence[str], settings: Settings, layout: Layout,
                 env: Environment, timeout: Callable[[], float], membership: Membership) -> None:
        self.addresses = tuple(addresses)
        self.membership = membership  # its rule: what a quorum is (§13.2)
        self.settings = settings
        self.layout = layout
        self.keys = layout.keys
        self.env = env
        self.clock = env.clock
        self.timeout = timeout  # a request's wait on the acquire path (adaptive or set)
        self.n = len(self.addresses)
        self.quorum = quorum(self.n)
        self.health = NodeHealth(env.new_mutex())

    def identify_call(self, node: int) -> Call:
        """What a transport sends first on every new connection to ``node`` (an EVAL with
        the body, not EVALSHA: it never meets NOSCRIPT, and it is rare)."""
        return Call(node, self.keys.identify_command())

    # -- places (docs/design.md §11.4) -------------------------------------------

    def where(self, place: int) -> str:
        """A place as a person reads it (a node's address, and its hash slot)."""
        return self.layout.where(place, self.addresses)

    def keys_of(self, place: int) -> Keys:
        return self.layout.keys_of(place)

    def call(self, place: int, args: tuple[CommandArg, ...], script: Script | None = None,
             keys: tuple[str, ...] = ()) -> Call:
        """A call for ``place``: a script with ``keys``, or a plain command routed (on a
        cluster node) by the place's marker key, to the master serving its hash slot."""
        node = self.layout.node_of(place)
        if script is None:
            return Call(node, args, None, (self.keys_of(place).marker,))
        return Call(node, args, script, keys)

    def floored(self, place: int) -> bool:
        """Whether ``place`` is a hash slot of a lone cluster node (N=1): no peer to
        re-seed it, its master's epoch does (docs/design.md §11.4, "the epoch floor"); a
        loss there is benched, not a majority's."""
        return self.n == 1 and place >= self.n

    def identify(self, place: int) -> Call:
        """IDENTIFY of a place: the server serving it and its marker."""
        if place < self.n:
            return self.identify_call(place)
        return Call(self.layout.node_of(place), (), node_scripts.IDENTIFY,
                    (self.keys_of(place).marker,))

    def identified(self, identities: Mapping[int, object]) -> None:
        """The replies to :meth:`identify_call` that a request's new connections got."""
        for node, reply in identities.items():
            found = identity(reply)
            if found is not None:
                run_id, marker = found
                if marker is not None and not ours(marker):
                    self.of_other_format(node, other_format(marker_format(marker)))
                    continue
                if run_id == "unknown" and node not in self.health.unidentifiable:
                    self.health.unidentifiable.add(node)
                    logger.warning("redlock.node_unidentifiable", node=self.addresses[node],
                                   problem="the lock user may not run INFO (ACL"
                                   " -@dangerous): restarts and rollbacks of this node"
                                   " cannot be detected; allow +info")
                if self.health.identified(node, run_id, marker):
                    logger.info("redlock.node_restarted", node=self.addresses[node],
                                run_id=run_id, stamped=stamped_run(marker) or "")

    def of_other_format(self, place: int, why: str) -> None:
        """``place``'s marker names another format than this client's (``why`` says which,
        docs/design.md §4.1): it is not used from now on; logged the first time."""
        if self.health.of_other_format(place, why):
            logger.warning("redlock.node_incompatible", node=self.where(place), why=why)

    def needs_maintenance(self) -> bool:
        return self.health.pending()

    # -- on the acquire path (no waiting on repairs) ------------------------------

    def inspect_calls(self) -> tuple[Call, ...]:
        """Once per manager, on its first acquire: INFO for every node, to warn about unsafe
        configurations. Sent behind the first attempt's calls, so it costs no round of its own
        (which a hung majority would make a whole request timeout); a node whose INFO is not read
        by the time the attempt is decided is not asked again."""
        self.health.inspected = True
        return tuple(Call(i, ("INFO",)) for i in range(self.n))

    def inspected(self, replies: Sequence[object]) -> None:
        """The INFO replies of :meth:`inspect_calls` (one per node, in node order)."""
        for i, reply in enumerate(replies):
            for finding in unsafe_config(reply, cluster=i in self.layout.clusters):
                logger.warning("redlock.node_unsafe_config", node=self.addresses[i],
                               problem=finding)

    def screen(self, outcomes: Sequence[NodeResult]) -> tuple[NodeResult, ...]:
        """A restarted node's grant does not count until it is judged: its data may be an
        older copy (its counters behind committed tokens, its lock keys missing). A node
        of another format never counts (its connection's IDENTIFY said so: the usual
        case of ACQUIRE reads only that its marker exists)."""
        suspect, incompatible = self.health.suspect, self.health.incompatible
        if not suspect and not incompatible:  # hot path
            return tuple(outcomes)
        screened = []
        for i, r in enumerate(outcomes):
            if r.outcome in (Outcome.GRANTED, Outcome.REFUSED):
                if i in incompatible:
                    r = NodeResult(r.node, Outcome.INCOMPATIBLE, incompatible[i])
                elif i in suspect:
                    r = NodeResult(r.node, Outcome.AMNESIAC, "restarted since its marker was"
                                   " written: checking its persistence")
            screened.append(r)
        return tuple(screened)

    def clear(self, outcomes: Sequence[NodeResult]) -> bool:
        """Nothing for :meth:`check` to do: no amnesiac or incompatible reply, and a marker seen
        before (the usual attempt: asked first, it spares the attempt a flow of its own)."""
        return self.health.marker_seen and all(
            r.outcome is not Outcome.AMNESIAC and r.outcome is not Outcome.INCOMPATIBLE
            for r in outcomes)

    def check(self, outcomes: Sequence[NodeResult], deadline: Deadline,
              places: Sequence[int] | None = None) -> Flow[AttemptResult | None]:
        """What amnesiac replies in an attempt mean: None (carry on with the others), an
        attempt result to return (the cluster is new or being initialised), or
        :class:`ClusterAmnesiaError` (a majority lost its data). ``places``: per node, the
        place the attempt's calls used (by default the nodes). Every round and wait in
        here ends by the caller's ``deadline`` (docs/design.md §4.2)."""
        at = places if places is not None else range(self.n)
        amnesiac = [at[i] for i, r in enumerate(outcomes) if r.outcome is Outcome.AMNESIAC]
        for i, r in enumerate(outcomes):
            if r.outcome is Outcome.INCOMPATIBLE:  # a newer release's node (§4.1)
                self.of_other_format(i, r.detail)
        with_marker = [i for i, r in enumerate(outcomes)
                       if r.outcome in (Outcome.GRANTED, Outcome.REFUSED, Outcome.INCOMPATIBLE)]
        if with_marker:
            self.health.marker_seen = True
        if not amnesiac:
            return None
        missing = [i for i in amnesiac if i not in self.health.suspect]
        if len(missing) == self.n and not self.health.marker_seen:
            # Every node answered and none has a marker: a new cluster. Initialise it.
            self.health.initialising(+1)
            every = [p for node in range(self.n) for p in self.layout.every_place(node)]
            try:
                written = list((yield self._init_markers(every, deadline)))
                # A node that did not answer the initialisation in time (a busy client) is
                # asked again, a few times, within the deadline, rather than left unmarked
                # (it would be benched for max_ttl).
                for _ in range(_INIT_RETRIES):
                    unanswered = [k for k, reply in enumerate(written)
                                  if initialised(reply) is Initialised.UNANSWERED]
                    if not unanswered or deadline.passed():
                        break
                    again = yield self._init_markers([every[k] for k in unanswered], deadline)
                    for k, reply in zip(unanswered, again, strict=True):
                        written[k] = reply
            finally:
                self.health.initialising(-1)
            found = {p: initialised(reply) for p, reply in zip(every, written, strict=True)}
            if any(found[p] is Initialised.EXISTS for p in at):
                # Initialised before (a hash slot stamped by another server, or another
                # client's markers just written): the next attempt looks at them.
                self.health.marker_seen = True
            if sum(1 for p in at if found[p] is Initialised.EPISODE) >= self.quorum:
                # A quorum would not take one: each holds an amnesia episode. Not a new
                # cluster: one whose nodes lost their data (another client saw it).
                raise self._majority_lost(self.n, outcomes)
            logger.info("redlock.cluster_initialised", nodes=self.n,
                        marked=sum(1 for kind in found.values()
                                   if kind is Initialised.WRITTEN))
            return AttemptResult(None, tuple(outcomes), retry_now=True,
                                 reason="cluster initialised")
        if not with_marker and not self.health.marker_seen:
            # No marker anywhere we reached, and none ever seen: most likely a new cluster
            # with a node silent. Only a full view may initialise it (a partial one could be
            # a majority that lost its data); nobody is benched.
            silent = self.n - len(amnesiac)
            return AttemptResult(None, tuple(outcomes), unavailable=True, reason=(
                f"new cluster not initialised yet: all {self.n} nodes must answer once,"
                f" {silent} did not"))
        newly_missing = [i for i in missing if i not in self.health.unmarked]
        if newly_missing and self.health.initialising_now():
            # Another acquire of this manager is initialising the cluster right now, its
            # markers not here yet: wait, then try again.
            wait = deadline.pause(self.timeout())
            if wait > 0:
                yield Pause(wait)
            return AttemptResult(None, tuple(outcomes), retry_now=True,
                                 reason="cluster initialisation in progress")
        if newly_missing and deadline.passed():
            # No time left for a second look: neither benched nor counted towards a
            # majority loss (they refuse to grant without their marker anyway).
            newly = set(newly_missing)
            missing = [i for i in missing if i not in newly]
        elif newly_missing:
            # A marker missing beside markers present is most often another client's
            # initialisation still in flight: look again before calling it amnesia.
            wait = deadline.pause(self.timeout())
            if wait > 0:
                yield Pause(wait)
            probe = yield Broadcast(tuple(self._look(p) for p in newly_missing),
                                    deadline.bound(self.timeout()))
            looked = {p: self._looked(p, reply)
                      for p, reply in zip(newly_missing, probe, strict=True)}
            if any(marked is True for marked in looked.values()):
                return AttemptResult(None, tuple(outcomes), retry_now=True,
                                     reason="cluster initialisation in progress")
            # Only a place that answered the second look without its marker lost its data
            # (a hash slot stamped by another server is a suspect now); one that did not
            # answer is looked at again next time.
            missing = [p for p in missing if looked.get(p, False) is False]
        floored = bool(missing) and self.floored(missing[0])
        if len(missing) >= self.quorum and not floored:
            raise self._majority_lost(len(missing), outcomes)
        for p in missing:
            if self.health.lost_data(p):
                logger.warning("redlock.node_amnesiac", node=self.where(p))
        if floored:
            return AttemptResult(None, tuple(outcomes), unavailable=True, reason=(
                f"{self.where(missing[0])} lost its data (a failover, or a loss): it stays"
                " out until every lock it may have granted has expired (max_ttl), then its"
                " counter is re-seeded from its master's epoch"))
        return None

    def _look(self, place: int) -> Call:
        """The second look at a place without its marker: EXISTS on a standalone node;
        IDENTIFY on a hash slot, which also names the run serving it."""
        if place < self.n:
            return self.call(place, ("EXISTS", self.keys.marker))
        return self.identify(place)

    def _looked(self, place: int, reply: object) -> bool | None:
        """What the second look found: True, a marker its server stamped (an
        initialisation in progress); False, none (a loss); None, unknown or another
        run's stamp (a suspect, judged in the background)."""
        if place < self.n:
            return marker_exists(reply)
        found = identity(reply)
        if found is None:
            return None
        run_id, marker = found
        if marker is None:
            return False
        if not ours(marker):
            self.of_other_format(place, other_format(marker_format(marker)))
            return None
        self.health.marker_seen = True
        if stamped_run(marker) == run_id:
            return True
        if self.health.identified(place, run_id, marker):
            logger.info("redlock.node_restarted", node=self.where(place), run_id=run_id,
                        stamped=stamped_run(marker) or "")
        return None

    def _majority_lost(self, missing: int, outcomes: Sequence[NodeResult]) -> ClusterAmnesiaError:
        return ClusterAmnesiaError(
            f"{missing} of {self.n} nodes have no node marker (they lost their data: restart"
            " without persistence, FLUSHALL, failover to an empty replica; or a new"
            " cluster's initialisation was interrupted): fence tokens could go backwards,"
            " so no lock can be granted. Restore the nodes' data if you can; else, once every"
            " lock held before has expired (at most max_ttl; `redlock repair` says when),"
            " run `redlock initialise --force` (redlock.admin: initialise(force=True)): tokens may"
            " then restart below earlier ones, which fenced stores refuse until the"
            " counters pass them. An interrupted initialisation, where fewer than a quorum"
            " of nodes ever had a marker, needs only `redlock initialise`.",
            outcomes=outcomes)

    def incompatible_error(self, what: str, resource: str,
                           outcomes: Sequence[NodeResult]) -> NodeFormatError:
        """An acquire that too few nodes are left for because some are of another
        format (docs/design.md §4.1): retrying cannot help, upgrading this client does."""
        found = [r for r in outcomes if r.outcome is Outcome.INCOMPATIBLE]
        nodes = "; ".join(f"node {r.node} was {r.detail}" for r in found)
        return NodeFormatError(
            f"could not acquire {what}: {nodes}; upgrade this client: it must not use such a"
            f" node, and too few others are left for a quorum (docs/operations.md,"
            f" \"Upgrading: the node format\"). Per node: {'; '.join(map(str, outcomes))}",
            resource=resource, outcomes=outcomes)

    def _init_markers(self, places: Sequence[int], deadline: Deadline) -> Broadcast:
        text = f"initialised at={self.env.wall_clock():.3f} by={self.env.random_hex(8)}"
        return Broadcast(tuple(
            self.call(p, (text,), node_scripts.INIT_MARKER,
                      (self.keys_of(p).marker, self.keys_of(p).episode)) for p in places),
            deadline.bound(self.timeout()))

    # -- background maintenance ---------------------------------------------------

