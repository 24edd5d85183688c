"""Issue 42: a Redis Cluster as a lock node, its master killed under load.

A cluster's failover promotes a replica that may lack the newest grants and counter
increments (asynchronous replication): to the lock it is a restart of the failed-over
shard (docs/design.md §11.4). Each hash slot the promoted replica serves carries the old
master's stamp, so the granting scripts refuse there until the slot is judged (a promoted
replica: demoted), benched until every lease it may have granted has expired, and
repaired.

Every scenario runs the library's default settings under load: THREADS clients (each its
own manager) lock NAMES names spread over the hash slots and do a read-modify-write of
the name's value in a fenced store under each lock. Checked, before and after the master
is killed (at least PHASE acquisitions each): no lost update, no token backwards (the
fenced store refuses a stale token; the history checker sees each write), no history
violation, and every hash slot in use served again by the cluster (its marker stamped by
the promoted master).

Rerun: ``bash scripts/test tests/faults/test_cluster_failover.py -s`` (figures printed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from fencing import RedisFencedStore
from redlock._core.settings import in_hash_slot
from redlock._scripts.hash_slots import hash_slot
from redlock._scripts.replies import stamped_run
from redlock.testing import RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes
from tests.faults.load import Workload, recorded, wait_for
from tests.internals import KEYS

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(300)]

TTL = 5.0  # the locks' TTL: the longest lease in use
THREADS, NAMES = 4, 32
PHASE = 500  # acquisitions before the kill, and after the promotion
BACK = 60.0  # every hash slot in use is served again within this of the promotion (N=1:
# each failed-over hash slot is found by an acquire of one of its names, then benched)


@pytest.fixture
def cluster() -> Iterator[RedisClusterNodes]:
    """A cluster of its own (a master is killed): 3 masters, each with a replica."""
    with RedisClusterNodes(masters=3, replicas=1) as nodes:
        yield nodes


def served(cluster: RedisClusterNodes, names: list[str]) -> bool:
    """Every hash slot of ``names`` has its marker stamped by the master serving it."""
    for slot in {hash_slot(KEYS.lock(name)) for name in names}:
        master = cluster.master_of(slot)
        with master.client() as client:
            marker = client.get(in_hash_slot(KEYS.namespace, slot).marker)
            run = str(client.info("server")["run_id"])
        if marker is None or stamped_run(marker) != run:
            return False
    return True


def successes_after(workload: Workload, since: float) -> int:
    return sum(1 for t in list(workload.successes) if t >= since)


def phase(workload: Workload, what: str, since: float | None = None) -> float:
    """PHASE acquisitions from ``since`` (by default now); when the wait began."""
    began = time.monotonic() if since is None else since
    wait_for(lambda: successes_after(workload, began) >= PHASE, 60.0,
             f"{PHASE} acquisitions {what}")
    return began


def served_again(cluster: RedisClusterNodes, workload: Workload) -> float:
    """Once every hash slot in use is served again (within BACK): when."""
    wait_for(lambda: served(cluster, workload.names), BACK,
             "every hash slot in use served again")
    return time.monotonic()


def nothing_lost(workload: Workload, figures: object) -> None:
    """The read-modify-writes add up: no lost update (into the figures, and checked)."""
    lost = workload.lost_updates()
    figures.extra.update(lost_updates=lost,  # type: ignore[attr-defined]
                         increments=workload.increments)
    assert lost == 0, (figures.extra, workload.where_lost())  # type: ignore[attr-defined]


def killed_under_load(workload: Workload, cluster: RedisClusterNodes, figures: object,
                      *, seed_killed: bool) -> None:
    """PHASE acquisitions, a master killed (the one at the address the clients were
    given, or another), PHASE more after its replica is promoted, and every hash slot in
    use served again."""
    started = phase(workload, "before the kill")
    before = successes_after(workload, started)
    seed = cluster.masters()[0]
    victim = next(name for name in workload.names
                  if (cluster.master_of(hash_slot(KEYS.lock(name))) is seed) == seed_killed)
    killed_at = time.monotonic()
    _, promoted = cluster.kill_master(hash_slot(KEYS.lock(victim)))
    promoted_at = phase(workload, "after the promotion")
    served_at = served_again(cluster, workload)
    figures.extra.update(  # type: ignore[attr-defined]
        acquired_before=before, promotion_s=round(promoted_at - killed_at, 2),
        acquired_after=successes_after(workload, promoted_at),
        served_again_s=round(served_at - promoted_at, 2),
        longest_gap_s=round(workload.longest_gap(killed_at, time.monotonic()), 3),
        promoted=f"{promoted.host}:{promoted.port}", failures=workload.failures)


def test_a_cluster_beside_two_standalone_nodes_loses_a_master_under_load(
        cluster: RedisClusterNodes, fresh_nodes: Callable[..., RedisNodes],
        store: RedisFencedStore) -> None:
    """N=3: two standalone nodes and a cluster, whose master at the address the clients
    were given is killed (its hash slot map is then read from the other masters). The
    failed-over hash slots are benched alone (the standalone nodes keep a quorum, so
    locking goes on), bounded by the standalone nodes' horizons, then repaired from
    them. (N=1 below kills another master.)"""
    standalone = fresh_nodes(2)
    urls = [*standalone.urls, cluster.node_url]
    with recorded("cluster-failover-N3", store) as (figures, run):
        with Workload(urls, run, store, "fo3", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            killed_under_load(workload, cluster, figures, seed_killed=True)
        nothing_lost(workload, figures)


def test_one_cluster_alone_loses_a_master_under_load(
        cluster: RedisClusterNodes, store: RedisFencedStore) -> None:
    """N=1: the cluster is the only node. The failed-over hash slots stay out for
    ``max_ttl`` (nothing else bounds what they granted; set here to the locks' TTL),
    the other shards granting meanwhile, then are re-seeded from the promoted master's
    configEpoch (docs/design.md §11.4, "the epoch floor"): their tokens jump above every
    token given before, and no fenced write is refused as stale."""
    with recorded("cluster-failover-N1", store) as (figures, run):
        with Workload([cluster.node_url], run, store, "fo1", threads=THREADS,
                      names=NAMES, ttl=TTL, max_ttl=TTL) as workload:
            killed_under_load(workload, cluster, figures, seed_killed=False)
        nothing_lost(workload, figures)


def test_a_hash_slot_migrated_under_load(
        cluster: RedisClusterNodes, fresh_nodes: Callable[..., RedisNodes],
        store: RedisFencedStore) -> None:
    """N=3 (two standalone nodes and a cluster): the hash slot of a name in use is
    resharded to another master (SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE)
    while the clients lock it. Its calls follow MOVED and ASK; the slot, carrying its
    source's stamp, is judged and benched like a failed-over one (docs/design.md §11.4)
    and served again by its new master; nothing is lost meanwhile."""
    standalone = fresh_nodes(2)
    urls = [*standalone.urls, cluster.node_url]
    with recorded("cluster-migration-N3", store) as (figures, run):
        with Workload(urls, run, store, "mig3", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            phase(workload, "before the migration")
            slot = hash_slot(KEYS.lock(workload.names[0]))
            target = next(m for m in cluster.masters() if m is not cluster.master_of(slot))
            moved_at = time.monotonic()
            keys = cluster.migrate(slot, target, batch=1)
            migrated_at = phase(workload, "after the migration")
            served_at = served_again(cluster, workload)
            figures.extra.update(
                keys_moved=keys, migration_s=round(migrated_at - moved_at, 3),
                served_again_s=round(served_at - migrated_at, 2),
                longest_gap_s=round(workload.longest_gap(moved_at, time.monotonic()), 3),
                failures=workload.failures)
        nothing_lost(workload, figures)


def test_a_cluster_losing_a_whole_shard_beside_two_standalone_nodes(
        cluster: RedisClusterNodes, fresh_nodes: Callable[..., RedisNodes],
        store: RedisFencedStore) -> None:
    """N=3: a shard's master and its replica are killed (its hash slots and their data
    are gone). The two standalone nodes keep a quorum, so every name keeps being locked;
    once an operator gives the lost hash slots to another master (``take_over``), they
    come back empty, are benched as lost and repaired from the standalone nodes, and are
    served by the cluster again."""
    standalone = fresh_nodes(2)
    urls = [*standalone.urls, cluster.node_url]
    with recorded("cluster-shard-lost-N3", store) as (figures, run):
        with Workload(urls, run, store, "lost3", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            phase(workload, "before the shard is lost")
            seed = cluster.masters()[0]
            victim = next(name for name in workload.names
                          if cluster.master_of(hash_slot(KEYS.lock(name))) is not seed)
            lost_at = time.monotonic()
            slots = cluster.kill_shard(hash_slot(KEYS.lock(victim)))
            phase(workload, "while the shard is gone", lost_at)
            taken_at = time.monotonic()
            cluster.take_over(slots, seed)
            served_at = served_again(cluster, workload)
            phase(workload, "after the hash slots came back", served_at)
            figures.extra.update(
                hash_slots_lost=len(slots), served_again_s=round(served_at - taken_at, 2),
                longest_gap_s=round(workload.longest_gap(lost_at, time.monotonic()), 3),
                failures=workload.failures)
        nothing_lost(workload, figures)
