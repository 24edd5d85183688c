"""Restarted and amnesiac nodes, seen to in the background (docs/design.md §4.3, §4.4):
markers without a known server run adopted, restarted nodes judged (re-stamped if
durable, else demoted), amnesia episodes opened on the nodes and read (when each node
may rejoin). Never on an acquire's path: :mod:`redlock._core.amnesia.maintenance` runs
these, and ``repair()`` too."""

from __future__ import annotations

from collections.abc import Sequence

from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.requests import Broadcast, Call, Flow, ask_one
from redlock._observe.log import get_logger
from redlock._scripts import node as node_scripts
from redlock._scripts.node_config import not_durable
from redlock._scripts.replies import (
    acked,
    episode,
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
            logger.info("redlock.node_marker_adopted", node=guard.addresses[node],
                        run_id=found[1])
        # Otherwise the marker or the server changed meanwhile: the next connection
        # identifies it again (a node that did not answer is looked at then, too).


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
            done = yield from ask_one(Call(
                node, (marker, why), node_scripts.DEMOTE,
                (guard.keys.marker, guard.keys.episode)), timeout)
            if acked(done):
                guard.health.lost_data(node)
                logger.warning("redlock.node_amnesiac", node=guard.addresses[node],
                               rejoins_after_s=guard.settings.max_ttl)
                continue
        # Unreachable, or the marker changed meanwhile: look at the node again.
        again = identity((yield from ask_one(guard.identify_call(node), timeout)))
        if again is not None:
            guard.health.identified(node, *again)


def open_episodes(guard: AmnesiaGuard, nodes: Sequence[int]) -> Flow[None]:
    """Begin (or read) the amnesia episode of nodes without their marker, and from it
    when each may rejoin."""
    if not nodes:
        return
    replies = yield Broadcast(tuple(
        Call(i, ("lost its node marker",), node_scripts.OPEN_EPISODE,
             (guard.keys.marker, guard.keys.episode)) for i in nodes),
        guard.settings.repair_timeout)
    now = guard.clock()
    for node, reply in zip(nodes, replies, strict=True):
        found = episode(reply)
        if found is None:
            continue  # unreachable: try again later
        if found.marked:
            guard.health.marked(node)  # repaired meanwhile (by another client)...
            if not ours(found.marker):  # ...of a newer release (docs/design.md §4.1)
                guard.of_other_format(node, other_format(marker_format(found.marker)))
            continue
        guard.health.rejoins_at(node, now + max(0.0, guard.settings.max_ttl - found.age))
