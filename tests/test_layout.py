"""Each node's key names (docs/design.md §11.4, docs/proposals/cluster.md step 3): a core
told which of its nodes are Redis Clusters sends them calls with the node keys of each
resource's hash slot (``Keys.beside``, one counter per hash slot), and its standalone
nodes the calls they always had. On scripted nodes through the core's own flows, then the
calls the core builds for a mixed N=3 (two standalone nodes and a real cluster) run on
real servers through the routing transport. (A cluster is not yet accepted as a node:
identity and health per master are the next sub-steps.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from redlock._core.kinds import LEADERSHIP, SLOT_COUNTER, Kind
from redlock._io.endpoint import Endpoint
from redlock._io.sync_transport import SyncTransport
from redlock._scripts import family
from redlock._scripts.hash_slots import hash_slot
from redlock.testing.redis_cluster import RedisClusterNodes
from redlock.testing.redis_nodes import RedisNodes
from tests.internals import (
    KEYS,
    WRITE,
    Broadcast,
    Call,
    Permit,
    RedlockCore,
    Settings,
    drive,
    node_scripts,
    real_environment,
    scripts,
)
from tests.scripted import FakeClock, ScriptedNodes

CLUSTER = 2  # the cluster node of the three


def core_with_cluster(n: int = 3) -> RedlockCore:
    core = RedlockCore([f"n{i}:6379" for i in range(n)], Settings(),
                       real_environment(FakeClock()), clusters=(CLUSTER,))
    core.amnesia.health.inspected = True
    return core


def initialised(nodes: ScriptedNodes, *resources: str) -> ScriptedNodes:
    """The cluster node's markers of the resources' hash slots (as its own would be)."""
    for resource in resources:
        nodes.data[CLUSTER][KEYS.beside(resource).marker] = nodes.stamp(CLUSTER, "")
    return nodes


def in_one_hash_slot(call: Call, resource: str) -> bool:
    return {hash_slot(key) for key in call.keys} == {hash_slot(KEYS.lock(resource))}


def calls_of(request: object, node: int) -> list[Call]:
    assert isinstance(request, Broadcast)
    return [call for call in request.calls if call.node == node and call.script is not None]


def test_a_cluster_nodes_lock_calls_use_its_resources_hash_slot() -> None:
    nodes = initialised(ScriptedNodes(3), "orders")
    core = core_with_cluster()
    result = drive(core.acquire("orders", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 1
    drive(core.holding.extend(result.state, 10.0), nodes.execute)
    drive(core.holding.release(result.state), nodes.execute)
    assert nodes.scripts_sent() == ["acquire", "extend", "release"]
    for request in nodes.requests:
        [standalone] = calls_of(request, 0)
        [cluster] = calls_of(request, CLUSTER)
        assert cluster.script is standalone.script
        assert in_one_hash_slot(cluster, "orders"), cluster.keys
        assert KEYS.horizon in standalone.keys and KEYS.horizon not in cluster.keys
    [acquire] = calls_of(nodes.requests[0], CLUSTER)
    assert acquire.args[5] == SLOT_COUNTER  # one counter per hash slot
    assert nodes.data[CLUSTER][KEYS.beside("orders").counter] == {SLOT_COUNTER: 1}


def test_a_standalone_only_core_sends_what_it_always_sent() -> None:
    plain = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(),
                        real_environment(FakeClock()))
    plain.amnesia.health.inspected = True
    nodes = ScriptedNodes(3)
    drive(plain.acquire("orders", 10.0, blocking=False, timeout=None), nodes.execute)
    mixed = initialised(ScriptedNodes(3), "orders")
    drive(core_with_cluster().acquire("orders", 10.0, blocking=False, timeout=None),
          mixed.execute)
    before, after = nodes.requests[0], mixed.requests[0]
    assert isinstance(before, Broadcast) and isinstance(after, Broadcast)
    # The standalone nodes' calls, unchanged (but for the attempt's own lock value).
    assert [(c.node, c.script, c.keys, c.args[1:]) for c in before.calls[:2]] == \
        [(c.node, c.script, c.keys, c.args[1:]) for c in after.calls[:2]]
    assert before.packed is not None and after.packed is None  # (two commands now)


def test_a_set_on_a_cluster_node_shares_a_hash_slot_or_is_refused() -> None:
    together = ("orders:{42}:a", "orders:{42}:b")
    nodes = initialised(ScriptedNodes(3), *together)
    core = core_with_cluster()
    result = drive(core.acquire(together, 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    [many] = calls_of(nodes.requests[0], CLUSTER)
    assert many.script is scripts.ACQUIRE_MANY and in_one_hash_slot(many, together[0])
    with pytest.raises(ValueError, match="hash slots of a Redis Cluster node"):
        drive(core.acquire(("orders:1", "orders:2"), 10.0, blocking=False, timeout=None),
              nodes.execute)


@pytest.mark.parametrize("kind", [Permit(permits=2), WRITE, LEADERSHIP],
                         ids=["semaphore", "rwlock", "election"])
def test_the_familys_calls_to_a_cluster_node_use_one_hash_slot(kind: Kind) -> None:
    core = core_with_cluster()
    flow = core.acquire("pool", 10.0, blocking=False, timeout=None, kind=kind)
    request = next(flow)  # the attempt's request
    flow.close()
    [standalone] = calls_of(request, 0)
    [cluster] = calls_of(request, CLUSTER)
    assert cluster.script is standalone.script
    assert in_one_hash_slot(cluster, "pool"), (cluster.script, cluster.keys)


def test_the_views_ask_a_cluster_node_for_its_resources_hash_slot() -> None:
    from redlock._core.inspect import inspect_lock
    from redlock._core.views import leader_calls

    core = core_with_cluster()
    for call in leader_calls(core.layout, "leader", 3):
        assert call.script is family.LEADER
        assert in_one_hash_slot(call, "leader") if call.node == CLUSTER else \
            KEYS.marker in call.keys
    flow = inspect_lock(core, "orders")
    request = next(flow)
    [standalone] = calls_of(request, 0)
    [cluster] = calls_of(request, CLUSTER)
    assert KEYS.counter in standalone.keys and in_one_hash_slot(cluster, "orders")
    assert cluster.args == (SLOT_COUNTER,)
    flow.close()


# -- on real servers: two standalone nodes and a cluster ----------------------------------


@pytest.fixture
def mixed(redlock_redis_cluster: RedisClusterNodes, nodes3: RedisNodes
          ) -> Iterator[SyncTransport]:
    master = redlock_redis_cluster.masters()[0]
    endpoints = [Endpoint(host=node.host, port=node.port) for node in list(nodes3)[:2]]
    endpoints.insert(CLUSTER, Endpoint(host=master.host, port=master.port, cluster=True))
    transport = SyncTransport(endpoints, [e.address for e in endpoints], 1.0)
    yield transport
    transport.close()


def every_reply(request: Broadcast) -> Broadcast:
    """``request`` awaiting every node's reply (no early quorum): the test reads each."""
    return dataclasses.replace(request, enough=None)


