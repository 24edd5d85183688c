"""The amnesia guard per hash slot (docs/design.md §11.4, "places"; docs/proposals/cluster.md
P3.5): a cluster node's hash slot is judged, benched and repaired on its own, the node's
other hash slots untouched. On a real cluster (3 masters, each with a replica) beside two
standalone nodes, through the core's own flows, the routing transport and the background
maintenance, with the real clock. (A cluster is not yet accepted as a node by a manager.)"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from redlock._core.amnesia.maintenance import maintenance
from redlock._core.inspect import inspect_lock
from redlock._core.requests import Backoff, Pause, PauseUntilWoken
from redlock._io.endpoint import Endpoint
from redlock._io.sync_transport import SyncTransport
from redlock._scripts.hash_slots import HASH_SLOTS, hash_slot
from redlock._scripts.replies import stamped_run
from redlock.testing.redis_cluster import RedisClusterNodes
from redlock.testing.redis_nodes import RedisNodes
from tests.internals import KEYS, Broadcast, RedlockCore, Settings, drive, real_environment

CLUSTER = 2  # the cluster node of the three
TTL = 1.0
# Short lease bounds and repair rounds, so that a benched hash slot rejoins within a test.
SETTINGS = Settings(repair_interval=0.2, repair_timeout=2.0)


def endpoints_of(cluster: RedisClusterNodes, standalone: Sequence[object]) -> list[Endpoint]:
    master = cluster.masters()[0]
    endpoints = [Endpoint(host=node.host, port=node.port) for node in standalone]  # type: ignore[attr-defined]
    endpoints.insert(min(CLUSTER, len(endpoints)),
                     Endpoint(host=master.host, port=master.port, cluster=True))
    return endpoints


class Node:
    """A core and its transport, driven as a manager drives them (the real clock)."""

    def __init__(self, endpoints: list[Endpoint], settings: Settings = SETTINGS) -> None:
        self.transport = SyncTransport(endpoints, [e.address for e in endpoints], 1.0)
        clusters = [i for i, e in enumerate(endpoints) if e.cluster]
        self.core = RedlockCore([e.address for e in endpoints], settings,
                                real_environment(), clusters=clusters)
        self.core.amnesia.health.inspected = True

    def execute(self, request: object) -> list[object]:
        if isinstance(request, Broadcast):
            # (Every node's reply awaited, no early quorum: the test reads each outcome.)
            return list(self.transport.broadcast(dataclasses.replace(request, enough=None)))
        if isinstance(request, Backoff | Pause | PauseUntilWoken):  # (no waiting room)
            time.sleep(min(request.seconds, 5.0))
            return []
        raise AssertionError(f"unexpected request {request!r}")

    def acquire(self, resource: str) -> tuple[int, list[str]]:
        """The token of a grant (released at once) and each node's outcome."""
        result = drive(self.core.acquire(resource, TTL, blocking=True, timeout=5.0),
                       self.execute)
        assert result.state is not None, result
        drive(self.core.holding.release(result.state), self.execute)
        self.outcomes = result.outcomes
        return result.state.token, [r.outcome.name for r in result.outcomes]

    def maintain(self, within: float) -> None:
        """The background maintenance, until no place needs it (or ``within`` seconds)."""
        stop, news = threading.Event(), threading.Event()
        started = time.monotonic()

        def execute(request: object) -> list[object]:
            if time.monotonic() - started > within:
                stop.set()
            return self.execute(request)

        drive(maintenance(self.core.amnesia, stop, news), execute)
        health = self.core.amnesia.health
        assert not health.pending(), f"still pending: {vars(health)}"

    def close(self) -> None:
        self.transport.close()


@pytest.fixture
def mixed(redlock_redis_cluster: RedisClusterNodes, nodes3: RedisNodes) -> Iterator[Node]:
    node = Node(endpoints_of(redlock_redis_cluster, list(nodes3)[:2]))
    yield node
    node.close()


def place(node: Node, resource: str) -> int:
    return node.core.layout.place(CLUSTER, resource)


