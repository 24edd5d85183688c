"""Restarted and amnesiac nodes, seen to in the background (docs/design.md §4.3, §4.4): markers
without a known server run adopted, restarted nodes judged (re-stamped if durable, else demoted),
amnesia episodes opened on the nodes and read (when each node may rejoin). Never on an acquire's
path: :mod:`redlock._core.amnesia.maintenance` runs these, and ``repair()`` too."""

from __future__ import annotations

import math
from collections.abc import Sequence

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.requests import Broadcast, Call, Flow, ask_one
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
    calls = tuple(Call(node, (marker, f"adopted at={guard.env.wall_clock():.3f}", run_id),
                       node_scripts.RESTAMP, (guard.keys.marker,))
                  for node, (marker, run_id) in markers.items())
    replies = yield Broadcast(calls, guard.settings.repair_timeout)
    for (node, found), reply in zip(markers.items(), replies, strict=True):
        guard.health.adopted(node, found)
        if acked(reply):
            logger.info("redlock.node_marker_adopted", node=guard.addresses[node], run_id=found[1])
        # Otherwise the marker or the server changed meanwhile: the next connection
        # identifies it again (a node that did not answer is looked at then, too).


def lease_bound(guard: AmnesiaGuard, node: int) -> Flow[tuple[float, str]]:
    """How long ``node``, which lost data, must stay out so that every lease it may have
    granted before the loss has expired (docs/design.md §4.3.1), and what bounds it: the
    lease horizons of its peers, read now, if they cover every quorum it could have been
    part of; else ``max_ttl`` (and the node is noted, to be bounded again later)."""
    settings = guard.settings
    others = [i for i in range(guard.n) if i != node]
    replies = yield Broadcast(tuple(
        Call(i, (), node_scripts.HORIZON,
             (guard.keys.marker, guard.keys.episode, guard.keys.horizon)) for i in others),
        settings.repair_timeout)
    bounds, unknown = [], {node}
    for i, reply in zip(others, replies, strict=True):
        found = horizon(reply)
        if found is not None and found.healthy:
            bounds.append(found.leases)  # its leases end within its horizon
        elif found is not None and found.rejoins is not None:
            bounds.append(max(found.leases, found.rejoins))  # out itself until then
        else:
            unknown.add(i)  # silent, suspected of a restart, or lost data unbounded
    if guard.membership.rule.met(unknown):
        guard.health.unbounded.add(node)
        silent = ", ".join(guard.addresses[i] for i in sorted(unknown - {node}))
        return settings.max_ttl, (f"max_ttl: what {silent} granted could not be read, and a"
                                  " quorum could have granted with it there")
    guard.health.unbounded.discard(node)
    longest = max(bounds, default=0.0)
    return (longest + settings.drift(longest),
            f"the longest lease its peers granted or extended: {longest:.3f} s")


def judge(guard: AmnesiaGuard, suspects: dict[int, tuple[bytes, str]]) -> Flow[None]:
    """A restarted node: re-stamp it if nothing it acknowledged can have been lost,
    else turn the restart into an amnesia episode."""
    timeout = guard.settings.repair_timeout
    nodes = list(suspects)
    calls = tuple(call for i in nodes for call in (
        Call(i, ("CONFIG", "GET", "appendonly")), Call(i, ("CONFIG", "GET", "appendfsync")),
        Call(i, ("INFO", "replication"))))
    replies = yield Broadcast(calls, timeout)
    for k, node in enumerate(nodes):
        appendonly, appendfsync, replication = replies[3 * k:3 * k + 3]
        why = not_durable(appendonly, appendfsync, replication)
        marker, run_id = suspects[node]
        if why is None and not isinstance(replication, BaseException):
            done = yield from ask_one(Call(
                node, (marker, f"restamped at={guard.env.wall_clock():.3f}", run_id),
                node_scripts.RESTAMP, (guard.keys.marker,)), timeout)
            if acked(done):
                guard.health.healthy(node)
                logger.info("redlock.node_restamped", node=guard.addresses[node])
                continue
        elif why is not None:
            wait, bound = yield from lease_bound(guard, node)
            done = demoted((yield from ask_one(Call(
                node, (marker, why, max(1, math.ceil(wait * 1000))), node_scripts.DEMOTE,
                (guard.keys.marker, guard.keys.episode)), timeout)))
            if done is not None:
                guard.health.lost_data(node)
                guard.health.rejoins_at(node, guard.clock() + done.left)
                logger.warning("redlock.node_amnesiac", node=guard.addresses[node])
                logger.info("redlock.node_out", node=guard.addresses[node],
                            rejoins_after_s=round(done.left, 3), bounded_by=bound)
                continue
        # Unreachable, or the marker changed meanwhile: look at the node again.
        again = identity((yield from ask_one(guard.identify_call(node), timeout)))
        if again is not None:
            guard.health.identified(node, *again)


def open_episodes(guard: AmnesiaGuard, nodes: Sequence[int]) -> Flow[None]:
    """Begin (or read) the amnesia episode of nodes without their marker, each bounded
    by its peers' lease horizons (:func:`lease_bound`; an episode already open keeps the
    earlier of its rejoin time and this one), and from it when each may rejoin."""
    for node in nodes:
        wait, bound = yield from lease_bound(guard, node)
        reply = yield from ask_one(Call(
            node, ("lost its node marker", max(1, math.ceil(wait * 1000))),
            node_scripts.OPEN_EPISODE, (guard.keys.marker, guard.keys.episode)),
            guard.settings.repair_timeout)
        now = guard.clock()
        found = episode(reply)
        if found is None:
            continue  # unreachable: try again later
        if found.marked:
            guard.health.marked(node)  # repaired meanwhile (by another client)...
            if not ours(found.marker):  # ...of a newer release (docs/design.md §4.1)
                guard.of_other_format(node, other_format(marker_format(found.marker)))
            continue
        first = guard.health.unmarked.get(node) is None
        guard.health.rejoins_at(node, now + found.left)
        if first:
            logger.info("redlock.node_out", node=guard.addresses[node],
                        rejoins_after_s=round(found.left, 3), bounded_by=bound)
