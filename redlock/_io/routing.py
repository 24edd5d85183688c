"""Where each call of a request goes: its *target* (docs/proposals/cluster.md P2, P2.1).
A standalone node is its own target (0..N-1); a cluster node's masters are targets N, N+1,
..., appended as the node's hash slot map names them and never reused (a master that left
keeps its number, its connections closed). The transports index every per-connection
structure by target; the core still counts replies by node.

A cluster node's hash slot map comes from ``CLUSTER SLOTS`` on the library's own connection
to one of its servers (:func:`slot_map_command`). A reply ``MOVED``, ``ASK`` or ``TRYAGAIN``
is given before a command runs, so the call provably did not run and may be sent again
(:func:`redirect_of`, followed by the transports within the request's deadline); ``MOVED``
also updates that hash slot's owner at once and marks the map for a refresh."""

from __future__ import annotations

import dataclasses
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from redlock._core.requests import Call
from redlock._io.endpoint import Endpoint
from redlock._io.failures import as_failure
from redlock._io.resp import ReplyError
from redlock._scripts.hash_slots import HASH_SLOTS, hash_slot

__all__ = ["MAX_HOPS", "REDIRECTS", "REMAP_EVERY", "UNROUTED", "Redirect", "Routes", "SlotMap",
           "redirect_of", "retry_delay", "slot_map_command", "slot_owners"]

#: A call's target while its cluster node's hash slot map is not known.
UNROUTED = -1
#: The replies that say a command did not run, for a cluster node's call to be sent again.
REDIRECTS = ("MOVED ", "ASK ", "TRYAGAIN")
#: How many times one call is sent elsewhere (MOVED, ASK) at most; past it the redirect
#: is the call's reply. (TRYAGAIN, a hash slot migrating, is retried until the deadline.)
MAX_HOPS = 8
#: A stale hash slot map is read again in the background at most this often (a request
#: that still finds it stale asks again).
REMAP_EVERY = 0.05
# TRYAGAIN: the call goes again after 1, 2, 4 ... ms, at most this long.
_RETRY_MAX = 0.032


def slot_map_command() -> tuple[str, ...]:
    """What a cluster node's hash slot map is read with (every Redis with cluster mode;
    ``CLUSTER SHARDS`` only from 7.0)."""
    return ("CLUSTER", "SLOTS")


class Redirect(NamedTuple):
    """A redirect reply, read: ``kind`` MOVED, ASK or TRYAGAIN; for the first two the hash
    slot and the master to ask."""

    kind: str
    slot: int = -1
    host: str = ""
    port: int = 0


def redirect_of(reply: object) -> Redirect | None:
    """The redirect a reply is, or None."""
    if not isinstance(reply, ReplyError):
        return None
    text = str(reply)
    if text.startswith("TRYAGAIN"):
        return Redirect("TRYAGAIN")
    if not text.startswith(("MOVED ", "ASK ")):
        return None
    parts = text.split()
    if len(parts) < 3:
        return None
    host, _, port = parts[2].rpartition(":")
    try:
        return Redirect(parts[0], int(parts[1]), host.strip("[]"), int(port))
    except ValueError:
        return None


def slot_owners(reply: object, asked_host: str) -> list[tuple[int, int, str, int]]:
    """A ``CLUSTER SLOTS`` reply, read: (first hash slot, last, master's host, port) per
    range; a master that does not know its own address ('' or '?') is at ``asked_host``.
    Raises ValueError if it is not one."""
    if not isinstance(reply, list) or not reply:
        raise ValueError(f"CLUSTER SLOTS answered {reply!r}: no hash slot is served")
    owners = []
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list):
            raise ValueError(f"CLUSTER SLOTS answered an entry {entry!r}")
        master = entry[2]
        host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
        owners.append((int(entry[0]), int(entry[1]),
                       asked_host if host in ("", "?") else host, int(master[1])))
    return owners


def retry_delay(tries: int) -> float:
    """How long a call answered TRYAGAIN ``tries`` times in a row waits to go again."""
    return float(min(0.001 * 2 ** max(tries - 1, 0), _RETRY_MAX))


class SlotMap:
    """One cluster node's hash slots: the target owning each (UNROUTED: none known)."""

    __slots__ = ("error", "known", "owners", "stale")

    def __init__(self) -> None:
        self.owners = array("i", [UNROUTED]) * HASH_SLOTS
        self.known = False  # read once at least
        self.stale = False  # a MOVED said it changed: read it again
        self.error: BaseException | None = None  # why the last reading failed


