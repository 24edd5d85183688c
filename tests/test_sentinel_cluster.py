"""Nodes behind Redis Sentinel are nodes (docs/design.md §11.3); Redis Cluster is refused
with the reason (§11.4). Real masters, real ``redis-server --sentinel`` processes, a real
cluster-mode redis-server; both clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster

from redlock import AsyncRedlock, QuorumUnavailable, Redlock
from redlock.testing import RedisNodes, RedisSentinel, capture_events, free_port
from tests.internals import renewed_by_a_renewer
from tests.peek import lock_values

SERVICES = ("s0", "s1", "s2")


@pytest.fixture
def one_sentinel(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[tuple[RedisNodes,
                                                                           RedisSentinel]]:
    """Three masters, one Sentinel monitoring them as services s0, s1, s2."""
    masters = fresh_nodes(3)
    with RedisSentinel(dict(zip(SERVICES, masters, strict=True))) as sentinel:
        yield masters, sentinel


@pytest.fixture
def three_deployments(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[
        tuple[RedisNodes, list[RedisSentinel]]]:
    """Three independent deployments: each master has its own Sentinel, and each calls
    its service ``mymaster`` (the default name in Sentinel's docs)."""
    masters = fresh_nodes(3)
    sentinels: list[RedisSentinel] = []
    try:
        for master in masters:
            sentinels.append(RedisSentinel({"mymaster": master}))
        yield masters, sentinels
    finally:
        for sentinel in sentinels:
            sentinel.close()


@contextmanager
def _master_clients(sentinel: RedisSentinel, **options: Any) -> Iterator[list[redis.Redis]]:
    """A redis-py client for each of SERVICES' masters, through ``sentinel``; the clients
    and the Sentinel manager's own connections closed afterwards."""
    sentinels = redis.Sentinel([sentinel.address], socket_timeout=1.0)
    clients = [sentinels.master_for(name, **options) for name in SERVICES]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()
        for client in sentinels.sentinels:
            client.close()


def test_three_sentinel_services_are_three_nodes(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    masters, sentinel = one_sentinel
    with _master_clients(sentinel, socket_timeout=1.0) as clients, \
            Redlock(clients, node_timeout=0.5) as dlm:
        assert dlm.nodes == ("sentinel:s0", "sentinel:s1", "sentinel:s2")
        assert dlm.quorum == 2
        with dlm.lock("sent:a", ttl=5.0, timeout=5.0) as held:
            assert held.token == 1
            holders = lock_values(masters, "sent:a")
            # The key is on every master, under one lock value.
            assert None not in holders and len(set(holders)) == 1
        assert lock_values(masters, "sent:a") == [None, None, None]


async def test_async_sentinel_clients_are_nodes_too(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    masters, sentinel = one_sentinel
    sentinels = redis.asyncio.sentinel.Sentinel([sentinel.address], socket_timeout=1.0)
    clients = [sentinels.master_for(name, socket_timeout=1.0) for name in SERVICES]
    try:
        async with AsyncRedlock(clients, node_timeout=0.5) as dlm:
            assert dlm.nodes == ("sentinel:s0", "sentinel:s1", "sentinel:s2")
            async with dlm.lock("sent:b", ttl=5.0, timeout=5.0) as held:
                assert held.token == 1
                assert None not in lock_values(masters, "sent:b")
            assert lock_values(masters, "sent:b") == [None, None, None]
    finally:
        for client in clients:
            await client.aclose()
        for client in sentinels.sentinels:
            await client.aclose()


def test_independent_deployments_with_one_service_name_get_distinct_labels(
        three_deployments: tuple[RedisNodes, list[RedisSentinel]]) -> None:
    masters, sentinel_processes = three_deployments
    managers = [redis.Sentinel([s.address], socket_timeout=1.0) for s in sentinel_processes]
    clients = [m.master_for("mymaster", socket_timeout=1.0) for m in managers]
    try:
        with Redlock(clients, node_timeout=0.5) as dlm:
            assert dlm.nodes == tuple(f"sentinel:mymaster@{s.host}:{s.port}"
                                      for s in sentinel_processes)
            with dlm.lock("sent:c", ttl=5.0, timeout=5.0):
                assert None not in lock_values(masters, "sent:c")
    finally:
        for client in clients:
            client.close()
        for manager in managers:
            for client in manager.sentinels:
                client.close()


def test_a_master_down_is_one_node_down(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    masters, sentinel = one_sentinel
    with _master_clients(sentinel) as clients, Redlock(clients, node_timeout=0.5) as dlm:
        lock = dlm.lock("sent:d", ttl=5.0)
        assert lock.acquire(blocking=False)  # all three: the new cluster is initialised
        lock.release()
        masters[2].stop()
        assert lock.acquire(blocking=False)  # two of three masters: a quorum
        lock.release()
        masters[1].stop()
        with pytest.raises(QuorumUnavailable) as failure:
            lock.acquire(blocking=False)
        assert "sentinel:s1" in str(failure.value) and "sentinel:s2" in str(failure.value)


def test_same_service_twice_and_replicas_are_refused(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    _, sentinel = one_sentinel
    sentinels = redis.Sentinel([sentinel.address], socket_timeout=1.0)
    again = redis.Sentinel([sentinel.address], socket_timeout=1.0)
    clients = [sentinels.master_for("s0"), again.master_for("s0"), sentinels.master_for("s1")]
    replica = sentinels.slave_for("s2")
    try:
        with pytest.raises(ValueError, match="same Redis server"):
            Redlock(clients)
        with pytest.raises(ValueError, match="replica"):
            Redlock([clients[0], clients[2], replica])
    finally:
        for client in [*clients, replica]:
            client.close()
        for manager in (sentinels, again):
            for client in manager.sentinels:
                client.close()


def test_the_manager_keeps_no_sentinel_connection(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    """The sentinels are asked which master to connect to each time a connection is
    opened, on sockets closed right after (docs/design.md §2.4): nothing is left open
    to them while the manager runs, or after it closes."""
    _, sentinel = one_sentinel

    def connected() -> int:
        with sentinel.client() as probe:
            return int(probe.info("clients")["connected_clients"])

    with _master_clients(sentinel) as clients:
        before = connected()
        dlm = Redlock(clients, node_timeout=0.5)
        with dlm.lock("sent:e", ttl=5.0, timeout=5.0):
            pass
        deadline = time.monotonic() + 10.0
        while connected() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert connected() <= before
        dlm.close()
        assert connected() <= before


# -- Redis Cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_node() -> Iterator[RedisNodes]:
    """A one-master Redis Cluster (all 16384 slots on one cluster-mode redis-server),
    shared by this module's tests."""
    # The cluster bus port defaults to port + 10000, too high for most free ports.
    with RedisNodes(1, extra_args=["--cluster-enabled", "yes",
                                   "--cluster-port", str(free_port())]) as nodes:
        with nodes[0].client() as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            deadline = time.monotonic() + 10.0
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the one-node cluster did not come up"
                time.sleep(0.05)
        yield nodes


def test_a_redis_cluster_client_is_a_node(cluster_node: RedisNodes) -> None:
    """docs/design.md §11.4: a RedisCluster client is one node, read from its public
    settings; its calls go to the master of each resource's hash slot."""
    cluster = redis.cluster.RedisCluster(host=cluster_node[0].host, port=cluster_node[0].port)
    try:
        with Redlock([cluster], node_timeout=0.5) as dlm:
            tokens = []
            for _ in range(2):
                with dlm.lock("clu:sync", ttl=5.0, timeout=5.0) as held:
                    tokens.append(held.token)
                    assert cluster.get("redlock:{clu:sync}:lock") is not None
            assert tokens[1] > tokens[0]
    finally:
        cluster.close()


async def test_an_asyncio_cluster_client_is_a_node_too(cluster_node: RedisNodes) -> None:
    cluster = redis.asyncio.cluster.RedisCluster(host=cluster_node[0].host,
                                                 port=cluster_node[0].port)
    try:
        with pytest.raises(ValueError, match="initialize"):  # (it knows no node yet)
            AsyncRedlock([cluster])
        await cluster.initialize()
        async with AsyncRedlock([cluster], node_timeout=0.5) as adlm, \
                adlm.lock("clu:async", ttl=5.0, timeout=5.0) as held:
            assert held.token >= 1
            assert await cluster.get("redlock:{clu:async}:lock") is not None
    finally:
        await cluster.aclose()


def test_a_cluster_by_url_says_so(cluster_node: RedisNodes) -> None:
    url = cluster_node.urls[0] + "?cluster=yes"
    with Redlock([url], node_timeout=0.5) as dlm, \
            dlm.lock("clu:url", ttl=5.0, timeout=5.0) as held:
        assert held.token >= 1
    with pytest.raises(ValueError, match="database 0 only"):
        Redlock([cluster_node.urls[0] + "/2?cluster=yes"])


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_cluster_mode_node_by_url_fails_at_once_saying_why(
        cluster_node: RedisNodes, kind: str) -> None:
    url = cluster_node.urls[0]
    with capture_events() as events:
        if kind == "sync":
            with Redlock([url], node_timeout=0.5) as dlm, \
                    pytest.raises(QuorumUnavailable) as failure:
                dlm.lock("clu:a", ttl=5.0, timeout=30.0).acquire()
        else:
            async with AsyncRedlock([url], node_timeout=0.5) as adlm:
                with pytest.raises(QuorumUnavailable) as failure:
                    await adlm.lock("clu:a", ttl=5.0, timeout=30.0).acquire()
    # CROSSSLOT is permanent: one attempt, not 30 s of retries.
    assert "1 attempt" in str(failure.value)
    # The reply as redis-py's parser names it: ClusterCrossSlotError (redis-py 6 and
    # later), a ResponseError that keeps the code before that.
    assert any(name in str(failure.value) for name in ("ClusterCrossSlotError", "CROSSSLOT"))
    assert "?cluster=yes" in str(failure.value)
    warned = [e for e in events if e["event"] == "redlock.node_unsafe_config"]
    assert len(warned) == 1 and "cluster mode" in str(warned[0]["problem"])


def test_sentinel_nodes_are_renewed_by_the_renewer(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    """The renewer rebuilds Sentinel-managed nodes from their sentinels and service: an
    auto-extended lock of TTL 1 s held 2.5 s stays held, renewed from the process."""
    masters, sentinel = one_sentinel
    with _master_clients(sentinel, socket_timeout=1.0) as clients, \
            Redlock(clients, node_timeout=0.5) as dlm, capture_events() as events:
        assert renewed_by_a_renewer(dlm)
        with dlm.lock("sent:renewed", ttl=1.0, timeout=5.0, auto_extend=True) as held:
            time.sleep(2.5)
            held.check()
            assert None not in lock_values(masters, "sent:renewed")
        renewed = [e for e in events if e["event"] == "redlock.extended"]
        assert renewed, "no renewal was logged"
        assert "redlock.renewals_in_process" not in [e["event"] for e in events]


async def test_async_sentinel_nodes_are_renewed_by_the_renewer(
        one_sentinel: tuple[RedisNodes, RedisSentinel]) -> None:
    masters, sentinel = one_sentinel
    sentinels = redis.asyncio.sentinel.Sentinel([sentinel.address], socket_timeout=1.0)
    clients = [sentinels.master_for(name, socket_timeout=1.0) for name in SERVICES]
    try:
        async with AsyncRedlock(clients, node_timeout=0.5) as dlm:
            assert renewed_by_a_renewer(dlm)
            async with dlm.lock("sent:arenewed", ttl=1.0, timeout=5.0,
                                auto_extend=True) as held:
                await asyncio.sleep(2.5)
                held.check()
                assert None not in lock_values(masters, "sent:arenewed")
    finally:
        for client in clients:
            await client.aclose()
        for client in sentinels.sentinels:
            await client.aclose()


class _OwnCredentials(redis.CredentialProvider):
    """A credential provider of the application's own that cannot be pickled (it holds a
    lock): the renewer cannot rebuild such a node in another process."""

    def __init__(self) -> None:
        self.guard = threading.Lock()

    def get_credentials(self) -> tuple[str]:
        return ("",)


def test_nodes_that_cannot_cross_to_a_process_renew_in_this_one_and_say_why(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3)
    plain = [node.client() for node in nodes]
    own = [redis.Redis(host=node.host, port=node.port,
                       credential_provider=_OwnCredentials()) for node in nodes]
    try:
        with Redlock(plain) as dlm:
            assert renewed_by_a_renewer(dlm)  # plain clients cross as their settings
        with Redlock(own) as dlm, capture_events() as events:
            assert not renewed_by_a_renewer(dlm)
            with dlm.lock("own:creds", ttl=1.0, auto_extend=True) as held:
                time.sleep(1.2)
                held.check()
        said = [e for e in events if e["event"] == "redlock.renewals_in_process"]
        assert len(said) == 1 and "cannot be sent to another process" in said[0]["reason"]
    finally:
        for client in plain + own:
            client.close()
