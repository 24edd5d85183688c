"""Admin(dlm).inspect / is_locked / force_release (redlock.admin) on real redis-server
nodes, both clients."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from redlock import AsyncRedlock, LockLost, QuorumUnavailable, Redlock
from redlock.admin import Admin, AsyncAdmin, LockStatus, ReleaseReport
from redlock.testing import RedisNodes, capture_events
from tests.clients import admin
from tests.internals import KEYS


async def run(value: Any) -> Any:
    """The result of a sync call as is, of an async one awaited."""
    return await value if inspect.isawaitable(value) else value


class Clients:
    """Redlock or AsyncRedlock managers for one test; closed at its end."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.made: list[Redlock | AsyncRedlock] = []

    def __call__(self, urls: list[str], **options: Any) -> Any:
        dlm = (Redlock if self.kind == "sync" else AsyncRedlock)(urls, **options)
        self.made.append(dlm)
        return dlm


@pytest.fixture(params=["sync", "async"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[Clients]:
    clients = Clients(str(request.param))
    yield clients
    for dlm in clients.made:
        await run(dlm.close())


async def acquire(dlm: Any, resource: str, ttl: float = 10.0) -> Any:
    lock = dlm.lock(resource, ttl=ttl)
    assert await run(lock.acquire(blocking=False))
    return lock


def raw_owner_values(nodes: RedisNodes, resource: str) -> list[bytes]:
    values = []
    for node in nodes:
        with node.client() as client:
            value = client.get(KEYS.lock(resource))
            if value is not None:
                values.append(value)
    return values


async def test_free_resource_on_a_new_cluster(nodes3: RedisNodes, make: Clients) -> None:
    dlm = make(nodes3.urls)
    status = await run(admin(dlm).inspect("ins:free"))
    assert isinstance(status, LockStatus)
    assert status.resource == "ins:free" and status.quorum == 2
    assert [n.node for n in status.nodes] == list(dlm.nodes)
    for node in status.nodes:
        assert node.reachable and node.error is None
        assert node.held is False and node.pttl_ms == 0 and node.fence == 0
        assert node.marker is False  # nobody has locked anything on these nodes yet
        assert node.holder is None and not node.benched
    assert status.locked is False
    assert await run(admin(dlm).is_locked("ins:free")) is False


async def test_held_resource_shows_holder_fence_and_pttl_but_not_the_owner_value(
        nodes3: RedisNodes, make: Clients) -> None:
    holder_dlm, other_dlm = make(nodes3.urls), make(nodes3.urls)
    for _ in range(3):  # fence counters at 3 before the lock we look at
        lock = await acquire(holder_dlm, "ins:held")
        await run(lock.release())
    lock = await acquire(holder_dlm, "ins:held", ttl=10.0)
    status = await run(admin(other_dlm).inspect("ins:held"))
    assert status.locked is True
    assert {n.fence for n in status.nodes} == {lock.token} == {4}
    assert all(n.held and n.marker and 0 < n.pttl_ms <= 10_000 for n in status.nodes)
    holders = {n.holder for n in status.nodes}
    assert len(holders) == 1 and len(holders.pop()) == 12
    # The lock value (which would let anyone release or extend) never leaves the nodes.
    owners = raw_owner_values(nodes3, "ins:held")
    assert len(owners) == 3
    shown = repr(status) + repr(status.as_dict())
    assert all(owner.decode() not in shown for owner in owners)
    # Anyone holds it (the nodes say), but only the holder's handle says "I hold it".
    assert await run(admin(other_dlm).is_locked("ins:held")) is True
    assert lock.locked() and not other_dlm.lock("ins:held").locked()
    await run(lock.release())
    assert await run(admin(other_dlm).is_locked("ins:held")) is False
    assert all(n.held is False and n.fence == 4 for n in (await run(
        admin(other_dlm).inspect("ins:held"))).nodes)


async def test_status_json_shape(nodes3: RedisNodes, make: Clients) -> None:
    dlm = make(nodes3.urls)
    lock = await acquire(dlm, "ins:json")
    shape = (await run(admin(dlm).inspect("ins:json"))).as_dict()
    assert set(shape) == {"resource", "quorum", "locked", "nodes"}
    assert shape["resource"] == "ins:json" and shape["locked"] is True
    for entry, address in zip(shape["nodes"], dlm.nodes, strict=True):
        assert set(entry) == {"node", "held", "holder", "pttl_ms", "fence", "marker",
                              "error"}
        assert entry["node"] == address and len(entry["holder"]) == 12
        assert entry["held"] is True and entry["marker"] is True and entry["error"] is None
        assert isinstance(entry["pttl_ms"], int) and isinstance(entry["fence"], int)
    await run(lock.release())


async def test_unreachable_nodes_are_reported_and_can_leave_is_locked_undecided(
        fresh_nodes: Callable[..., RedisNodes], make: Clients) -> None:
    nodes = fresh_nodes(3)
    dlm = make(nodes.urls, node_timeout=0.5)
    lock = await acquire(dlm, "ins:down")
    nodes[2].stop()
    status = await run(admin(dlm).inspect("ins:down"))
    down = status.nodes[2]
    assert not down.reachable and down.held is None and down.fence is None
    assert "Unreachable" in (down.error or "")
    assert status.locked is True  # the holder's key is still on the two others
    with nodes[0].client() as client:  # the key vanishes from one of them
        client.delete(KEYS.lock("ins:down"))
    assert (await run(admin(dlm).inspect("ins:down"))).locked is None
    with pytest.raises(QuorumUnavailable, match="cannot tell") as failure:
        await run(admin(dlm).is_locked("ins:down"))
    assert [r.node for r in failure.value.outcomes] == [dlm.nodes[2]]
    await run(lock.release())
    assert await run(admin(dlm).is_locked("ins:down")) is False  # 0 held + 1 unknown < quorum


async def test_an_amnesiac_node_shows_as_benched(fresh_nodes: Callable[..., RedisNodes],
                                                make: Clients) -> None:
    nodes = fresh_nodes(3)
    dlm = make(nodes.urls, node_timeout=0.5, max_ttl=600.0)
    await run((await acquire(dlm, "ins:amnesia")).release())
    nodes[1].restart(keep_data=False)
    for _ in range(100):
        # An acquire that sees node 1 without its marker benches it, and the manager's
        # background maintenance opens its episode. One acquire may not see it: with
        # early quorum it can be decided on nodes 0 and 2 before node 1 (reconnecting
        # after its restart) answers, so keep acquiring until the episode shows.
        await run((await acquire(dlm, "ins:amnesia")).release())
        status = await run(admin(dlm).inspect("ins:amnesia"))
        if status.nodes[1].rejoins_in_s is not None:
            break
        await asyncio.sleep(0.05)
    benched = status.nodes[1]
    assert benched.reachable and benched.marker is False and benched.benched
    assert benched.rejoins_in_s is not None and 0 < benched.rejoins_in_s <= 600.0
    assert benched.fence == 0  # counters gone with its data, until a repair re-seeds them
    healthy = (status.nodes[0], status.nodes[2])
    assert all(n.marker and not n.benched for n in healthy)
    assert healthy[0].fence == healthy[1].fence >= 2


async def test_force_release_evicts_any_holder_and_keeps_the_fence(
        nodes3: RedisNodes, make: Clients) -> None:
    holder_dlm, operator = make(nodes3.urls), make(nodes3.urls)
    held = await acquire(holder_dlm, "ins:force")
    with capture_events() as events:
        reports = await run(admin(operator).force_release("ins:force"))
    assert reports == [ReleaseReport(node, "deleted") for node in operator.nodes]
    warned = [e for e in events if e["event"] == "redlock.force_released"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert warned[0]["deleted"] == 3 and warned[0]["failed"] == []
    assert raw_owner_values(nodes3, "ins:force") == []
    successor = await acquire(operator, "ins:force")  # at once: no TTL to wait for
    assert successor.token > held.token  # fence counters survive a forced release
    with pytest.raises(LockLost):
        await run(held.extend())  # the evicted holder learns it at its next extend
    await run(successor.release())
    assert await run(admin(operator).force_release("ins:force")) == [
        ReleaseReport(node, "absent") for node in operator.nodes]


async def test_force_release_reports_nodes_it_could_not_reach(
        fresh_nodes: Callable[..., RedisNodes], make: Clients) -> None:
    nodes = fresh_nodes(3)
    dlm = make(nodes.urls, node_timeout=0.5)
    await acquire(dlm, "ins:force-down")
    nodes[0].stop()
    with capture_events() as events:
        reports = await run(admin(dlm).force_release("ins:force-down"))
    assert [r.status for r in reports] == ["failed", "deleted", "deleted"]
    assert "Unreachable" in reports[0].detail
    warned = [e for e in events if e["event"] == "redlock.force_released"]
    assert warned[0]["deleted"] == 2 and len(warned[0]["failed"]) == 1


def test_force_release_wakes_a_waiter_of_the_same_manager(nodes3: RedisNodes) -> None:
    # The waiter would sleep 5 s between attempts; the forced release hands it the lock.
    with Redlock(nodes3.urls, retry_delay_min=5.0, retry_delay_max=5.0) as dlm, \
            Redlock(nodes3.urls) as holder_dlm:
        held = holder_dlm.lock("ins:wake", ttl=30.0)
        assert held.acquire(blocking=False)
        got: list[float] = []

        def waiter() -> None:
            with dlm.lock("ins:wake", ttl=5.0, timeout=30.0):
                got.append(time.monotonic())

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)  # the waiter made its first attempt and sleeps in its line
        released_at = time.monotonic()
        Admin(dlm).force_release("ins:wake")
        thread.join(30.0)
        assert got and got[0] - released_at < 4.0  # woken, not at its next 5 s attempt


async def test_force_release_wakes_a_waiting_task_of_the_same_manager(
        nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls, retry_delay_min=5.0, retry_delay_max=5.0) as dlm, \
            AsyncRedlock(nodes3.urls) as holder_dlm:
        held = holder_dlm.lock("ins:wake-a", ttl=30.0)
        assert await held.acquire(blocking=False)

        async def waiter() -> float:
            async with dlm.lock("ins:wake-a", ttl=5.0, timeout=30.0):
                return time.monotonic()

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.3)
        released_at = time.monotonic()
        await AsyncAdmin(dlm).force_release("ins:wake-a")
        got = await asyncio.wait_for(task, 30.0)
        assert got - released_at < 4.0


async def test_bad_resource_names_are_refused_at_the_call_site(nodes3: RedisNodes,
                                                              make: Clients) -> None:
    dlm = make(nodes3.urls)
    tools = admin(dlm)
    for method in (tools.inspect, tools.is_locked, tools.force_release):
        with pytest.raises(TypeError):
            await run(method(42))
        with pytest.raises(ValueError):
            await run(method(""))


async def test_an_admin_takes_a_manager_of_its_own_flavour() -> None:
    # Constructing sends nothing, so an address nobody listens on is fine here.
    url = "redis://127.0.0.1:1"
    with Redlock([url]) as dlm:
        assert Admin(dlm).manager is dlm
        with pytest.raises(TypeError, match="AsyncAdmin takes an AsyncRedlock, not a"
                           " Redlock: use Admin"):
            AsyncAdmin(dlm)  # type: ignore[arg-type]
    async with AsyncRedlock([url]) as adlm:
        assert AsyncAdmin(adlm).manager is adlm
        with pytest.raises(TypeError, match=r"^Admin takes a Redlock, not an AsyncRedlock"):
            Admin(adlm)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^Admin takes a Redlock, not list$"):
        Admin([url])  # type: ignore[arg-type]
