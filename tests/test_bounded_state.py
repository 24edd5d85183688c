"""Nothing on the nodes grows with the number of resources ever locked (docs/design.md
§3.0): 20,000 distinct names, each locked once (a quarter of them contended by a second
thread, which waits in the nodes' lines), every lock left to lapse or released; then
each node holds at most 64 keys and at most 512 KiB more than before, tokens still rise
per resource, and no acquire failed. Real nodes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from redlock import Redlock
from redlock._scripts.hash_slots import HASH_SLOTS
from redlock.testing import RedisNodes
from redlock.testing.redis_cluster import RedisClusterNodes
from tests.internals import KEYS

NAMES = 20_000
TTL = 1.0  # the locks left to lapse go within a second of the last one


@pytest.fixture
def nodes() -> Iterator[RedisNodes]:
    with RedisNodes(3) as started:
        yield started


def used_memory(nodes: RedisNodes) -> list[int]:
    found = []
    for node in nodes:
        with node.client() as client:
            found.append(int(client.info("memory")["used_memory"]))
    return found


def key_counts(nodes: RedisNodes) -> list[int]:
    counts = []
    for node in nodes:
        with node.client() as client:
            counts.append(int(client.dbsize()))
    return counts


def test_twenty_thousand_names_leave_a_fixed_set_of_keys_per_node(nodes: RedisNodes) -> None:
    urls = list(nodes.urls)
    with Redlock(urls, node_timeout=0.5) as dlm, Redlock(urls, node_timeout=0.5) as rival:
        # Every script loaded and every node key written before the baseline.
        with dlm.lock("warm-up", ttl=TTL) as held:
            assert rival.lock("warm-up", ttl=TTL).acquire(blocking=True, timeout=0.05) is False
            assert held.token == 1
        baseline = used_memory(nodes)
        failures: list[str] = []
        contended: list[int] = []

        def contend(names: list[str]) -> None:
            # A second manager, each name once: it waits in the nodes' line for the
            # holder's release (or lapse), then holds it and lets its TTL lapse.
            for name in names:
                lock = rival.lock(name, ttl=TTL)
                if lock.acquire(blocking=True, timeout=3.0):
                    contended.append(lock.token)
                else:
                    failures.append(f"rival {name}")

        tokens: dict[str, int] = {}
        quarter = [f"order:{i}" for i in range(0, NAMES, 4)]
        rival_thread = threading.Thread(target=contend, args=(quarter,))
        started = time.monotonic()
        for i in range(NAMES):
            name = f"order:{i}"
            lock = dlm.lock(name, ttl=TTL)
            if not lock.acquire(blocking=True, timeout=3.0):
                failures.append(name)
                continue
            tokens[name] = lock.token
            if i == 0:
                rival_thread.start()
            if i % 2 == 0:
                lock.release()  # half released, half left to lapse
        rival_thread.join(120)
        assert not rival_thread.is_alive()
        assert failures == []
        assert len(tokens) == NAMES and len(contended) == len(quarter)
        elapsed = time.monotonic() - started
        # Tokens rise per resource: a name locked again gets more than it got before.
        for name in ("order:0", "order:1", f"order:{NAMES - 1}"):
            with dlm.lock(name, ttl=TTL, blocking=True, timeout=3.0) as again:
                assert again.token > tokens[name]
    # Every lock key and line lapses within TTL (bounded wait).
    deadline = time.monotonic() + 10 * TTL + 5
    while time.monotonic() < deadline and max(key_counts(nodes)) > 4:
        time.sleep(0.1)
    for node in nodes:
        with node.client() as client:
            left = sorted(k.decode() for k in client.keys("*"))
        assert len(left) <= 64, left[:20]
        # The node's own keys: its counters, its marker, and its lease horizon (which
        # expires too, with the last lease: docs/design.md §4.3.1).
        assert set(left) <= {KEYS.counter, KEYS.marker, KEYS.horizon}, left[:20]
    grown = [after - before for before, after in zip(baseline, used_memory(nodes),
                                                      strict=True)]
    assert max(grown) <= 512 * 1024, (grown, f"{NAMES} names in {elapsed:.1f} s")


def test_twenty_thousand_names_leave_at_most_two_keys_per_hash_slot_of_a_cluster(
        redlock_redis_cluster: RedisClusterNodes) -> None:
    """A Redis Cluster as the one node (docs/design.md §11.4): its node keys are kept per
    hash slot (a marker each, a fence counter per hash slot used, a lease horizon while a
    lease lives), so after 20,000 names each master holds at most two keys per hash slot
    it serves, none of them a resource's."""
    with Redlock([redlock_redis_cluster.node_url], node_timeout=0.5) as dlm:
        with dlm.lock("warm-up", ttl=TTL):  # (the cluster initialised: 16,384 markers)
            pass
        failures = []
        for i in range(NAMES):
            lock = dlm.lock(f"order:{i}", ttl=TTL)
            if lock.acquire(blocking=True, timeout=3.0):
                lock.release()
            else:
                failures.append(i)
        assert failures == []
    deadline = time.monotonic() + 10 * TTL + 5
    served = {id(master): 0 for master in redlock_redis_cluster.masters()}
    for slot in range(HASH_SLOTS):
        served[id(redlock_redis_cluster.master_of(slot))] += 1
    for master in redlock_redis_cluster.masters():
        with master.client() as client:
            while time.monotonic() < deadline and client.dbsize() > 2 * served[id(master)]:
                time.sleep(0.1)
            left = [k.decode() for k in client.scan_iter(count=10_000)]
        assert len(left) <= 2 * served[id(master)], (len(left), served[id(master)])
        kinds = {name.rsplit(":", 1)[1] for name in left}
        assert all(name.startswith(f"{KEYS.namespace}:node:{{") for name in left), left[:5]
        assert kinds <= {"marker", "fence", "horizon"}, kinds
