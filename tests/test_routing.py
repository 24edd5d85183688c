"""Routing on a real Redis Cluster (docs/proposals/cluster.md P2, step 2): the sync
and asyncio transports send each call of a cluster node to the master of its hash slot (the map read
with CLUSTER SLOTS on its own connection), follows MOVED after a reshard, ASK and TRYAGAIN
while a hash slot migrates, and finds a killed master's promoted replica. A cluster is not
yet accepted as a lock node: these tests drive the transport itself."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from redlock._core.requests import Broadcast, Call
from redlock._io.async_transport import AsyncTransport
from redlock._io.endpoint import Endpoint
from redlock._io.routing import Routes
from redlock._io.sync_transport import SyncTransport
from redlock._scripts.hash_slots import hash_slot
from redlock._scripts.replies import FailureKind, NodeFailure
from redlock._scripts.script import Script
from redlock.testing.redis_cluster import RedisClusterNodes
from redlock.testing.redis_nodes import RedisNode, RedisNodes

INCR = Script("incr_by", "return redis.call('INCRBY', KEYS[1], ARGV[1])")
# Keys of a hash tag each, so that their hash slots spread over the masters.
KEYS = [f"{{r{i}}}:k" for i in range(300)]


class Transport:
    """Either transport, driven from the test's thread (the asyncio one on a loop of its
    own, run for each request)."""

    def __init__(self, kind: str, endpoints: list[Endpoint]) -> None:
        addresses = [e.address for e in endpoints]
        self.loop = asyncio.new_event_loop() if kind == "asyncio" else None
        self.transport = AsyncTransport(endpoints, addresses, 1.0) if self.loop else \
            SyncTransport(endpoints, addresses, 1.0)

    @property
    def routes(self) -> Routes:
        return self.transport._routes

    def broadcast(self, request: Broadcast) -> list[object]:
        transport = self.transport
        if isinstance(transport, AsyncTransport):
            assert self.loop is not None
            return list(self.loop.run_until_complete(transport.broadcast(request)))
        return list(transport.broadcast(request))

    def close(self) -> None:
        transport = self.transport
        if isinstance(transport, AsyncTransport):
            assert self.loop is not None
            self.loop.run_until_complete(transport.close())
            self.loop.close()
        else:
            transport.close()


@pytest.fixture(params=["sync", "asyncio"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cluster(redlock_redis_cluster: RedisClusterNodes) -> Iterator[RedisClusterNodes]:
    """(Here: the real Redis Cluster, not conftest's standalone nodes.)"""
    yield redlock_redis_cluster


@pytest.fixture
def transport_of(kind: str) -> Iterator[Callable[..., Transport]]:
    made: list[Transport] = []

    def make(cluster: RedisClusterNodes, *others: RedisNode) -> Transport:
        master = cluster.masters()[0]
        endpoints = [Endpoint(host=master.host, port=master.port, cluster=True),
                     *(Endpoint(host=node.host, port=node.port) for node in others)]
        made.append(Transport(kind, endpoints))
        return made[-1]

    yield make
    for transport in made:
        transport.close()
    gc.collect()  # (a connection left open would warn here, in its own test)


def replicated(cluster: RedisClusterNodes, key: str, value: bytes) -> None:
    """Wait until the replica of ``key``'s master has it."""
    [replica] = cluster.replicas_of(cluster.master_of(hash_slot(key)))
    with replica.client() as client:
        client.execute_command("READONLY")
        for _ in range(200):
            if client.get(key) == value:
                return
            time.sleep(0.01)
    raise AssertionError(f"{key} not replicated")


def run(transport: Transport, calls: list[Call], timeout: float = 2.0) -> list[object]:
    return transport.broadcast(Broadcast(tuple(calls), timeout))


def values_on(node: RedisNode, keys: list[str]) -> dict[str, bytes | None]:
    with node.client() as client:
        return dict(zip(keys, client.mget(keys), strict=True))


def test_each_call_goes_to_the_master_of_its_hash_slot(cluster: RedisClusterNodes,
        nodes1: RedisNodes, transport_of: Callable[..., Transport]) -> None:
    standalone = nodes1[0]
    transport = transport_of(cluster, standalone)
    replies = run(transport, [Call(0, ("SET", key, str(i)), keys=(key,))
                              for i, key in enumerate(KEYS)]
                  + [Call(1, ("SET", "plain", "1"), keys=("plain",))])
    assert replies == [b"OK"] * (len(KEYS) + 1)
    for i, key in enumerate(KEYS):  # each on the master of its hash slot, none elsewhere
        owner = cluster.master_of(hash_slot(key))
        assert values_on(owner, [key]) == {key: str(i).encode()}
    with standalone.client() as client:
        assert client.get("plain") == b"1"
    # A script's call too; the targets: the two nodes, then the cluster's 3 masters.
    assert run(transport, [Call(0, ("5",), INCR, (key,)) for key in KEYS[:3]]) == [5, 6, 7]
    assert len(transport.routes.endpoints) == 2 + 3


def test_a_resharded_hash_slot_is_followed_by_moved(cluster: RedisClusterNodes,
        transport_of: Callable[..., Transport]) -> None:
    transport = transport_of(cluster)
    key = KEYS[7]
    slot = hash_slot(key)
    assert run(transport, [Call(0, ("1",), INCR, (key,))]) == [1]
    source = cluster.master_of(slot)
    target = next(m for m in cluster.masters() if m is not source)
    assert cluster.migrate(slot, target) == 1
    # The map still names the source, which answers MOVED: the call goes to the target.
    assert run(transport, [Call(0, ("1",), INCR, (key,))]) == [2]
    assert values_on(target, [key]) == {key: b"2"}
    routes = transport.routes
    owner = routes.endpoints[routes.target_of(Call(0, (), None, (key,)))]
    assert (owner.host, owner.port) == (target.host, target.port)
    # And the rest of the map, read again in the background, still routes the others.
    assert run(transport, [Call(0, ("1",), INCR, (k,)) for k in KEYS[:50]]) == \
        [3 if k == key else 1 for k in KEYS[:50]]


def migrating(cluster: RedisClusterNodes, slot: int) -> tuple[RedisNode, RedisNode]:
    """Hash slot ``slot`` half way through a migration: IMPORTING on a target, MIGRATING
    on its master (the keys not moved yet)."""
    source = cluster.master_of(slot)
    target = next(m for m in cluster.masters() if m is not source)
    with target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
    with source.client() as src:
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
    return source, target


def move_keys(source: RedisNode, target: RedisNode, keys: list[str]) -> None:
    with source.client() as src:
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)


