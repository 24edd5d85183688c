"""The sync transport's warm path (see :mod:`redlock._io.sync_transport`): the usual
request, run without the per-node bookkeeping of the general one.

The usual request has one call per node, and every node has an open connection idle
that has met its server before (no identity probe, no script bodies to send). The
general path still makes a group per node, looks up each connection through the lanes
and the pool, and writes and reads each through several layers, which shows in the
running cycle where the client shares its CPU with nodes (BENCHMARKS.md, "Issue 21",
tenth session). Here the calls are packed once, written to every node, and the replies
read as they come, in one loop.

It decides nothing of its own. The early decision is the request's (``enough``) and
the stragglers' grace is the general path's (:meth:`Silence.until`); whatever is not
plain (a failure, NOSCRIPT, a reply still incomplete after a moment of quiet, at the
deadline or when the grace ends, an interruption) is handed to the general gather as
the groups it would have made, in the state it would have left them in, so that how it
ends (read late in the background, a timeout, a discarded connection) is decided in one
place.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

from redlock._core.requests import Broadcast, Call, Replies
from redlock._io import resp
from redlock._io.connection import NOTHING, Connection, receive_ready, send
from redlock._io.failures import Unreachable, is_noscript
from redlock._io.sync_exchange import Group
from redlock._io.sync_idle import IdleConnections, with_input
from redlock._io.wire import Silence, render

__all__ = ["WarmPath"]

# A request waits here at most this long at a time for a reply; then the general gather
# waits on (a loopback reply takes ~0.1 ms; a slow network's, the general path's way).
_QUIET = 0.005


class WarmPath:
    """Runs a request the warm way when it can (see the module's doc)."""

    def __init__(self, idle: IdleConnections, silence: Silence,
                 give_back: Callable[[int, Connection], None],
                 failed: Callable[[Group, Replies, Exception], None]) -> None:
        self._idle = idle
        self._silence = silence
        self._give_back = give_back  # (node, connection): for the next request
        self._failed = failed  # (group, replies, error): the general path's own

    def take(self, request: Broadcast) -> list[Connection] | None:
        """Each call's connection, when the request is one call per node (in the nodes'
        order, no lane, no timeout to learn) and every node has an identified connection
        idle with nothing to read in it; None: nothing taken, the general path runs it."""
        if request.lane is not None or request.learn:
            return None
        taken: list[Connection] = []
        node = -1
        for call in request.calls:
            conn = self._idle.pop(call.node) if call.node > node else None
            node = call.node
            if conn is None:
                break
            taken.append(conn)
            if conn.sock is None or not conn.identified:
                break
        else:
            if not with_input(taken):  # (a server that closed one while it sat idle)
                return taken
        self._idle.push_back([c.node for c in request.calls[:len(taken)]], taken)
        return None

    def exchange(self, request: Broadcast, conns: list[Connection], replies: Replies,
                 started: float, deadline: float, rest: list[Group]) -> float:
        """Write the calls on ``conns`` and read the replies until every one is in, or
        the deadline (moved to the stragglers' grace once the request is decided).
        Returns the deadline; the groups still to finish are added to ``rest`` (for the
        general gather, or its cleanup if this is interrupted). One loop, no helper per
        node: this runs twice per acquire+release, and its bookkeeping showed (BENCHMARKS.md,
        "Issue 21", eleventh session)."""
        calls = request.calls
        silence = self._silence
        give_back = self._give_back
        waiting: dict[Any, int] = {}  # socket -> the call's index
        sent_at = [started] * len(calls)
        written = 0  # calls[:written] were written (or failed), the others never
        try:
            # (A template's calls come packed; else the nodes' calls share their command
            # nearly always: packed once.)
            data = request.packed or b""
            packed = calls[0] if request.packed is not None else None
            for conn in conns:
                call = calls[written]
                if packed is None or call.args is not packed.args \
                        or call.keys is not packed.keys or call.script is not packed.script:
                    data, packed = resp.pack_one(render(call, evalsha=True)), call
                index = written
                try:
                    send(conn, data)
                except Exception as exc:
                    written += 1
                    self._failed(_group(index, call, conn, started), replies, exc)
                    continue
                written += 1
                now = sent_at[index] = time.monotonic()
                silence.owed(call.node, now)
                waiting[conn.sock] = index
            decided, enough = 0.0, request.enough
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    ready, _, _ = select.select(list(waiting), [], [], min(left, _QUIET))
                except (OSError, TypeError, ValueError):  # a socket closed under us
                    break  # (the general gather's reads say why)
                if not ready:  # nothing for a while: the general gather waits on (and
                    break  # notices the manager's close)
                for sock in ready:
                    index = waiting[sock]
                    call, conn = calls[index], conns[index]
                    try:
                        reply = receive_ready(conn)  # (select() just said so: no second look)
                    except Exception as exc:
                        del waiting[sock]
                        self._failed(_group(index, call, conn, sent_at[index]), replies, exc)
                        continue
                    if reply is NOTHING:  # not whole yet: read again when more arrives
                        continue
                    del waiting[sock]
                    silence.heard(call.node)
                    replies.round_trips[call.node] = time.monotonic() - sent_at[index]
                    if is_noscript(reply):  # SCRIPT FLUSH since: send the body
                        group = _group(index, call, conn, sent_at[index])
                        group.sampled, group.unknown = True, [index]
                        try:
                            group.send_bodies()
                        except Exception as exc:
                            self._failed(group, replies, exc)
                            continue
                        rest.append(group)  # its reply to that is the general gather's
                        continue
                    replies[index] = reply
                    give_back(call.node, conn)
                if waiting and enough is not None and (decided or enough(replies,
                                                                         replies.identities)):
                    # Decided: the stragglers get the grace, as in the general gather.
                    now = time.monotonic()
                    decided = decided or now
                    deadline = min(deadline, silence.until(
                        started, decided, now, [calls[i].node for i in waiting.values()]))
            return deadline
        finally:
            if written < len(calls):  # interrupted while writing: the one being written
                bad = _group(written, calls[written], conns[written], started)  # is unusable
                self._failed(bad, replies, Unreachable("interrupted while writing"))
                for index in range(written + 1, len(calls)):  # the others were never used
                    give_back(calls[index].node, conns[index])
            if waiting:
                rest.extend(_group(i, calls[i], conns[i], sent_at[i]) for i in waiting.values())


def _group(index: int, call: Call, conn: Connection, sent_at: float) -> Group:
    """The general path's group for one call written on ``conn`` at ``sent_at``."""
    group = Group(call.node)
    group.indexes.append(index)
    group.calls.append(call)
    group.conn = conn
    group.sent_at = sent_at
    return group
