"""replica_acks (docs/design.md §11.3): a grant, commit or renewal counts only once that
many of the node's replicas have it (WAIT behind the scripts, on the same connection).
Real primaries with real replicas; a replica hung with SIGSTOP; both clients; the renewer
process's renewals; a SCRIPT FLUSH between calls (the scripts sent again, then WAIT). On a
Redis Cluster node each hash slot's master waits for its own replica (§11.4)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import redis.crc

from redlock import AsyncRedlock, LockLost, QuorumUnavailable, Redlock
from redlock.errors import Outcome
from redlock.testing import RedisNode, RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes
from tests.internals import KEYS, renewed_by_a_renewer
from tests.peek import lock_keys, lock_pttls, paused

# Long enough that WAIT's own timeout (half the request's) ends before the request's: Redis
# looks at blocked clients' timeouts about `hz` (10) times a second.
NODE_TIMEOUT = 0.5


@pytest.fixture
def replicated(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[tuple[RedisNode, RedisNode]]:
    """A primary and its replica."""
    primary, replica = fresh_nodes(2)
    replica.replicate(primary)
    yield primary, replica
    replica.resume()


def test_every_counted_grant_is_on_the_replica(replicated: tuple[RedisNode, RedisNode]
                                               ) -> None:
    primary, replica = replicated
    with Redlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        for i in range(50):
            with dlm.lock(f"r{i}", ttl=5.0) as held:
                # Read at once from the replica: WAIT answered 1 before the grant counted.
                assert lock_pttls([replica], f"r{i}")[0] > 0
                assert held.token == 1
                held.extend(8.0)
                assert lock_pttls([replica], f"r{i}")[0] > 5000  # the renewal too


def test_a_primary_whose_replica_is_hung_counts_no_grant(
        replicated: tuple[RedisNode, RedisNode]) -> None:
    primary, replica = replicated
    with Redlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        with dlm.lock("warm", ttl=5.0):
            pass
        with paused([replica], [0]):
            started = time.monotonic()
            with pytest.raises(QuorumUnavailable) as raised:
                dlm.lock("r", ttl=5.0, blocking=False).acquire()
            assert time.monotonic() - started < 2 * NODE_TIMEOUT
            [outcome] = raised.value.outcomes
            assert outcome.outcome is Outcome.ERROR
            assert "NotReplicated: not on 1 replica within 250 ms (WAIT answered 0)" in (
                outcome.detail), outcome.detail
            assert lock_keys([primary], "r") == [False]  # the failed attempt released there
        with dlm.lock("r", ttl=5.0) as held:  # back once the replica is
            assert held.token >= 1


def test_a_held_lock_is_not_renewed_without_its_replica(
        replicated: tuple[RedisNode, RedisNode]) -> None:
    primary, replica = replicated
    with Redlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        held = dlm.lock("r", ttl=1.0)
        held.acquire()
        with paused([replica], [0]), pytest.raises(LockLost):
            held.extend(1.0)


def test_a_node_without_replicas_grants_nothing(fresh_nodes: Callable[..., RedisNodes]
                                                ) -> None:
    [alone] = fresh_nodes(1)
    with Redlock([alone.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm, \
            pytest.raises(QuorumUnavailable, match=r"WAIT answered 0"):
        dlm.lock("r", ttl=5.0, blocking=False).acquire()


def test_a_quorum_of_replicated_nodes_grants(fresh_nodes: Callable[..., RedisNodes]) -> None:
    """N=3, each primary with a replica; one replica hung: its primary does not count,
    the other two grant."""
    nodes = fresh_nodes(6)
    primaries, replicas = list(nodes)[:3], list(nodes)[3:]
    for primary, replica in zip(primaries, replicas, strict=True):
        replica.replicate(primary)
    with Redlock([p.url for p in primaries], replica_acks=1,
                 node_timeout=NODE_TIMEOUT) as dlm:
        with dlm.lock("warm", ttl=5.0):
            pass
        with paused([replicas[1]], [0]), dlm.lock("r", ttl=5.0) as held:
            assert held.token == 1
            assert lock_pttls([replicas[0]], "r")[0] > 0
            assert lock_pttls([replicas[2]], "r")[0] > 0
        assert lock_keys(primaries, "r") == [False] * 3


def test_scripts_sent_again_are_acknowledged_too(replicated: tuple[RedisNode, RedisNode]
                                                 ) -> None:
    """SCRIPT FLUSH between calls: EVALSHA answers NOSCRIPT, the bodies go again, and their
    WAIT behind them decides."""
    primary, replica = replicated
    with Redlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        with dlm.lock("warm", ttl=5.0):
            pass
        for i in range(3):
            with primary.client() as client:
                client.script_flush()
            with dlm.lock(f"r{i}", ttl=5.0):
                assert lock_pttls([replica], f"r{i}")[0] > 0
        with primary.client() as client:
            client.script_flush()
        # Refused: NotReplicated, or no reply in time (two WAITs, each up to half the
        # request's time and Redis's timer tick, one behind the calls, one behind the
        # bodies: this rare path may take longer than the request).
        with paused([replica], [0]), pytest.raises(QuorumUnavailable):
            dlm.lock("x", ttl=5.0, blocking=False).acquire()
        assert lock_keys([primary], "x") == [False]


def test_auto_extend_in_the_renewer_process_waits_for_the_replica(
        replicated: tuple[RedisNode, RedisNode]) -> None:
    primary, replica = replicated
    with Redlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        held = dlm.lock("r", ttl=1.0, auto_extend=True)
        held.acquire()
        assert renewed_by_a_renewer(dlm)
        time.sleep(2.5)  # renewed every third of the TTL
        held.check()
        assert lock_pttls([replica], "r")[0] > 0
        with paused([replica], [0]):
            time.sleep(1.5)  # renewals not counted: the lock lapses
            with pytest.raises(LockLost):
                held.check()
        with pytest.raises(LockLost):
            held.release()


async def test_asyncio_acknowledged_and_refused(replicated: tuple[RedisNode, RedisNode]
                                                ) -> None:
    primary, replica = replicated
    async with AsyncRedlock([primary.url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        for i in range(20):
            async with dlm.lock(f"r{i}", ttl=5.0) as held:
                assert lock_pttls([replica], f"r{i}")[0] > 0
                await held.extend(6.0)
        with primary.client() as client:
            client.script_flush()
        async with dlm.lock("again", ttl=5.0):
            assert lock_pttls([replica], "again")[0] > 0
        with paused([replica], [0]), pytest.raises(QuorumUnavailable, match="NotReplicated"):
            await dlm.lock("r", ttl=5.0, blocking=False).acquire()


def test_redlock_nodes_shows_each_primarys_replicas(replicated: tuple[RedisNode, RedisNode]
                                                    ) -> None:
    primary, _ = replicated
    result = subprocess.run([sys.executable, "-m", "redlock", "nodes", "--json", "--nodes",
                             primary.url], capture_output=True, text=True, timeout=60)
    [node] = json.loads(result.stdout)["nodes"]
    assert (node["role"], node["replicas"]) == ("master", 1)
    assert 0 <= node["replica_lag_s"] <= 2
    table = subprocess.run([sys.executable, "-m", "redlock", "nodes", "--nodes", primary.url],
                           capture_output=True, text=True, timeout=60).stdout
    assert "master (1 replica, lag " in table


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), (17, ValueError),
                                              ("1", TypeError), (True, TypeError),
                                              (1.0, TypeError)])
def test_replica_acks_is_checked_at_the_call_site(value: object, error: type[Exception]
                                                  ) -> None:
    with pytest.raises(error, match="replica_acks"):
        Redlock(["redis://127.0.0.1:1"], replica_acks=value)  # type: ignore[arg-type]


def _replica_pttl(replica: RedisNode, resource: str) -> int:
    """The lock key's PTTL as a cluster replica has it (``READONLY``: it answers for the
    hash slots of its master instead of redirecting)."""
    with replica.client() as client:
        client.execute_command("READONLY")
        return int(client.pttl(KEYS.lock(resource)))


def _shard_of(cluster: RedisClusterNodes, resource: str) -> tuple[int, RedisNode, RedisNode]:
    """The resource's hash slot, that slot's master and the master's replica."""
    slot = redis.crc.key_slot(KEYS.lock(resource).encode())
    master = cluster.master_of(slot)
    [replica] = cluster.replicas_of(master)
    return slot, master, replica


