"""Repairing nodes that lost their data, and the admin steps around it (docs/design.md §4.5,
§4.8): counters re-seeded from a majority of healthy nodes, then the marker given back, which the
node refuses before its episode's rejoin time (§4.3.1). A node of another format is reported and
left alone. ``initialise()`` ends an interrupted initialisation and, forced, a majority's loss."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from redlock._core.amnesia.episodes import judge, open_episodes
from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.kinds import SLOT_COUNTER
from redlock._core.requests import Broadcast, Call, CommandArg, Flow, ask_one
from redlock._core.tokens import COUNTER_BUCKETS
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock._scripts.replies import (
    RepairFinished,
    acked,
    epoch_seeded,
    failure_detail,
    foreign,
    hash_fields,
    identity,
    is_healthy,
    marker_format,
    other_format,
    repair_finished,
    text,
)

logger = get_logger("redlock.nodes")



class RepairStatus(str, enum.Enum):
    """What repair() or initialise() found or did on one node."""

    __str__ = str.__str__

    HEALTHY = "healthy"  # it has its marker (or the cluster was never initialised)
    REPAIRED = "repaired"  # its counters re-seeded, its marker given back
    INITIALISED = "initialised"  # given its first marker by initialise()
    WAITING = "waiting"  # lost its data; rejoins at its episode's rejoin time
    FAILED = "failed"  # unreachable, or the step refused (``detail`` says why)


@dataclass(frozen=True)
class RepairReport:
    node: str
    status: RepairStatus
    detail: str = ""


def _why(reply: object) -> str:
    return failure_detail(reply)


def _of_other_format(reply: object) -> str:
    """Why a node whose IDENTIFY reply shows a marker of another format is left alone."""
    found = identity(reply)
    found_format = marker_format(found[1]) if found and found[1] is not None else None
    return f"{other_format(found_format)}: upgrade this client"


def repair_node(guard: AmnesiaGuard, target: int, *, force: bool,
                sources: Sequence[int] | None = None) -> Flow[RepairReport]:
    """Re-seed ``target``'s fence counters, then give it its marker back (if its episode
    is one ``max_ttl`` old, or ``force``). ``target`` is a place (a node, or a hash slot of
    a cluster node: docs/design.md §11.4). ``sources``: the places to read counters from
    (all of them must answer); by default every healthy peer, of which a quorum must."""
    address = guard.where(target)
    timeout = guard.settings.repair_timeout
    keys = guard.keys_of(target)
    repair_id = guard.env.random_hex(8)
    claim = keys.repair_guard
    claimed = yield from ask_one(guard.call(target, ("SET", claim, repair_id, "NX", "PX",
                                                     int(timeout * 1000 * 30))), timeout)
    if isinstance(claimed, BaseException) or claimed is None:
        detail = failure_detail(claimed) if isinstance(claimed, BaseException) else "busy"
        return RepairReport(address, RepairStatus.FAILED, f"could not claim the repair: {detail}")
    if guard.floored(target):  # (no peer to read: its master's epoch instead)
        seeded = epoch_seeded((yield from ask_one(guard.call(
            target, (repair_id,), node_scripts.SEED_EPOCH, (claim, keys.counter)), timeout)))
        if isinstance(seeded, str):
            yield from ask_one(guard.call(target, ("DEL", claim)), timeout)
            return RepairReport(address, RepairStatus.FAILED, seeded)
        seed, complete = {SLOT_COUNTER: seeded}, 0
    else:
        found = yield from _seed_from_peers(guard, target, claim, repair_id, sources)
        if isinstance(found, RepairReport):
            return found
        seed, complete = found
    highest = max(seed.values(), default=0)
    done = yield from ask_one(guard.call(
        target, (repair_id, f"repaired at={guard.env.wall_clock():.3f} by={repair_id}",
                 "0" if force else "1"),
        node_scripts.FINISH_REPAIR, (claim, keys.marker, keys.episode)), timeout)
    finished = repair_finished(done)
    if finished is RepairFinished.TOO_YOUNG:
        yield from ask_one(guard.call(target, ("DEL", claim)), timeout)
        # Its episode is read again now, and the repair comes when that says (not one
        # repair_interval later: this was no failure).
        guard.health.episode_unknown(target)
        guard.health.last_try.pop(target, None)
        yield from open_episodes(guard, [target])
        return RepairReport(address, RepairStatus.WAITING, "its rejoin time has not come by its"
                            " clock (it lost data again, or restarted)")
    if finished is not RepairFinished.WRITTEN:
        return RepairReport(address, RepairStatus.FAILED, f"marker not written: {done!r}")
    guard.health.healthy(target)
    logger.warning("redlock.node_repaired", node=address, counters=len(seed), highest=highest,
                   sources=complete)
    return RepairReport(address, RepairStatus.REPAIRED,
                        f"{len(seed)} fence counters re-seeded (highest {highest})")


def _seed_from_peers(guard: AmnesiaGuard, target: int, claim: str, repair_id: str,
                     sources: Sequence[int] | None
                     ) -> Flow[tuple[dict[str, int], int] | RepairReport]:
    """Re-seed ``target``'s counters from its peers (docs/design.md §4.5, §11.4): the
    seed written and how many peers it was read from, or the report of why not."""
    layout, timeout = guard.layout, guard.settings.repair_timeout
    address, keys = guard.where(target), guard.keys_of(target)
    unhealthy = 1  # the target
    covering = {i: layout.covering(i, target) for i in range(guard.n)}
    if sources is None:
        node = layout.node_of(target)
        others = [i for i in range(guard.n) if i != node]
        places = [p for i in others for p in covering[i]]
        probe = iter((yield Broadcast(tuple(guard.identify(p) for p in places), timeout)))
        readers = []
        for i in others:
            found = [next(probe) for _ in covering[i]]
            if all(is_healthy(reply) for reply in found):
                readers.append(i)
            # Peers that answered without a marker of their own run lost data too (or
            # are suspects): with the target, a majority of them means no repair can
            # succeed.
            elif all(identity(reply) is not None for reply in found):
                unhealthy += 1
        needed = guard.quorum
    else:
        readers, needed = list(sources), len(sources)
    seed: dict[str, int] = {}
    complete = 0
    for source in readers:
        counters = yield from read_counters(guard, covering[source])
        if counters is None:
            continue
        complete += 1
        if layout.slot_of(target) >= 0:  # a hash slot's one counter (§11.4)
            counters = {SLOT_COUNTER: max(counters.values(), default=0)}
        elif source in layout.clusters:  # one number for every bucket (§11.4)
            highest = max(counters.values(), default=0)
            counters = {str(b): highest for b in range(COUNTER_BUCKETS)} if highest else {}
        for field, value in counters.items():
            seed[field] = max(value, seed.get(field, 0))
    # Max over a majority of the healthy nodes intersects every committed token's
    # commit set (q - 1 healthy members + q readers > N - 1 healthy nodes).
    if complete < needed:
        yield from ask_one(guard.call(target, ("DEL", claim)), timeout)
        hint = ""
        if sources is None and unhealthy >= guard.quorum:
            hint = ("; a majority of the nodes lost their data or are not trusted, so no"
                    " repair can succeed and no lock can be granted: restore their data, or"
                    " once every lock held before the loss has expired run `redlock"
                    " initialise --force` (tokens may then restart below earlier ones,"
                    " which fenced stores refuse; docs/design.md §4.8)")
        elif sources is None:
            hint = "; the others could not be read now: repair tries again"
        return RepairReport(address, RepairStatus.FAILED,
                            f"read counters from {complete} healthy nodes, need {needed}{hint}")
    pairs = [arg for field, value in sorted(seed.items()) for arg in (field, value)]
    seeded = yield from ask_one(guard.call(target, (repair_id, *pairs),
                                           node_scripts.SEED_COUNTERS, (claim, keys.counter)),
                                timeout)
    if not acked(seeded):
        return RepairReport(address, RepairStatus.FAILED, f"seeding interrupted: {seeded!r}")
    return seed, complete


def read_counters(guard: AmnesiaGuard, places: Sequence[int]
                  ) -> Flow[dict[str, int] | None]:
    """The fence counters of a node's ``places`` (HGETALL of each; a field found in
    several, its highest); or None if any could not be read."""
    replies = yield Broadcast(tuple(guard.call(p, ("HGETALL", guard.keys_of(p).counter))
                                    for p in places), guard.settings.repair_timeout)
    counters: dict[str, int] = {}
    for reply in replies:
        if isinstance(reply, BaseException):
            return None
        for field, value in hash_fields(reply).items():
            counters[field] = max(int(value), counters.get(field, 0))
    return counters


_SCAN_PAGES = 1_000_000  # bounded: SCAN terminates, this only guards a bug


def _scan_page(guard: AmnesiaGuard, node: int, cursor: CommandArg, pattern: str,
               count: int = 1000) -> Flow[tuple[CommandArg, list[str]] | None]:
    """One SCAN page of ``pattern`` on ``node``: (next cursor, keys), or None if it could
    not be read. The cursor is 0 after the last page."""
    page = yield from ask_one(Call(node, ("SCAN", cursor, "MATCH", pattern, "COUNT", count)),
                              guard.settings.repair_timeout)
    if not isinstance(page, list | tuple) or len(page) != 2:
        return None
    return page[0], [text(k) for k in page[1]]


def repair(guard: AmnesiaGuard, *, force: bool) -> Flow[list[RepairReport]]:
    """Look at every node; judge restarted ones, and repair those that lost their data
    once their episode's rejoin time has come by their own clock (or at once: ``force``,
    when every lock held before the loss has certainly expired)."""
    timeout = guard.settings.repair_timeout
    probe = yield Broadcast(tuple(guard.identify_call(i) for i in range(guard.n)), timeout)
    reports = _clusters_not_read(guard)
    guard.identified({i: reply for i, reply in enumerate(probe) if i not in reports})
    marked = [i for i, reply in enumerate(probe) if (found := identity(reply)) and found[1]]
    if marked:
        guard.health.marker_seen = True
    for i, reply in enumerate(probe):
        if i in reports:
            continue
        if identity(reply) is None:
            reports[i] = RepairReport(guard.addresses[i], RepairStatus.FAILED, _why(reply))
        elif foreign(reply):  # a newer release's node (docs/design.md §4.1): not ours
            reports[i] = RepairReport(guard.addresses[i], RepairStatus.FAILED,
                                      _of_other_format(reply))
    if not guard.health.marker_seen:
        for i in range(guard.n):
            reports.setdefault(i, RepairReport(guard.addresses[i], RepairStatus.HEALTHY,
                                               "uninitialised cluster"))
        return [reports[i] for i in range(guard.n)]
    if guard.health.suspect:
        yield from judge(guard, dict(guard.health.suspect))
    for i in range(guard.n):
        if i not in reports and i not in marked:
            guard.health.lost_data(i)
    # Nodes without a marker, and those judge() just demoted: their episodes.
    yield from open_episodes(guard, [i for i, due in list(guard.health.unmarked.items())
                                    if due is None and i not in reports])
    now = guard.clock()
    for i in sorted(p for p in guard.health.benched() - set(reports) if p < guard.n):
        wait = guard.health.rejoins_in(i, now)
        if i in guard.health.suspect:
            reports[i] = RepairReport(guard.addresses[i], RepairStatus.FAILED,
                                      "restarted; its persistence could not be checked")
        elif force or wait == 0.0:
            reports[i] = yield from repair_node(guard, i, force=force)
        elif wait is not None:
            reports[i] = RepairReport(guard.addresses[i], RepairStatus.WAITING,
                                      f"rejoins in {wait:.1f} s, once every lock it may have"
                                      f" granted before it lost its data has expired"
                                      f"{_meanwhile(guard, reports, now)}")
        else:
            reports[i] = RepairReport(guard.addresses[i], RepairStatus.FAILED, "episode unreadable")
    for i in range(guard.n):
        reports.setdefault(i, RepairReport(guard.addresses[i], RepairStatus.HEALTHY))
    return [reports[i] for i in range(guard.n)]


def _clusters_not_read(guard: AmnesiaGuard) -> dict[int, RepairReport]:
    """The cluster nodes, which ``repair()`` and ``initialise()`` do not read yet: each of
    their hash slots is judged and repaired by the manager's maintenance (docs/design.md
    §11.4), not by these whole-node steps."""
    return {i: RepairReport(guard.addresses[i], RepairStatus.FAILED,
                            "a Redis Cluster node: its hash slots are repaired by the"
                            " manager's background maintenance, not by this command")
            for i in sorted(guard.layout.clusters)}


def _meanwhile(guard: AmnesiaGuard, reports: dict[int, RepairReport], now: float) -> str:
    """What a waiting node's absence means for the cluster: nothing, or, when fewer than
    a quorum of nodes are healthy now, that no lock can be granted and what to do."""
    out = guard.health.benched() | set(reports)
    healthy = [i for i in range(guard.n) if i not in out]
    if guard.membership.rule.met(healthy):
        return ""
    waits = [w for i in guard.health.benched() if (w := guard.health.rejoins_in(i, now))]
    lost = len(guard.health.unmarked)
    if lost >= guard.quorum:
        return (f"; {lost} of {guard.n} nodes lost their data, a majority: no lock can be"
                " granted, and their fence counters cannot be re-seeded from a quorum."
                " Restore their data if you can; else, once every lock held before has"
                f" expired (in {max(waits, default=0.0):.1f} s), run `redlock initialise"
                " --force`: tokens may then restart below earlier ones, which fenced stores"
                " refuse until the counters pass them")
    return (f"; only {len(healthy)} of {guard.n} nodes are healthy meanwhile, fewer than a"
            f" quorum: no lock can be granted for {min(waits, default=0.0):.1f} s, until the"
            " first of them rejoins (nothing to do: repair runs by itself)")


def _is_blank(guard: AmnesiaGuard, node: int) -> Flow[bool]:
    """No amnesia episode and no key of the namespace (the whole keyspace scanned)."""
    timeout = guard.settings.repair_timeout
    episode = yield from ask_one(Call(node, ("EXISTS", guard.keys.episode)), timeout)
    if episode != 0:
        return False
    cursor: CommandArg = 0
    for _ in range(_SCAN_PAGES):
        page = yield from _scan_page(guard, node, cursor, f"{guard.keys.namespace}:*")
        if page is None or page[1]:
            return False  # unreadable, or a key of ours
        cursor = page[0]
        if int(cursor) == 0:
            return True
    return False


def initialise(guard: AmnesiaGuard, *, force: bool) -> Flow[list[RepairReport]]:
    """Give every node without its marker one: a new cluster, or the rest of an
    interrupted initialisation (nodes that never held anything). ``force``: also nodes
    that lost their data (a majority, or while the cluster cannot repair them), after
    seeding their counters from every node that has its marker; only once every lock
    held before has expired, and tokens may then restart below earlier ones (the fenced
    stores reject them until they catch up). Every node must answer."""
    timeout = guard.settings.repair_timeout
    clusters = _clusters_not_read(guard)
    if clusters:
        return [clusters.get(i) or RepairReport(guard.addresses[i], RepairStatus.HEALTHY,
                                                "not changed: a node is a Redis Cluster")
                for i in range(guard.n)]
    probe = yield Broadcast(tuple(guard.identify_call(i) for i in range(guard.n)), timeout)
    silent = [i for i, reply in enumerate(probe) if identity(reply) is None]
    if silent:
        return [RepairReport(guard.addresses[i], RepairStatus.FAILED, _why(probe[i])) if i in silent
                else RepairReport(guard.addresses[i], RepairStatus.HEALTHY,
                                  "not changed: every node must answer")
                for i in range(guard.n)]
    other = [i for i, reply in enumerate(probe) if foreign(reply)]
    if other:  # a newer release's nodes (docs/design.md §4.1): neither read nor marked
        return [RepairReport(guard.addresses[i], RepairStatus.FAILED, _of_other_format(probe[i]))
                if i in other else
                RepairReport(guard.addresses[i], RepairStatus.HEALTHY,
                             "not changed: some node is of another format")
                for i in range(guard.n)]
    marked = [i for i, reply in enumerate(probe) if (identity(reply) or ("", None))[1] is not None]
    unmarked = [i for i in range(guard.n) if i not in marked]
    reports = {i: RepairReport(guard.addresses[i], RepairStatus.HEALTHY) for i in marked}
    if unmarked and not force:
        if len(marked) >= guard.quorum:
            # A quorum has markers: locks may have been granted, and a node without one
            # lost its data. It rejoins through repair, after max_ttl.
            for i in unmarked:
                reports[i] = RepairReport(
                    guard.addresses[i], RepairStatus.FAILED, "a quorum of nodes has markers:"
                    " this node lost its data; repair() brings it back one max_ttl after the loss"
                    " (or initialise(force=True) once every lock held before has expired)")
        else:
            # Nodes that never held anything: no episode, no key of the namespace.
            for i in unmarked:
                blank = yield from _is_blank(guard, i)
                if not blank:
                    reports[i] = RepairReport(
                        guard.addresses[i], RepairStatus.FAILED, "it lost data (it holds keys or an"
                        " amnesia episode): initialise(force=True) once every lock held"
                        " before has expired (max_ttl)")
    for i in unmarked:
        if i in reports:
            continue
        report = yield from repair_node(guard, i, force=True, sources=marked)
        reports[i] = (RepairReport(report.node, RepairStatus.INITIALISED, report.detail)
                      if report.status is RepairStatus.REPAIRED else report)
    if all(r.status in (RepairStatus.HEALTHY, RepairStatus.INITIALISED) for r in reports.values()):
        guard.health.marker_seen = True
        logger.warning("redlock.cluster_initialised_by_hand", nodes=guard.n,
                       initialised=len(unmarked), forced=force)
    return [reports[i] for i in range(guard.n)]