class Routes:
    """The targets of one transport, and each cluster node's hash slot map. ``grow`` is
    called (under the routes' lock) once a target is appended, before any call is routed
    to it: the transport extends its per-target lists. Thread-safe: targets are only
    appended, and a hash slot's owner is one array item."""

    def __init__(self, endpoints: Sequence[Endpoint],
                 grow: Callable[[Endpoint], None] | None = None) -> None:
        #: Per target: its endpoint, and the node it serves.
        self.endpoints: list[Endpoint] = list(endpoints)
        self.nodes: list[int] = list(range(len(self.endpoints)))
        #: Per node: its hash slot map (None: a standalone node).
        self.maps: list[SlotMap | None] = [SlotMap() if endpoint.cluster else None
                                           for endpoint in self.endpoints]
        #: Whether any node is a cluster (else every call's target is its node).
        self.clustered = any(m is not None for m in self.maps)
        self._grow = grow
        self._by_server: dict[tuple[int, str], int] = {}
        self._mutex = threading.Lock()
        #: Per cluster node, one reading of its map at a time.
        self.reading = [threading.Lock() for _ in self.maps]
        self._remapped_at = -REMAP_EVERY  # when stale maps were last read again
        self._remapping = threading.Lock()  # (held for nothing else: any caller may take it)

    def target_of(self, call: Call) -> int:
        """The target of a call: its node, or the master its node's map names for the
        hash slot of its first key (a script's keys share one, docs/design.md §11.4)."""
        slot_map = self.maps[call.node]
        if slot_map is None:
            return call.node
        keys = call.keys
        key = keys[0] if keys else ""
        return slot_map.owners[hash_slot(key if isinstance(key, str | bytes) else str(key))]

    def target(self, node: int, host: str, port: int) -> int:
        """The target for the master at ``host:port`` of cluster node ``node`` (added if new)."""
        seed = self.endpoints[node]
        endpoint = dataclasses.replace(seed, host=host or seed.host, port=port, cluster=False)
        key = (node, endpoint.server)
        found = self._by_server.get(key)
        if found is not None:
            return found
        with self._mutex:
            found = self._by_server.get(key)
            if found is not None:
                return found
            # (Appended first: a per-target list the transport sizes from the targets in
            # the meantime comes out one too long, which is harmless; never too short.)
            self.endpoints.append(endpoint)
            self.nodes.append(node)
            if self._grow is not None:
                self._grow(endpoint)
            target = self._by_server[key] = len(self.endpoints) - 1
        return target

    def moved(self, node: int, redirect: Redirect) -> int:
        """A MOVED reply from cluster node ``node``: the hash slot's new owner (its
        target), kept at once; the whole map is read again on the next occasion."""
        target = self.target(node, redirect.host, redirect.port)
        slot_map = self.maps[node]
        assert slot_map is not None
        slot_map.owners[redirect.slot] = target
        slot_map.stale = True
        return target

    def unread(self, calls: Sequence[Call]) -> tuple[list[int], bool]:
        """Before routing ``calls``: the cluster nodes among theirs whose map is not known
        (to read now), and whether a map is stale (to read again in the background)."""
        unknown = []
        for node in {call.node for call in calls}:
            slot_map = self.maps[node]
            if slot_map is not None and not slot_map.known:
                unknown.append(node)
        return unknown, self.stale()

    def stale(self) -> bool:
        """Whether a cluster node's map is to be read again (a MOVED, a failed master)."""
        return any(slot_map is not None and slot_map.stale for slot_map in self.maps)

    def lost(self, target: int) -> bool:
        """A connection to ``target`` failed: if it is a cluster node's master, its map may
        be out of date (a failover): marked stale (True)."""
        slot_map = self.maps[self.nodes[target]]
        if slot_map is None:
            return False
        slot_map.stale = True
        return True

    def sources(self, node: int) -> list[Endpoint]:
        """Where to read cluster node ``node``'s map from: its masters known (those owning
        hash slots first), then the server it was given as."""
        slot_map = self.maps[node]
        owning = set(slot_map.owners) if slot_map is not None else set()
        targets = [t for t, n in enumerate(self.nodes) if n == node and t != node]
        targets.sort(key=lambda t: t not in owning)
        seed = dataclasses.replace(self.endpoints[node], cluster=False)
        return [self.endpoints[t] for t in targets] + [seed]

    def to_read(self, node: int) -> bool:
        """Whether cluster node ``node``'s map is still to be read (not known, or stale):
        False once another reading got it meanwhile."""
        slot_map = self.maps[node]
        return slot_map is not None and (not slot_map.known or slot_map.stale)

    def readings(self, node: int, until: float, budget: float
                 ) -> Iterator[tuple[Endpoint, float]]:
        """The sources to read cluster node ``node``'s map from, one after the other, each
        with the seconds it may take (``budget`` at most, within ``until``); the caller
        gives each answer to :meth:`answered` and stops at the first True."""
        for source in self.sources(node):
            left = min(until, time.monotonic() + budget) - time.monotonic()
            if left <= 0:
                return
            yield source, left

    def answered(self, node: int, source: Endpoint, reply: object) -> bool:
        """What ``source`` answered ``CLUSTER SLOTS`` (or the error asking it raised):
        True if it became cluster node ``node``'s map, else it is kept as the reason the
        node's calls cannot be routed, and the next source is to be asked."""
        try:
            if isinstance(reply, BaseException):
                raise reply
            self.apply(node, reply, source)
        except Exception as exc:
            slot_map = self.maps[node]
            assert slot_map is not None
            slot_map.error = as_failure(exc)
            return False
        return True

    def remap_due(self) -> list[int]:
        """The cluster nodes whose stale map is to be read again in the background now:
        none if that began less than REMAP_EVERY ago (a request that still finds a map
        stale asks again)."""
        with self._remapping:
            now = time.monotonic()
            if now - self._remapped_at < REMAP_EVERY:
                return []
            stale = [node for node, slot_map in enumerate(self.maps)
                     if slot_map is not None and slot_map.stale]
            if stale:
                self._remapped_at = now
            return stale

    def apply(self, node: int, reply: object, asked: Endpoint) -> None:
        """A ``CLUSTER SLOTS`` reply from ``asked`` becomes cluster node ``node``'s map.
        Raises ValueError if it is not one."""
        owners = array("i", [UNROUTED]) * HASH_SLOTS
        for start, end, host, port in slot_owners(reply, asked.host):
            target = self.target(node, host, port)
            owners[start:end + 1] = array("i", [target]) * (end + 1 - start)
        slot_map = self.maps[node]
        assert slot_map is not None
        slot_map.owners = owners
        slot_map.known, slot_map.stale, slot_map.error = True, False, None

    def unrouted(self, node: int) -> str:
        """Why a call of cluster node ``node`` has no target."""
        slot_map = self.maps[node]
        error = slot_map.error if slot_map is not None else None
        if error is not None:
            return f"the cluster's hash slot map could not be read ({error})"
        return "no master of the cluster serves the call's hash slot"