def test_on_a_cluster_each_grant_is_on_its_hash_slots_replica(
        redlock_redis_cluster: RedisClusterNodes) -> None:
    cluster = redlock_redis_cluster
    with Redlock([cluster.node_url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        with dlm.lock("acks:warm-up", ttl=1.0, timeout=10.0):  # (initialises the slots)
            pass
        masters = set()
        for i in range(30):
            name = f"acks:{i}"
            _, master, replica = _shard_of(cluster, name)
            masters.add(master.port)
            with dlm.lock(name, ttl=5.0, blocking=False) as held:
                assert _replica_pttl(replica, name) > 0
                held.extend(8.0)
                assert _replica_pttl(replica, name) > 5000  # the renewal too
        assert len(masters) == 3


def test_on_a_cluster_a_shard_whose_replica_is_hung_counts_nothing(
        redlock_redis_cluster: RedisClusterNodes) -> None:
    """Its hash slots' grants are refused (NotReplicated, the hash slot named); the other
    shards' are granted meanwhile; the shard grants again once its replica is back."""
    cluster = redlock_redis_cluster
    names = [f"acks:{i}" for i in range(40)]
    hung_master = cluster.masters()[0]
    hung = next(n for n in names if _shard_of(cluster, n)[1].port == hung_master.port)
    other = next(n for n in names if _shard_of(cluster, n)[1].port != hung_master.port)
    slot, _, replica = _shard_of(cluster, hung)
    with Redlock([cluster.node_url], replica_acks=1, node_timeout=NODE_TIMEOUT) as dlm:
        with dlm.lock(other, ttl=1.0, timeout=10.0):  # (initialises the slots)
            pass
        with paused([replica], [0]):  # (shorter than the cluster's node timeout, 2 s)
            with pytest.raises(QuorumUnavailable) as raised:
                dlm.lock(hung, ttl=5.0, blocking=False).acquire()
            [outcome] = raised.value.outcomes
            assert outcome.outcome is Outcome.ERROR
            assert "NotReplicated" in outcome.detail, outcome.detail
            assert f"hash slot {slot}" in str(raised.value), raised.value
            with dlm.lock(other, ttl=5.0, blocking=False) as held:
                assert held.token >= 1
        with dlm.lock(hung, ttl=5.0, timeout=5.0):
            assert _replica_pttl(replica, hung) > 0
