"""Deadlines on every path (docs/design.md §2.5): ``acquire(timeout=T)`` returns by
T + 0.2 s, and a single try by its request ceiling + 0.2 s, whatever state the cluster
is in: new, initialised, with hung nodes (SIGSTOP: they accept connections and never
answer), with nodes that lost their data, met on a manager's first connections, behind
a hung Sentinel, or while a repair is under way. Real servers, both clients
(tests/clients.py). Each failure names every node's outcome.

With TTL 5 s the request ceiling is 1 s, so both a try and ``timeout=1.0`` must return
within 1.2 s. These are promises, not benchmarks: the bounds are the promised ones,
measured with ``time.monotonic`` around the call. Before the acquire path was bounded
by its deadline, a new manager took 3 s for a try and 4 s for ``timeout=1.0`` with 3
of 5 nodes paused, new cluster or not: the first acquire's INFO round, the acquire,
the release of the failed attempt and the waiting line's release each waited a whole
request timeout for a quorum that could not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel

from redlock import ClusterAmnesiaError, LockNotAcquired, Outcome, QuorumUnavailable
from redlock.testing import RedisNode, RedisNodes, RedisSentinel
from tests.clients import Actor, Flavour, Held, Stopwatch, admin, resolve
from tests.peek import markers, outcomes_by_node, paused

pytestmark = pytest.mark.faults

TTL = 5.0  # its request ceiling (a fifth, at most 2 s): 1 s
TIMEOUT = 1.0
SLACK = 0.2
BOUND = TIMEOUT + SLACK  # for a try (ceiling 1 s) and for timeout=1.0 alike
MODES = ("try", "timeout=1.0")
PAUSED = [0, 2, 3]  # a majority of five


async def attempt(me: Actor, dlm: Any, mode: str, resource: str = "dl",
                  ttl: float = TTL, held: Held | None = None) -> tuple[float, Any]:
    """One acquire call in ``mode`` as ``me`` (through ``held``, or a new handle):
    (seconds it took, what it returned or raised)."""
    held = held or me.on(dlm.lock(resource, ttl=ttl))
    took = Stopwatch()
    try:
        if mode == "try":
            outcome: Any = await held.acquire(False)
        else:
            outcome = await held.acquire(True, TIMEOUT)
    except Exception as exc:
        outcome = exc
    elapsed = took()
    print(f"\n{mode}: {elapsed:.3f} s -> {outcome!r:.300}")
    return elapsed, outcome


async def initialise(flavour: Flavour, nodes: RedisNodes | Sequence[Any]) -> None:
    """Give the cluster its markers: one lock taken and released by another manager."""
    dlm = flavour.manager(nodes)
    actor = flavour.actor("initialiser")
    assert await actor.cycle(dlm.lock("dl:init", ttl=TTL, timeout=5.0)) >= 1
    await resolve(dlm.close())


async def warm(flavour: Flavour, me: Actor, dlm: Any) -> None:
    """The manager's connections open and its round trips measured (a lock taken)."""
    await me.cycle(dlm.lock("dl:warm", ttl=TTL, timeout=5.0))


def outcome_errors(error: BaseException) -> list[Outcome]:
    assert isinstance(error, LockNotAcquired | ClusterAmnesiaError), repr(error)
    return [r.outcome for r in error.outcomes]


@pytest.mark.parametrize("mode", MODES)
async def test_new_cluster_with_three_of_five_paused(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, mode: str) -> None:
    """No node has a marker yet, and the manager's first connections meet hung nodes."""
    assert markers(nodes5) == [None] * 5
    dlm = flavour.bare_manager(nodes5)  # the library's defaults (adaptive timeouts)
    with paused(nodes5, PAUSED):
        elapsed, error = await attempt(me, dlm, mode)
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= BOUND
    assert "new cluster not initialised yet" in str(error)
    assert outcomes_by_node(error, nodes5) == [
        Outcome.ERROR, Outcome.AMNESIAC, Outcome.ERROR, Outcome.ERROR, Outcome.AMNESIAC]
    # A partial view never initialises: no node got a marker.
    assert markers(nodes5) == [None] * 5


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("manager", ["new manager", "warm manager"])
async def test_initialised_cluster_with_three_of_five_paused(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, manager: str, mode: str) -> None:
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    if manager == "warm manager":
        await warm(flavour, me, dlm)
    with paused(nodes5, PAUSED):
        elapsed, error = await attempt(me, dlm, mode)
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= BOUND
    assert "2 of 5 nodes granted, need 3" in str(error)
    assert outcomes_by_node(error, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]
    assert all(r.detail for r in error.outcomes if r.outcome is Outcome.ERROR)


