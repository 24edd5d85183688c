"""What the sync and asyncio transports share: rendering calls as commands, and the
bookkeeping of connections parked behind an unanswered acquire (docs/design.md §5).

An acquire script that got no reply in time (a timeout, or the caller was
interrupted) may still run on its node later: a hung node works through its socket
when it comes back, and a lost reply means it already did. Its connection is
therefore kept, not closed, so that the release for the same owner can be written
*behind* it on the same socket: the node then runs our release after our acquire,
in order, whenever it gets to them. A release on a new connection would wait for a
handshake that a hung node never answers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redlock import _scripts as scripts
from redlock._protocol import Call

Conn = TypeVar("Conn")

# Unanswered acquires kept per node; beyond this the oldest connection is closed.
PARKED_PER_NODE = 16


def render(call: Call, *, evalsha: bool) -> tuple[Any, ...]:
    """The command for a call: EVALSHA first, EVAL with the body after NOSCRIPT."""
    if call.script is None:
        return call.args
    head = ("EVALSHA", call.script.sha) if evalsha else ("EVAL", call.script.source)
    return (*head, len(call.keys), *call.keys, *call.args)


@dataclass(frozen=True)
class _Parked(Generic[Conn]):
    conn: Conn
    lock_key: str
    owner: object


class ParkedAcquires(Generic[Conn]):
    """Per node, the connections whose acquire got no reply (thread-safe)."""

    def __init__(self, node_count: int) -> None:
        self._parked: list[list[_Parked[Conn]]] = [[] for _ in range(node_count)]
        self._mutex = threading.Lock()

    @staticmethod
    def wants(call: Call) -> bool:
        """Only acquires are parked: other calls leave no key behind."""
        return call.script is scripts.ACQUIRE

    @staticmethod
    def wants_trail(call: Call) -> bool:
        """Releases are what is written behind a parked acquire."""
        return call.script is scripts.RELEASE

    def park(self, call: Call, conn: Conn) -> Conn | None:
        """Keep ``conn`` for ``call``'s owner; returns an evicted connection to close."""
        with self._mutex:
            parked = self._parked[call.node]
            parked.append(_Parked(conn, call.keys[0], call.args[0]))
            if len(parked) > PARKED_PER_NODE:
                return parked.pop(0).conn
        return None

    def any(self) -> bool:
        return any(self._parked)

    def take_for(self, release: Call) -> list[Conn]:
        """The parked connections of the release's owner on its node (removed)."""
        if not self.wants_trail(release):
            return []
        key = (release.keys[0], release.args[0])
        with self._mutex:
            parked = self._parked[release.node]
            if not parked:
                return []
            mine = [p for p in parked if (p.lock_key, p.owner) == key]
            if mine:
                self._parked[release.node] = [p for p in parked if p not in mine]
        return [p.conn for p in mine]

    def drain(self) -> Sequence[tuple[int, Conn]]:
        """Every parked connection (removed), for closing."""
        with self._mutex:
            drained = [(node, p.conn) for node, items in enumerate(self._parked)
                       for p in items]
            for items in self._parked:
                items.clear()
        return drained