def finish(cluster: RedisClusterNodes, slot: int, target: RedisNode) -> None:
    for master in cluster.masters():
        with master.client() as client:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(target))


def test_a_key_already_migrated_is_asked_for_on_the_importing_master(
        cluster: RedisClusterNodes, transport_of: Callable[..., Transport]) -> None:
    transport = transport_of(cluster)
    tagged = ["{m}:a", "{m}:b"]
    slot = hash_slot(tagged[0])
    assert run(transport, [Call(0, ("SET", key, key), keys=(key,)) for key in tagged]) \
        == [b"OK", b"OK"]
    source, target = migrating(cluster, slot)
    move_keys(source, target, tagged[:1])
    # {m}:a is on the importing master (ASK: ASKING, then the call); {m}:b still on
    # the source. A script's call on the moved key too.
    assert run(transport, [Call(0, ("GET", key), keys=(key,)) for key in tagged]) \
        == [b"{m}:a", b"{m}:b"]
    assert run(transport, [Call(0, ("GET", "{m}:a"), keys=("{m}:a",))] * 3) == [b"{m}:a"] * 3
    move_keys(source, target, tagged[1:])
    finish(cluster, slot, target)
    assert run(transport, [Call(0, ("1",), INCR, ("{m}:n",))]) == [1]
    assert values_on(target, ["{m}:n"]) == {"{m}:n": b"1"}