@pytest.mark.parametrize("mode", MODES)
async def test_a_set_of_resources_with_three_of_five_paused(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, mode: str) -> None:
    """lock_many takes the same path (ACQUIRE_MANY): the same deadline."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    with paused(nodes5, PAUSED):
        elapsed, error = await attempt(me, dlm, mode,
                                       held=me.on(dlm.lock_many(["dl:a", "dl:b"], ttl=TTL)))
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= BOUND
    assert outcomes_by_node(error, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]


@pytest.mark.parametrize("mode", MODES)
async def test_a_single_try_is_bounded_by_its_own_request_ceiling(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, mode: str) -> None:
    """TTL 2.5 s: a ceiling of 0.5 s, so a try returns within 0.7 s (and timeout=1.0
    within 1.2 s, its attempts each bounded by the ceiling and all by the deadline)."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    with paused(nodes5, PAUSED):
        elapsed, error = await attempt(me, dlm, mode, ttl=2.5)
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= (0.5 if mode == "try" else TIMEOUT) + SLACK
    assert len(error.outcomes) == 5


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cluster", ["new", "initialised"])
async def test_first_connections_to_a_hung_minority(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, cluster: str, mode: str) -> None:
    """Two of five nodes hung from a new manager's very first connection (the handshake,
    IDENTIFY, is never answered): an initialised cluster grants at once; a new one may
    not be initialised from a partial view, and says so within the deadline."""
    if cluster == "initialised":
        await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    lock = me.on(dlm.lock("dl", ttl=TTL))
    with paused(nodes5, [1, 3]):
        elapsed, outcome = await attempt(me, dlm, mode, held=lock)
        if cluster == "initialised":
            assert outcome is True
            await lock.release()
    assert elapsed <= BOUND
    if cluster == "new":
        assert isinstance(outcome, QuorumUnavailable), repr(outcome)
        assert "new cluster not initialised yet: all 5 nodes must answer once, 2 did not" \
            in str(outcome)
        assert outcomes_by_node(outcome, nodes5) == [
            Outcome.AMNESIAC, Outcome.ERROR, Outcome.AMNESIAC, Outcome.ERROR,
            Outcome.AMNESIAC]


def _wipe(node: RedisNode, how: str) -> None:
    if how == "restarted empty":
        node.restart(keep_data=False)
    else:
        with node.client() as client:
            client.flushall()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("manager", ["new manager", "warm manager"])
@pytest.mark.parametrize("how", ["FLUSHALL", "restarted empty"])
async def test_an_amnesiac_node_and_two_hung_ones(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, how: str, manager: str,
        mode: str) -> None:
    """Node 0 lost its data (no marker: it refuses, and a second look is due before it
    is called amnesiac), nodes 3 and 4 are hung: two healthy nodes, an outage."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    if manager == "warm manager":
        await warm(flavour, me, dlm)
    _wipe(nodes5[0], how)
    with paused(nodes5, [3, 4]):
        elapsed, error = await attempt(me, dlm, mode)
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= BOUND
    assert outcomes_by_node(error, nodes5) == [
        Outcome.AMNESIAC, Outcome.GRANTED, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR]


@pytest.mark.parametrize("mode", MODES)
async def test_a_majority_wiped_beside_a_hung_node(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, mode: str) -> None:
    """Three nodes lost their data and a fourth hangs: a manager that knew the cluster
    looks again at the three (the probe of §4.2) and refuses with ClusterAmnesiaError,
    within the deadline."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    await warm(flavour, me, dlm)
    for i in (0, 1, 2):
        _wipe(nodes5[i], "FLUSHALL")
    with paused(nodes5, [4]):
        elapsed, error = await attempt(me, dlm, mode)
    assert elapsed <= BOUND
    assert isinstance(error, ClusterAmnesiaError), repr(error)
    assert outcomes_by_node(error, nodes5) == [
        Outcome.AMNESIAC, Outcome.AMNESIAC, Outcome.AMNESIAC, Outcome.GRANTED, Outcome.ERROR]


