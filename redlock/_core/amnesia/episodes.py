"""Restarted and amnesiac nodes, seen to in the background (docs/design.md §4.3, §4.4): markers
without a known server run adopted, restarted nodes judged (re-stamped if durable, else demoted),
amnesia episodes opened on the nodes and read (when each node may rejoin). Never on an acquire's
path: :mod:`redlock._core.amnesia.maintenance` runs these, and ``repair()`` too. Each works on
*places* (a standalone node, or a hash slot of a cluster node: docs/design.md §11.4)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.requests import Broadcast, Flow, ask_one
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock._scripts.node_config import not_durable
from redlock._scripts.replies import (
    acked,
    demoted,
    episode,
    horizon,
    identity,
    marker_format,
    other_format,
    ours,
)

logger = get_logger("redlock.nodes")


def adopt_markers(guard: AmnesiaGuard, markers: dict[int, tuple[bytes, str]]) -> Flow[None]:
    """Stamp unstamped markers (see NodeHealth.identified) with the run id found."""
    calls = tuple(guard.call(place, (marker, f"adopted at={guard.env.wall_clock():.3f}",
                                     run_id),
                             node_scripts.RESTAMP, (guard.keys_of(place).marker,))
                  for place, (marker, run_id) in markers.items())
    replies = yield Broadcast(calls, guard.settings.repair_timeout)
    for (place, found), reply in zip(markers.items(), replies, strict=True):
        guard.health.adopted(place, found)
        if acked(reply):
            logger.info("redlock.node_marker_adopted", node=guard.where(place), run_id=found[1])
        # Otherwise the marker or the server changed meanwhile: the next connection
        # identifies it again (a node that did not answer is looked at then, too).


def lease_bound(guard: AmnesiaGuard, place: int) -> Flow[tuple[float, str]]:
    """How long ``place``, which lost data, must stay out so that every lease it may have
    granted before the loss has expired (docs/design.md §4.3.1), and what bounds it: the
    lease horizons its peers hold for what it holds (a cluster peer's, for a standalone
    node, all its hash slots'), read now, if they cover every quorum it could have been
    part of; else ``max_ttl`` (and the place is noted, to be bounded again later)."""
    settings, layout = guard.settings, guard.layout
    node = layout.node_of(place)
    peers = {i: layout.covering(i, place) for i in range(guard.n) if i != node}
    calls = []
    for covering in peers.values():
        for peer in covering:
            keys = guard.keys_of(peer)
            calls.append(guard.call(peer, (), node_scripts.HORIZON,
                                    (keys.marker, keys.episode, keys.horizon)))
    replies = iter((yield Broadcast(tuple(calls), settings.repair_timeout)))
    bounds, unknown = [], {node}
    for i, covering in peers.items():
        bound: float | None = 0.0
        for found in (horizon(next(replies)) for _ in covering):
            if bound is None:
                continue
            if found is not None and found.healthy:
                bound = max(bound, found.leases)  # its leases end within its horizon
            elif found is not None and found.rejoins is not None:
                bound = max(bound, found.leases, found.rejoins)  # out itself until then
            else:
                bound = None  # silent, suspected of a restart, or lost data unbounded
        if bound is None:
            unknown.add(i)
        else:
            bounds.append(bound)
    if guard.membership.rule.met(unknown):
        guard.health.unbounded.add(place)
        silent = ", ".join(guard.addresses[i] for i in sorted(unknown - {node}))
        return settings.max_ttl, (f"max_ttl: what {silent} granted could not be read, and a"
                                  " quorum could have granted with it there")
    guard.health.unbounded.discard(place)
    longest = max(bounds, default=0.0)
    return (longest + settings.drift(longest),
            f"the longest lease its peers granted or extended: {longest:.3f} s")


def judge(guard: AmnesiaGuard, suspects: dict[int, tuple[bytes, str]]) -> Flow[None]:
    """A restarted node (or a hash slot stamped by another server): re-stamp it if
    nothing it acknowledged can have been lost, else turn it into an amnesia episode.
    On a hash slot, every call is routed to the master serving it."""
    timeout = guard.settings.repair_timeout
    places = list(suspects)
    calls = tuple(call for p in places for call in (
        guard.call(p, ("CONFIG", "GET", "appendonly")),
        guard.call(p, ("CONFIG", "GET", "appendfsync")),
        guard.call(p, ("INFO", "replication"))))
    replies = yield Broadcast(calls, timeout)
    for k, place in enumerate(places):
        appendonly, appendfsync, replication = replies[3 * k:3 * k + 3]
        why = not_durable(appendonly, appendfsync, replication)
        marker, run_id = suspects[place]
        keys = guard.keys_of(place)
        if why is None and not isinstance(replication, BaseException):
            done = yield from ask_one(guard.call(
                place, (marker, f"restamped at={guard.env.wall_clock():.3f}", run_id),
                node_scripts.RESTAMP, (keys.marker,)), timeout)
            if acked(done):
                guard.health.healthy(place)
                logger.info("redlock.node_restamped", node=guard.where(place))
                continue
        elif why is not None:
            wait, bound = yield from lease_bound(guard, place)
            done = demoted((yield from ask_one(guard.call(
                place, (marker, why, max(1, math.ceil(wait * 1000))), node_scripts.DEMOTE,
                (keys.marker, keys.episode)), timeout)))
            if done is not None:
                guard.health.lost_data(place)
                guard.health.rejoins_at(place, guard.clock() + done.left)
                logger.warning("redlock.node_amnesiac", node=guard.where(place))
                logger.info("redlock.node_out", node=guard.where(place),
                            rejoins_after_s=round(done.left, 3), bounded_by=bound)
                continue
        # Unreachable, or the marker changed meanwhile: look at it again.
        again = identity((yield from ask_one(guard.identify(place), timeout)))
        if again is not None:
            guard.health.identified(place, *again)


def open_episodes(guard: AmnesiaGuard, places: Sequence[int]) -> Flow[None]:
    """Begin (or read) the amnesia episode of places without their marker, each bounded
    by its peers' lease horizons (:func:`lease_bound`; an episode already open keeps the
    earlier of its rejoin time and this one), and from it when each may rejoin."""
    for place in places:
        keys = guard.keys_of(place)
        wait, bound = yield from lease_bound(guard, place)
        reply = yield from ask_one(guard.call(
            place, ("lost its node marker", max(1, math.ceil(wait * 1000))),
            node_scripts.OPEN_EPISODE, (keys.marker, keys.episode)),
            guard.settings.repair_timeout)
        now = guard.clock()
        found = episode(reply)
        if found is None:
            continue  # unreachable: try again later
        if found.marked:
            guard.health.marked(place)  # repaired meanwhile (by another client)...
            if not ours(found.marker):  # ...of a newer release (docs/design.md §4.1)
                guard.of_other_format(place, other_format(marker_format(found.marker)))
            continue
        first = guard.health.unmarked.get(place) is None
        guard.health.rejoins_at(place, now + found.left)
        if first:
            logger.info("redlock.node_out", node=guard.where(place),
                        rejoins_after_s=round(found.left, 3), bounded_by=bound)