def test_a_command_whose_keys_are_split_by_a_migration_waits_it_out(
        cluster: RedisClusterNodes, transport_of: Callable[..., Transport]) -> None:
    transport = transport_of(cluster)
    tagged = ["{t}:a", "{t}:b"]
    slot = hash_slot(tagged[0])
    mget = Call(0, ("MGET", *tagged), keys=tuple(tagged))
    run(transport, [Call(0, ("SET", key, key), keys=(key,)) for key in tagged])
    source, target = migrating(cluster, slot)
    move_keys(source, target, tagged[:1])
    # Split: TRYAGAIN until the request's deadline, then that is its reply.
    started = time.monotonic()
    [reply] = run(transport, [mget], timeout=0.2)
    # (It ran nowhere: a failure that passes, not a misconfiguration.)
    assert isinstance(reply, NodeFailure) and "Redirected: TRYAGAIN" in str(reply), reply
    assert reply.unsent and reply.kind is FailureKind.UNREACHABLE
    assert time.monotonic() - started < 0.5
    # The migration finishing within the deadline: the call is answered.
    finisher = threading.Timer(0.1, lambda: (move_keys(source, target, tagged[1:]),
                                             finish(cluster, slot, target)))
    finisher.start()
    try:
        assert run(transport, [mget], timeout=3.0) == [[b"{t}:a", b"{t}:b"]]
    finally:
        finisher.join()


def test_a_killed_masters_replica_serves_its_hash_slots(
        transport_of: Callable[..., Transport]) -> None:
    with RedisClusterNodes(masters=3, replicas=1) as cluster:  # (its own: one is killed)
        killed_master_replica_serves(cluster, transport_of(cluster))


def killed_master_replica_serves(cluster: RedisClusterNodes, transport: Transport) -> None:
    key = KEYS[11]
    slot = hash_slot(key)
    assert run(transport, [Call(0, ("1",), INCR, (key,))]) == [1]
    replicated(cluster, key, b"1")
    _, promoted = cluster.kill_master(slot)
    # The first calls may still meet the dead master (refused); within the failover
    # the map is read again and the promoted replica answers.
    deadline = time.monotonic() + 10
    while True:
        [reply] = run(transport, [Call(0, ("1",), INCR, (key,))], timeout=0.5)
        if reply == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert reply == 2
    assert values_on(promoted, [key]) == {key: b"2"}
    # The other masters' hash slots were served throughout.
    others = [k for k in KEYS[:40] if cluster.master_of(hash_slot(k)) is not promoted]
    assert run(transport, [Call(0, ("1",), INCR, (k,)) for k in others]) == [1] * len(others)


# A granting script's stand-in: it answers the last argument it was given (the epoch).
LAST_ARGUMENT = Script("last_argument", "return ARGV[#ARGV]", replicated=True)


def test_a_masters_connection_passes_its_server_run(
        cluster: RedisClusterNodes, transport_of: Callable[..., Transport]) -> None:
    """docs/proposals/cluster.md P3.1a: a new connection to a cluster's master is identified
    by its server's run, which the granting calls written on it later carry after the epoch
    (their scripts compare it with the hash slot's stamp); its first write, which carries the
    probe and the calls together, cannot know it yet."""
    transport = transport_of(cluster)
    key = KEYS[5]
    with cluster.master_of(hash_slot(key)).client() as client:
        server_run = client.info("server")["run_id"]
    call = Call(0, ("7",), LAST_ARGUMENT, (key,))
    assert run(transport, [call]) == [b"7"]  # (the connection's first write)
    assert run(transport, [call]) == [f"7 {server_run}".encode()]
    plain = Call(0, ("5",), INCR, (key,))  # (a script that grants nothing: as given)
    assert run(transport, [plain]) == [5]