@pytest.mark.parametrize("mode", MODES)
async def test_while_a_repair_is_under_way(
        flavour: Flavour, me: Actor, nodes5: RedisNodes, mode: str) -> None:
    """Node 0 lost its data and is being repaired (forced) by another thread or task of
    the same manager; the repair waits for counters from hung nodes (one repair_timeout,
    2 s). An acquire meanwhile keeps its own deadline."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    await warm(flavour, me, dlm)
    _wipe(nodes5[0], "FLUSHALL")
    await me.cycle(dlm.lock("dl:bench", ttl=TTL, timeout=5.0))  # node 0 is benched
    repairer = flavour.actor("repairer")
    with paused(nodes5, [2, 3, 4]):
        repairing = asyncio.ensure_future(repairer.call(admin(dlm).repair, force=True))
        try:
            await asyncio.sleep(0.1)  # the repair has claimed node 0 and reads counters
            assert not repairing.done()
            elapsed, error = await attempt(me, dlm, mode)
            assert not repairing.done(), "the repair was over before the acquire"
        finally:
            reports = await repairing
    assert isinstance(error, QuorumUnavailable), repr(error)
    assert elapsed <= BOUND
    assert outcomes_by_node(error, nodes5) == [
        Outcome.AMNESIAC, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR, Outcome.ERROR]
    assert reports[0].status == "failed", reports


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_tries_of_one_manager_keep_their_own_deadlines(
        flavour: Flavour, nodes5: RedisNodes, mode: str) -> None:
    """Attempts of one manager on one resource take turns (docs/design.md §6.5): the
    second waits for the first's round, which a hung majority stretches to its whole
    timeout. The wait for the turn is part of the second's own deadline."""
    await initialise(flavour, nodes5)
    dlm = flavour.bare_manager(nodes5)
    first, second = flavour.actor("first"), flavour.actor("second")
    with paused(nodes5, PAUSED):
        results = await asyncio.gather(attempt(first, dlm, mode), attempt(second, dlm, mode))
    for elapsed, error in results:
        assert isinstance(error, QuorumUnavailable), repr(error)
        assert elapsed <= BOUND
        assert len(error.outcomes) == 5


SERVICES = ("s0", "s1", "s2")


@pytest.fixture
def sentinel3(fresh_nodes: Callable[..., RedisNodes]) -> Iterator[tuple[RedisNodes,
                                                                        RedisSentinel]]:
    """Three masters behind one Sentinel (services s0, s1, s2); the sentinel is resumed
    and closed afterwards."""
    masters = fresh_nodes(3)
    with RedisSentinel(dict(zip(SERVICES, masters, strict=True))) as sentinel:
        try:
            yield masters, sentinel
        finally:
            sentinel.resume()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cluster", ["new", "initialised"])
async def test_sentinel_discovery_through_a_hung_sentinel(
        flavour: Flavour, me: Actor, sentinel3: tuple[RedisNodes, RedisSentinel],
        cluster: str, mode: str) -> None:
    """Every node is a Sentinel service; the sentinel hangs, so each of a new manager's
    first connections waits for it to name the master (one connect_timeout, 1 s, in the
    background): the acquire keeps its deadline and names each node's outcome."""
    masters, sentinel = sentinel3
    if cluster == "initialised":
        await initialise(flavour, masters)
    if flavour.is_async:
        sentinels: Any = redis.asyncio.sentinel.Sentinel([sentinel.address],
                                                          socket_timeout=1.0)
    else:
        sentinels = redis.Sentinel([sentinel.address], socket_timeout=1.0)
    clients = [sentinels.master_for(name, socket_timeout=1.0) for name in SERVICES]
    try:
        dlm = flavour.bare_manager(clients)
        sentinel.pause()
        try:
            elapsed, error = await attempt(me, dlm, mode)
        finally:
            sentinel.resume()
        assert isinstance(error, QuorumUnavailable), repr(error)
        assert elapsed <= BOUND
        assert [r.node for r in error.outcomes] == [f"sentinel:{s}" for s in SERVICES]
        assert [r.outcome for r in error.outcomes] == [Outcome.ERROR] * 3
        await resolve(dlm.close())
    finally:
        for client in [*clients, *sentinels.sentinels]:
            await resolve(client.aclose() if flavour.is_async else client.close())
