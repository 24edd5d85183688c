"""Quorum under node failures: nodes paused with SIGSTOP (the kernel still accepts
connections, nothing answers), on both clients (tests/clients.py).

A minority of hung nodes costs about one node timeout per round and no key of ours
survives on them; a majority makes acquire and extend fail fast with every node's
outcome. Bounds are generous (the machine is shared); outcomes are exact.
"""

from __future__ import annotations

import pytest

from redlock import LockLost, LockNotAcquired, Outcome, QuorumUnavailable, RedlockError
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, Stopwatch, eventually
from tests.peek import any_lock_keys, lock_keys, outcomes_by_node


@pytest.mark.parametrize("paused", [[0], [4], [0, 1], [2, 4]], ids=str)
async def test_a_minority_of_five_paused_still_acquires_extends_and_releases(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, paused: list[int]) -> None:
    dlm = flavour.manager(nodes5)
    initialised = await me.cycle(dlm.lock("warm-up", timeout=5.0))  # writes the markers
    before = await me.cycle(dlm.lock("q:minority", timeout=5.0))
    assert initialised == before == 1  # two names in two of the nodes' counters
    for i in paused:
        nodes5[i].pause()
    running = [node for i, node in enumerate(nodes5) if i not in paused]
    try:
        lock = me.on(dlm.lock("q:minority", ttl=10.0))
        assert await lock.acquire(blocking=False)
        assert await lock.token() > before
        assert await lock.validity() > 8.0
        assert lock_keys(running, "q:minority") == [True] * len(running)
        await lock.extend()  # the running nodes' acks are a quorum
        await lock.release()
        assert lock_keys(running, "q:minority") == [False] * len(running)
    finally:
        for i in paused:
            nodes5[i].resume()
    # The hung nodes ran our acquire when they came back, and our release right after it.
    assert await eventually(lambda: any_lock_keys(nodes5) == [[]] * 5, 5.0), \
        any_lock_keys(nodes5)


async def test_three_of_five_paused_fail_fast_with_per_node_outcomes(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    dlm = flavour.manager(nodes5, node_timeout=0.05)  # the default node timeout
    await me.cycle(dlm.lock("q:majority", timeout=5.0))
    paused = [0, 2, 3]
    for i in paused:
        nodes5[i].pause()
    lock = me.on(dlm.lock("q:majority", ttl=10.0))
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        await lock.acquire(blocking=False)
    elapsed = took()
    print(f"\nnon-blocking acquire with 3 of 5 paused failed after {elapsed:.3f} s")
    assert elapsed < 2.0
    error = caught.value
    assert isinstance(error, LockNotAcquired) and isinstance(error, RedlockError)
    assert error.resource == "q:majority"
    assert [r.node for r in error.outcomes] == list(dlm.nodes)
    assert outcomes_by_node(error, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]
    for result in error.outcomes:
        if result.outcome is Outcome.ERROR:
            assert "Timeout" in result.detail or "within" in result.detail, result
    message = str(error)
    assert "2 of 5 nodes granted, need 3" in message
    assert "error" in message and "no reply within" in message
    assert lock.last_failure is error
    # The failed attempt released what it took on the running nodes.
    assert lock_keys([nodes5[1], nodes5[4]], "q:majority") == [False, False]

    # With a deadline, acquire and the with-block retry until it, then raise.
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable) as caught:
        async with me.holding(dlm.lock("q:majority", timeout=1.0)):
            pytest.fail("entered without a quorum")
    elapsed = took()
    print(f"with-block (timeout=1.0) with 3 of 5 paused failed after {elapsed:.3f} s")
    assert 0.9 <= elapsed < 4.0
    assert "after" in str(caught.value) and "need 3" in str(caught.value)
    took = Stopwatch()
    with pytest.raises(QuorumUnavailable):
        await lock.acquire(timeout=0.5)
    assert 0.45 <= took() < 5.0


async def test_paused_nodes_cost_one_node_timeout_not_one_each(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """Parallel means parallel, connection set-up included: with 3 nodes hung, one
    non-blocking attempt (acquire round + release round) costs about 2 node timeouts,
    not 2 per hung node."""
    node_timeout = 0.6
    dlm = flavour.manager(nodes5, node_timeout=node_timeout)
    await me.cycle(dlm.lock("q:parallel", timeout=5.0))
    for i in (0, 1, 2):
        nodes5[i].pause()
    lock = me.on(dlm.lock("q:parallel", ttl=10.0))
    durations = []
    for _ in range(2):  # the second attempt has to reconnect to the hung nodes
        took = Stopwatch()
        with pytest.raises(QuorumUnavailable):
            await lock.acquire(blocking=False)
        durations.append(took())
    print(f"\nattempts with 3 of 5 hung, node_timeout={node_timeout}: "
          + ", ".join(f"{d:.2f} s" for d in durations))
    for duration in durations:
        assert duration < 4 * node_timeout  # parallel: ~2; one at a time: 4-6


async def test_extend_with_a_minority_hung_succeeds_with_a_majority_hung_raises(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """A hung minority does not stop an extend. A hung majority says nothing about our key:
    the extend keeps trying while the validity lasts (the nodes may come back, docs/
    design.md §5.1), then the lock is lost, with the nodes' answers attached."""
    lock = me.on(flavour.manager(nodes5, node_timeout=0.1).lock("q:extend", ttl=3.0))
    assert await lock.acquire(timeout=5.0)
    nodes5[0].pause()
    nodes5[3].pause()
    await lock.extend(3.0)
    assert await lock.validity() > 2.8
    nodes5[4].pause()
    took = Stopwatch()
    with pytest.raises(LockLost, match="no quorum of the 5 nodes renewed it") as caught:
        await lock.extend()
    assert 2.0 < took() < 5.0  # until its validity (just under 3 s) ran out, no longer
    assert outcomes_by_node(caught.value, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR]
    assert await lock.lost()
    with pytest.raises(LockLost):
        await lock.check()
    with pytest.raises(LockLost):
        await lock.release()
