"""A user's test suite on the redlock-fenced pytest plugin (the plugin's tests run it
with pytester, on each backend): every fixture and fault helper, used as documented.
The last test fails on purpose: the faults are real, so a wrong expectation fails."""

import pytest
import redis

from fencing import StaleTokenError
from redlock import QuorumUnavailable

SEEN = {}


def test_one_writer_at_a_time(redlock_client, redlock_fenced_store):
    with redlock_client.lock("orders:42", ttl=5.0) as held:
        token = held.token
        redlock_fenced_store.write("orders:42", token, b"paid")
    assert redlock_fenced_store.read("orders:42") == b"paid"
    with pytest.raises(StaleTokenError):
        redlock_fenced_store.write("orders:42", token - 1, b"stale")


def test_three_nodes_behind_proxies_by_default(redlock_cluster):
    assert len(redlock_cluster) == 3
    assert redlock_cluster.proxies is not None
    assert redlock_cluster.urls == redlock_cluster.proxies.urls
    assert all(url.startswith("redis://127.0.0.1:") for url in redlock_cluster.urls)
    with redlock_cluster[0].client() as client:
        client.set("left-over", "1")
    SEEN["ports"] = [node.port for node in redlock_cluster.nodes]


def test_the_next_test_gets_the_same_nodes_empty(redlock_cluster):
    assert [node.port for node in redlock_cluster.nodes] == SEEN["ports"]
    with redlock_cluster[0].client() as client:
        assert client.get("left-over") is None


@pytest.mark.redlock_cluster(nodes=5)
def test_survives_a_minority_and_refuses_without_a_majority(redlock_client, redlock_faults):
    with redlock_client.lock("jobs:nightly", ttl=5.0):  # a new cluster: all nodes answer
        pass
    redlock_faults.blackhole(0)  # requests vanish
    redlock_faults.pause(1)  # the server hangs
    with redlock_client.lock("jobs:nightly", ttl=5.0, timeout=5.0) as held:
        assert held.token > 0
    redlock_faults.lose_replies(2)  # the node runs the command, the reply is lost
    with pytest.raises(QuorumUnavailable):
        redlock_client.lock("jobs:nightly", ttl=5.0, blocking=False).acquire()


@pytest.mark.redlock_cluster(nodes=5)
def test_minority_down(redlock_client, redlock_fenced_store, redlock_faults):  # README.md's
    with redlock_client.lock("orders:42", ttl=5.0):   # empty nodes: a new cluster,
        pass                                        # every node must answer once
    redlock_faults.blackhole(0)                     # also pause, lose_replies, refuse,
    redlock_faults.restart_empty(1)                 # restart, latency, heal
    with redlock_client.lock("orders:42", ttl=5.0) as held:
        redlock_fenced_store.write("orders:42", held.token, b"paid")


@pytest.mark.redlock_cluster(nodes=5)
def test_faults_are_healed_before_the_next_test(redlock_cluster):
    assert all(not proxy.toxics() for proxy in redlock_cluster.proxies)
    for url in redlock_cluster.urls:
        with redis.Redis.from_url(url, socket_timeout=2.0) as client:
            assert client.ping()


def test_refused_connections(redlock_cluster, redlock_faults):
    redlock_faults.refuse(0)
    client = redis.Redis.from_url(redlock_cluster.urls[0], socket_timeout=2.0)
    with client, pytest.raises(redis.ConnectionError):
        client.ping()


def test_restart_empty_is_a_node_that_lost_its_data(redlock_cluster, redlock_client,
                                                    redlock_faults):
    with redlock_client.lock("reports", ttl=5.0) as first:
        first_token = first.token
    redlock_faults.restart_empty(0)
    with redlock_cluster[0].client() as client:
        assert client.dbsize() == 0
    with redlock_client.lock("reports", ttl=5.0, timeout=5.0) as second:
        assert second.token > first_token


@pytest.mark.redlock_cluster(nodes=3, appendonly=True)
def test_a_durable_node_keeps_its_data_across_a_restart(redlock_cluster, redlock_faults):
    with redlock_cluster[1].client() as client:
        client.set("k", "v")
    redlock_faults.restart(1)
    with redlock_cluster[1].client() as client:
        assert client.get("k") == b"v"


@pytest.mark.asyncio
async def test_async_client(redlock_async_client):
    async with redlock_async_client.lock("orders:7", ttl=5.0) as held:
        assert held.token > 0


def test_one_leader_at_a_time(redlock_client, redlock_history):
    import threading
    import time

    from redlock.testing.history import Hold

    def candidate(name):
        election = redlock_client.election("nightly", ttl=2.0, identity=name)
        for _ in range(3):
            with election.campaign(timeout=10.0) as lead:
                start = time.monotonic()
                time.sleep(0.02)
                redlock_history.held(Hold(name, "nightly", lead.token, start,
                                          min(time.monotonic(), start + lead.validity)))

    threads = [threading.Thread(target=candidate, args=(f"c{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(redlock_history.holds) == 9
    assert redlock_history.violations(exclusive=True) == []


def test_fails_on_purpose_without_a_quorum(redlock_client, redlock_faults):
    for index in range(3):
        redlock_faults.blackhole(index)
    with redlock_client.lock("orders:42", ttl=5.0, blocking=False):
        pass
