"""Which key names each node's calls use (docs/design.md §11.4): a standalone node keeps one
set of node keys (``ns:node:*``); a cluster node keeps one per hash slot, and a call of
resource R uses those of R's hash slot (``Keys.beside``), so that every script touches one
hash slot. The core builds each request's calls per group of nodes sharing key names.

The amnesia guard keeps its health by *place* (docs/design.md §11.4): a standalone node is
one (its number), a cluster node's hash slot s another, numbered N + node * 16,384 + s."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redlock._core.requests import Call
from redlock._core.settings import Keys, in_hash_slot
from redlock._scripts.hash_slots import HASH_SLOTS, hash_slot

__all__ = ["Layout"]


class Layout:
    """The key names of a manager's ``n`` nodes: ``keys`` (standalone), and for the nodes in
    ``clusters``, those of each resource's hash slot."""

    __slots__ = ("clusters", "keys", "n")

    def __init__(self, keys: Keys, n: int, clusters: Iterable[int] = ()) -> None:
        self.keys = keys
        self.n = n
        self.clusters = frozenset(clusters)

    def of(self, node: int, resource: str) -> Keys:
        """The keys ``node`` uses for ``resource``."""
        return self.keys.beside(resource) if node in self.clusters else self.keys

    def of_call(self, call: Call) -> Keys:
        """The node keys a call's script declares beside its resource's keys: on a cluster
        node, those of the hash slot of the call's first key (a resource's)."""
        if call.node not in self.clusters:
            return self.keys
        return in_hash_slot(self.keys.namespace, hash_slot(call.keys[0]))

    def groups(self, nodes: Sequence[int], resources: Sequence[str]
               ) -> list[tuple[Keys, Sequence[int]]]:
        """``nodes`` by the keys they use for ``resources`` (standalone nodes first). A set
        of resources across hash slots cannot be granted by one script on a cluster node:
        ValueError (sets across hash slots: docs/proposals/cluster.md P1)."""
        if not self.clusters.intersection(nodes):
            return [(self.keys, nodes)]
        slots = {hash_slot(self.keys.lock(r)) for r in resources}
        if len(slots) > 1:
            raise ValueError(
                f"resources {list(resources)!r} are stored in {len(slots)} hash slots of a"
                " Redis Cluster node, and one set is granted by one script there: name them"
                " alike up to a '}' ('orders:{42}:a' and 'orders:{42}:b' are stored"
                " together)")
        standalone = tuple(i for i in nodes if i not in self.clusters)
        clustered = tuple(i for i in nodes if i in self.clusters)
        groups: list[tuple[Keys, Sequence[int]]] = [(self.keys, standalone)] if standalone else []
        return [*groups, (self.keys.beside(resources[0]), clustered)]

    # -- places (the amnesia guard's unit, docs/design.md §11.4) ------------------------

    def place(self, node: int, resource: str) -> int:
        """Where ``node`` keeps what concerns ``resource``: the node, or its hash slot."""
        if node not in self.clusters:
            return node
        return self.n + node * HASH_SLOTS + hash_slot(self.keys.lock(resource))

    def places(self, resources: Sequence[str]) -> Sequence[int]:
        """Per node, the place of a request on ``resources`` (one hash slot: see groups)."""
        if not self.clusters:
            return range(self.n)
        return [self.place(node, resources[0]) for node in range(self.n)]

    def every_place(self, node: int) -> Sequence[int]:
        """All the places of ``node``: itself, or each of its hash slots."""
        if node not in self.clusters:
            return (node,)
        first = self.n + node * HASH_SLOTS
        return range(first, first + HASH_SLOTS)

    def node_of(self, place: int) -> int:
        return place if place < self.n else (place - self.n) // HASH_SLOTS

    def slot_of(self, place: int) -> int:
        """The hash slot of a place (-1: a standalone node)."""
        return -1 if place < self.n else (place - self.n) % HASH_SLOTS

    def keys_of(self, place: int) -> Keys:
        """The node keys of a place."""
        if place < self.n:
            return self.keys
        return in_hash_slot(self.keys.namespace, self.slot_of(place))

    def covering(self, node: int, place: int) -> Sequence[int]:
        """``node``'s places that hold what ``place`` holds: the node if standalone; on a
        cluster node the same hash slot, or all of them for a standalone node's place."""
        if node not in self.clusters:
            return (node,)
        slot = self.slot_of(place)
        return self.every_place(node) if slot < 0 else (self.n + node * HASH_SLOTS + slot,)

    def where(self, place: int, addresses: Sequence[str]) -> str:
        """A place as a person reads it: the node's address, and its hash slot."""
        slot = self.slot_of(place)
        address = addresses[self.node_of(place)]
        return address if slot < 0 else f"{address} hash slot {slot}"
