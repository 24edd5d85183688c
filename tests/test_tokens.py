"""Fencing tokens never go backwards, on both clients (tests/clients.py): across
acquisitions, managers and majorities, with diverged counters, and when nodes come
back empty (amnesia: detected, benched, re-seeded; a majority of it is refused).

Fence counters are set and read straight on the nodes. Each holder that must not lean
on a client-side token floor uses a manager of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from redlock import ClusterAmnesiaError, Outcome, RedlockError
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, admin, eventually, resolve
from tests.peek import (
    any_lock_keys,
    decided_as,
    fence_counters,
    lock_keys,
    markers,
    node_address,
    resume_and_settle,
    set_fence_counters,
    strictly_increasing,
)

# ---------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------


async def test_tokens_strictly_increase_over_1000_acquisitions_across_managers(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    resource = "tokens:1000"
    locks = [me.on(flavour.manager(cluster).lock(resource, ttl=5.0)) for _ in range(2)]
    tokens = []
    for i in range(1000):
        lock = locks[i % 2]
        assert await lock.acquire(timeout=5.0)
        tokens.append(await lock.token())
        await lock.release()
    assert strictly_increasing(tokens)
    assert len(set(tokens)) == 1000
    # Every node (all are up) remembers a counter as high as the last token: a majority
    # of them is what a token needs (a straggler's, decided without, may still be on its
    # way on a loaded machine).
    assert await eventually(
        lambda: fence_counters(cluster, resource) == [tokens[-1]] * len(cluster), 2.0), \
        fence_counters(cluster, resource)
    assert any_lock_keys(cluster) == [[]] * len(cluster)


async def test_diverged_counters_all_nodes_up_token_is_max_and_written_back(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    resource = "fence:diverged"
    await me.cycle(flavour.manager(nodes5).lock(resource, timeout=5.0))  # writes the markers
    set_fence_counters(nodes5, resource, [10, 5, 5, 5, 5])
    assert await me.cycle(flavour.manager(nodes5).lock(resource, timeout=5.0)) == 11
    # The write-back raised the four lower counters to the token.
    assert fence_counters(nodes5, resource) == [11] * 5


async def test_counters_agreeing_on_a_quorum_need_no_write_back(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """The second round runs only when fewer than a quorum returned the token."""
    resource = "fence:agreeing"
    await me.cycle(flavour.manager(nodes5).lock(resource, timeout=5.0))
    set_fence_counters(nodes5, resource, [10, 10, 10, 5, 5])
    assert await me.cycle(flavour.manager(nodes5).lock(resource, timeout=5.0)) == 11
    assert fence_counters(nodes5, resource) == [11, 11, 11, 6, 6]


async def test_token_stops_below_2_pow_53(flavour: Flavour, me: Actor,
                                          nodes3: RedisNodes) -> None:
    resource = "fence:limit"
    dlm = flavour.manager(nodes3)
    await me.cycle(dlm.lock(resource, timeout=5.0))
    set_fence_counters(nodes3, resource, [2**53 - 2] * 3)
    # Still exact on the nodes (Lua numbers):
    assert await me.cycle(dlm.lock(resource, timeout=5.0)) == 2**53 - 1
    lock = me.on(dlm.lock(resource))
    assert not await lock.acquire(blocking=False)
    assert lock.last_failure is not None
    assert "fence counter reached" in str(lock.last_failure)
    assert lock_keys(nodes3, resource) == [False] * 3


async def test_tokens_increase_across_different_majorities_after_divergence(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """docs/design.md §3: counters 10,5,5,5,5; A wins {0,1,2} and gets 11; B later wins
    {2,3,4}. Without the quorum write-back B would get 7. Each holder uses its own
    manager so no client-side token floor can hide a backwards token."""
    resource = "fence:majorities"

    async def fresh_holder() -> int:
        return await me.cycle(flavour.manager(nodes5).lock(resource, timeout=5.0))

    await fresh_holder()
    set_fence_counters(nodes5, resource, [10, 5, 5, 5, 5])
    seen = []
    for paused in ([3, 4], [0, 1], [0, 4]):  # majorities {0,1,2}, {2,3,4}, {1,2,3}
        for i in paused:
            nodes5[i].pause()
        seen.append(await fresh_holder())
        if paused == [3, 4]:
            assert seen == [11]
            assert fence_counters(nodes5[:3], resource) == [11, 11, 11]
        resume_and_settle([nodes5[i] for i in paused], resource)
    seen.append(await fresh_holder())  # everyone back
    assert strictly_increasing(seen), seen


# ---------------------------------------------------------------------------
# Amnesia: nodes restarted empty
# ---------------------------------------------------------------------------


async def test_minority_amnesia_is_excluded_then_repaired_and_tokens_keep_increasing(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """Token t is committed on {0, 1, 2} only (3 and 4 lag far behind), then 0 and 1
    come back empty. They must stay out until one max_ttl has passed, then be re-seeded
    from a healthy majority (which includes node 2), so that the majority {0, 1, 3}
    still hands out a token above t. Without the re-seed it would hand out ~5."""
    fenced, busy = "amnesia:fenced", "amnesia:busy"
    max_ttl = 1.0
    dlm = flavour.manager(nodes5, max_ttl=max_ttl)
    busy_seen = [await me.cycle(dlm.lock(busy, ttl=max_ttl, timeout=5.0))]  # initialises
    set_fence_counters(nodes5, fenced, [10, 10, 10, 3, 3])
    for i in (3, 4):
        nodes5[i].pause()
    committed = await me.cycle(flavour.manager(nodes5).lock(fenced, ttl=max_ttl, timeout=5.0))
    resume_and_settle(nodes5[3:], fenced)
    assert committed == 11
    assert max(fence_counters(nodes5[3:], fenced)) < 10

    amnesiac = [nodes5[0], nodes5[1]]
    for node in amnesiac:
        node.restart(keep_data=False)
        assert markers([node]) == [None]

    # Detected and excluded: locks are granted by the three healthy nodes only.
    lock = me.on(dlm.lock(busy, ttl=max_ttl))
    assert await lock.acquire(timeout=5.0)
    busy_seen.append(await lock.token())
    assert lock_keys(nodes5, busy) == [False, False, True, True, True]
    await lock.release()
    reports = {r.node: r for r in await resolve(admin(dlm).repair())}
    for node in amnesiac:
        report = reports[node_address(node)]
        assert report.status == "waiting", report
    assert markers(amnesiac) == [None, None]

    # After one max_ttl the next acquire (of any resource) re-seeds their fence counter
    # from a healthy majority and gives their markers back.
    await asyncio.sleep(max_ttl + 0.1)
    busy_seen.append(await me.cycle(dlm.lock(busy, ttl=max_ttl, timeout=5.0)))
    assert all(marker is not None for marker in markers(amnesiac))
    assert min(fence_counters(amnesiac, fenced)) >= committed  # busy's grants moved it on
    assert strictly_increasing(busy_seen), busy_seen

    # The majority {0, 1, 3}: two repaired nodes and a lagging one. A fresh client (no
    # floor of its own) must still get a token above the committed one.
    for i in (2, 4):
        nodes5[i].pause()
    fresh = flavour.manager(nodes5, max_ttl=max_ttl)
    after = await me.cycle(fresh.lock(fenced, ttl=max_ttl, timeout=5.0))
    resume_and_settle([nodes5[2], nodes5[4]], fenced)
    assert after > committed


async def test_explicit_repair_force_reseeds_an_empty_node(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    # The asyncio client once reported the restarted node 'failed': its pooled
    # connection to the old server process failed the first request (now retried once).
    resource = "amnesia:repair"
    dlm = flavour.manager(nodes3)
    seen = [await me.cycle(dlm.lock(resource, timeout=5.0)) for _ in range(3)]
    nodes3[2].restart(keep_data=False)
    statuses = [report.status for report in await resolve(admin(dlm).repair())]
    assert statuses == ["healthy", "healthy", "waiting"]
    statuses = [report.status for report in await resolve(admin(dlm).repair(force=True))]
    assert statuses == ["healthy", "healthy", "repaired"]
    assert markers([nodes3[2]]) != [None]
    assert fence_counters(nodes3, resource)[2] == seen[-1]
    nodes3[0].pause()  # majority {1, 2} includes the repaired node
    assert await me.cycle(flavour.manager(nodes3).lock(resource, timeout=5.0)) > seen[-1]
    resume_and_settle([nodes3[0]])


async def test_a_node_restarted_empty_cannot_grant_a_held_lock(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """The restarted node forgot the holder's key; it must not help anyone else win."""
    resource = "amnesia:held"
    holder = me.on(flavour.manager(nodes3).lock(resource, ttl=10.0))
    assert await holder.acquire(timeout=5.0)
    nodes3[2].restart(keep_data=False)
    other = flavour.actor("other").on(flavour.manager(nodes3).lock(resource, ttl=10.0))
    assert not await other.acquire(blocking=False)
    assert other.last_failure is not None
    assert decided_as(other.last_failure.outcomes, [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.AMNESIAC], quorum=2), other.last_failure.outcomes
    assert lock_keys([nodes3[2]], resource) == [False]
    await holder.extend()  # two of three still hold the holder's key
    token = await holder.token()
    await holder.release()
    assert await other.acquire(timeout=5.0)
    assert await other.token() > token
    await other.release()


