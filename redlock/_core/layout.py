"""Which key names each node's calls use (docs/design.md §11.4): a standalone node keeps one
set of node keys (``ns:node:*``); a cluster node keeps one per hash slot, and a call of
resource R uses those of R's hash slot (``Keys.beside``), so that every script touches one
hash slot. The core builds each request's calls per group of nodes sharing key names."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redlock._core.requests import Call
from redlock._core.settings import Keys, in_hash_slot
from redlock._scripts.hash_slots import hash_slot

__all__ = ["Layout"]


class Layout:
    """The key names of a manager's nodes: ``keys`` (standalone), and for the nodes in
    ``clusters``, those of each resource's hash slot."""

    __slots__ = ("clusters", "keys")

    def __init__(self, keys: Keys, clusters: Iterable[int] = ()) -> None:
        self.keys = keys
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