def slot_markers(cluster: RedisClusterNodes) -> dict[int, str]:
    """Per hash slot, the run its marker is stamped by, read on the master serving it."""
    stamps: dict[int, str] = {}
    for master in cluster.masters():
        with master.client() as client:
            names = list(client.scan_iter(match=f"{KEYS.namespace}:node:*:marker", count=5000))
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            for name, value in zip(names, pipe.execute(), strict=True):
                stamps[hash_slot(name)] = stamped_run(value) or ""
    return stamps


def run_of(cluster: RedisClusterNodes, slot: int) -> str:
    with cluster.master_of(slot).client() as client:
        return str(client.info("server")["run_id"])


def test_a_new_cluster_is_initialised_on_every_hash_slot(
        mixed: Node, redlock_redis_cluster: RedisClusterNodes) -> None:
    started = time.monotonic()
    token, outcomes = mixed.acquire("orders")
    took = time.monotonic() - started
    assert token == 1 and outcomes == ["GRANTED"] * 3
    stamps = slot_markers(redlock_redis_cluster)
    assert len(stamps) == HASH_SLOTS
    runs = {slot: run_of(redlock_redis_cluster, slot) for slot in (0, 8000, 16383)}
    assert all(stamps[slot] == run for slot, run in runs.items()), (stamps, runs)
    assert took < 5.0  # (16,384 markers in one request, grouped per master)
    # Every hash slot grants at once, none benched.
    for resource in ("invoices:7", "pool", "a", "b"):
        assert mixed.acquire(resource)[1] == ["GRANTED"] * 3
    assert not mixed.core.amnesia.health.pending()


def test_a_lost_hash_slot_is_benched_alone_and_repaired_from_its_peers(
        mixed: Node, redlock_redis_cluster: RedisClusterNodes) -> None:
    for expected in (1, 2, 3):
        assert mixed.acquire("orders") == (expected, ["GRANTED"] * 3)
    lost = hash_slot(KEYS.lock("orders"))
    keys = KEYS.beside("orders")
    with redlock_redis_cluster.master_of(lost).client() as client:
        client.delete(keys.marker, keys.counter)  # (the hash slot's data lost)
    # The other two nodes grant alone; the cluster's other hash slots are not concerned.
    # (The attempt that finds the loss spends its validity on a second look: the next
    # attempt is granted, by the other two.)
    token, outcomes = mixed.acquire("orders")
    assert token > 3 and outcomes == ["GRANTED", "GRANTED", "AMNESIAC"]
    health = mixed.core.amnesia.health
    assert set(health.unmarked) == {place(mixed, "orders")}
    # Its outcome names the hash slot it answered for (per-slot outcomes in errors).
    assert mixed.outcomes[CLUSTER].node.endswith(f" hash slot {lost}"), mixed.outcomes
    other = next(r for r in (f"other:{i}" for i in range(100))
                 if hash_slot(KEYS.lock(r)) != lost)
    assert mixed.acquire(other)[1] == ["GRANTED"] * 3
    # The lock's status says so for the lost hash slot's names only.
    status = {r: drive(inspect_lock(mixed.core, r), mixed.execute) for r in ("orders", other)}
    assert [n.benched for n in status["orders"].nodes] == [False, False, True]
    assert not any(n.benched for n in status[other].nodes)
    # The maintenance opens the hash slot's episode (bounded by its peers' horizons, one
    # TTL), then re-seeds its one counter from them and stamps its marker.
    mixed.maintain(within=10.0)
    with redlock_redis_cluster.master_of(lost).client() as client:
        assert stamped_run(client.get(keys.marker)) == run_of(redlock_redis_cluster, lost)
        assert int(client.hget(keys.counter, "0") or 0) >= token
    assert mixed.acquire("orders") == (token + 1, ["GRANTED"] * 3)