def mark(transport: SyncTransport, resource: str) -> None:
    """Initialise the nodes as a new cluster's first acquire would: the standalone nodes'
    markers, the cluster's of the resource's hash slot."""
    calls = []
    for node in range(3):
        keys = KEYS.beside(resource) if node == CLUSTER else KEYS
        calls.append(Call(node, ("format=1 test",), node_scripts.INIT_MARKER,
                          (keys.marker, keys.episode)))
    replies = list(transport.broadcast(Broadcast(tuple(calls), 2.0)))
    assert replies[CLUSTER] == node_scripts.INIT_WRITTEN, replies  # (a new hash slot)
    assert all(reply in (0, node_scripts.INIT_WRITTEN) for reply in replies), replies


def test_the_calls_for_a_mixed_cluster_run_on_real_servers(mixed: SyncTransport) -> None:
    resources = ["orders", "invoices:7", "pool"]
    for resource in resources:
        mark(mixed, resource)
    core = core_with_cluster()

    def execute(request: object) -> list[object]:
        assert isinstance(request, Broadcast)
        return list(mixed.broadcast(every_reply(request)))

    for resource in resources:
        for _ in range(2):
            result = drive(core.acquire(resource, 10.0, blocking=False, timeout=None),
                           execute)
            assert result.state is not None, result
            assert all(outcome.outcome.name == "GRANTED" for outcome in result.outcomes)
            assert drive(core.holding.extend(result.state, 10.0), execute) is None
            released = drive(core.holding.release(result.state), execute)
            assert [outcome.outcome.name for outcome in released] == ["GRANTED"] * 3
    # A token per grant: the cluster's from its hash slot's counter, the others' buckets.
    assert result.state.token == 2
    # The family's kinds, each granted by the three and given back.
    for kind in (Permit(permits=2), WRITE, LEADERSHIP):
        result = drive(core.acquire("pool", 10.0, blocking=False, timeout=None, kind=kind),
                       execute)
        assert result.state is not None, (kind, result)
        assert all(outcome.outcome.name == "GRANTED" for outcome in result.outcomes)
        released = drive(core.holding.release(result.state), execute)
        assert [outcome.outcome.name for outcome in released] == ["GRANTED"] * 3, kind


def test_a_connection_that_knows_its_masters_run_spares_the_scripts_info(
        mixed: SyncTransport, redlock_redis_cluster: RedisClusterNodes) -> None:
    """docs/proposals/cluster.md P3.1a: a cluster master's connection is identified by its
    server's run, which its granting calls then carry; the scripts compare the hash slot's
    stamp with it and ask INFO only on a connection's first write."""
    mark(mixed, "orders")
    core = core_with_cluster()

    def execute(request: object) -> list[object]:
        assert isinstance(request, Broadcast)
        return list(mixed.broadcast(every_reply(request)))

    def cycle() -> None:
        result = drive(core.acquire("orders", 10.0, blocking=False, timeout=None), execute)
        assert result.state is not None, result
        drive(core.holding.release(result.state), execute)

    cycle()  # (the connections identified)
    masters = redlock_redis_cluster.masters()
    for master in masters:
        with master.client() as client:
            client.config_resetstat()
    for _ in range(20):
        cycle()
    for master in masters:
        with master.client() as client:
            assert "cmdstat_info" not in client.info("commandstats")
    # A stamp of another run is refused all the same on a known connection.
    with redlock_redis_cluster.master_of(hash_slot(KEYS.lock("orders"))).client() as client:
        client.set(KEYS.beside("orders").marker, "format=1 run_id=" + "cd" * 20 + " moved")
    flow = core.acquire("orders", 10.0, blocking=False, timeout=None)
    replies = execute(next(flow))
    flow.close()
    assert replies[CLUSTER] == [-1, 0] and replies[0][0] == 1