async def test_durable_nodes_restarted_with_their_data_are_not_amnesiac(
        flavour: Flavour, me: Actor, fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(3, appendonly=True)
    dlm = flavour.manager(nodes)
    seen = [await me.cycle(dlm.lock("aof:x", timeout=5.0))]
    for node in nodes:  # kill -9 each one in turn; appendfsync always kept everything
        node.restart(keep_data=True)
        assert markers([node]) != [None]
        seen.append(await me.cycle(dlm.lock("aof:x", timeout=5.0)))
    assert strictly_increasing(seen)
    assert all(report.status == "healthy" for report in await resolve(admin(dlm).repair()))


async def test_majority_amnesia_raises_cluster_amnesia_error(
        flavour: Flavour, me: Actor, cluster: RedisNodes) -> None:
    resource = "amnesia:majority"
    dlm = flavour.manager(cluster)
    await me.cycle(dlm.lock(resource, timeout=5.0))
    lost = list(cluster)[: dlm.quorum]
    for node in lost:
        node.restart(keep_data=False)

    managers = [dlm] if len(cluster) == 1 else [dlm, flavour.manager(cluster)]  # N=1: below
    for manager in managers:
        with pytest.raises(ClusterAmnesiaError) as caught:
            await me.on(manager.lock(resource)).acquire(timeout=5.0)
        error = caught.value
        assert isinstance(error, RedlockError)
        assert "have no node marker" in str(error)
        assert "redlock initialise --force" in str(error)  # a step that works
        amnesiac = [r for r in error.outcomes if r.outcome is Outcome.AMNESIAC]
        assert len(amnesiac) == len(lost)
    # Nothing was silently reset: no markers written, no lock left anywhere.
    assert markers(lost) == [None] * len(lost)
    assert lock_keys(cluster, resource) == [False] * len(cluster)
    # (N=1: a brand-new client cannot tell a wiped single node from a new cluster;
    # only a client that saw the marker before can refuse.)