def test_a_standalone_node_is_benched_and_repaired_with_a_cluster_among_its_peers(
        mixed: Node, redlock_redis_cluster: RedisClusterNodes, nodes3: RedisNodes) -> None:
    """The cluster's 16,384 hash slots are read as one peer: their horizons bound the
    standalone node's bench, their counters re-seed its buckets."""
    for resource in ("orders", "pool", "a"):
        for _ in range(3):
            mixed.acquire(resource)
    lost = nodes3[0]
    with lost.client() as client:
        client.flushall()  # (the node's data lost)
    token, outcomes = mixed.acquire("orders")
    assert token > 3 and outcomes == ["AMNESIAC", "GRANTED", "GRANTED"]
    assert set(mixed.core.amnesia.health.unmarked) == {0}
    mixed.maintain(within=10.0)
    with lost.client() as client:
        counters = {k.decode(): int(v) for k, v in client.hgetall(KEYS.counter).items()}
    # Every bucket re-seeded, at least with the cluster's highest hash slot counter.
    assert len(counters) == 1024 and min(counters.values()) >= token
    assert mixed.acquire("orders") == (token + 1, ["GRANTED"] * 3)


@pytest.mark.parametrize("durable", [False, True], ids=["not-durable", "durable"])
def test_a_hash_slot_stamped_by_another_server_is_judged(
        mixed: Node, redlock_redis_cluster: RedisClusterNodes, durable: bool) -> None:
    """A stamp of another run (a migrated or failed-over hash slot): judged by its
    master's persistence, re-stamped if durable, else an episode and a repair."""
    assert mixed.acquire("orders") == (1, ["GRANTED"] * 3)
    slot = hash_slot(KEYS.lock("orders"))
    keys = KEYS.beside("orders")
    master = redlock_redis_cluster.master_of(slot)
    with master.client() as client:
        client.set(keys.marker, "format=1 run_id=" + "cd" * 20 + " moved")
        if durable:
            client.config_set("appendonly", "yes")
            client.config_set("appendfsync", "always")
    try:
        token, outcomes = mixed.acquire("orders")
        assert token >= 2 and outcomes == ["GRANTED", "GRANTED", "AMNESIAC"]
        health = mixed.core.amnesia.health
        assert set(health.suspect) == {place(mixed, "orders")} and not health.unmarked
        mixed.maintain(within=10.0)
    finally:
        with master.client() as client:
            client.config_set("appendonly", "no")
            client.config_set("appendfsync", "everysec")
    with master.client() as client:
        marker = client.get(keys.marker)
    assert stamped_run(marker) == run_of(redlock_redis_cluster, slot)
    assert (b"restamped" in marker) is durable, marker
    assert mixed.acquire("orders") == (token + 1, ["GRANTED"] * 3)


def test_one_cluster_alone_re_seeds_a_lost_hash_slot_from_its_masters_epoch(
        redlock_redis_cluster: RedisClusterNodes) -> None:
    """N=1 (docs/design.md §11.4, "the epoch floor"): a lost hash slot is benched for
    max_ttl, its other hash slots granting meanwhile, then its counter is re-seeded to
    its master's epoch times 2**40, above every token it gave; the same loss again on the
    same master (no failover since) is refused with what to do."""
    alone = Node(endpoints_of(redlock_redis_cluster, []),
                 Settings(repair_interval=0.2, repair_timeout=2.0, max_ttl=2.0))
    try:
        assert alone.acquire("orders") == (1, ["GRANTED"])
        keys = KEYS.beside("orders")
        lost = hash_slot(KEYS.lock("orders"))
        with redlock_redis_cluster.master_of(lost).client() as client:
            client.delete(keys.marker)
            epoch = int(client.execute_command("CLUSTER", "INFO").decode().split(
                "cluster_my_epoch:")[1].split()[0])
        result = drive(alone.core.acquire("orders", TTL, blocking=False, timeout=None),
                       alone.execute)
        assert result.state is None and "re-seeded from its master's epoch" in result.reason
        other = next(r for r in (f"other:{i}" for i in range(100))
                     if hash_slot(KEYS.lock(r)) != lost)
        assert alone.acquire(other) == (1, ["GRANTED"])
        alone.maintain(within=10.0)
        assert alone.acquire("orders") == (epoch * 2**40 + 1, ["GRANTED"])
        # Lost again on the same master: its epoch did not move, so no re-seed.
        with redlock_redis_cluster.master_of(lost).client() as client:
            client.delete(keys.marker)
        drive(alone.core.acquire("orders", TTL, blocking=False, timeout=None), alone.execute)
        with pytest.raises(AssertionError, match="pending"):
            alone.maintain(within=4.0)
    finally:
        alone.close()
