"""Hand-off in the release (docs/design.md §6.7) on real nodes, both clients: a release
grants the lock to the first waiter in line in the same script, and the waiter acquires
from the published messages, without an ACQUIRE round; mutual exclusion and rising
tokens under contention; the failure cases (a waiter that died or gave up, a node that
missed the release, a client that records nothing)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from redlock import LockLost
from redlock.testing import RedisNodes, capture_events
from redlock.testing.history import History, Hold
from tests.clients import Actor, Flavour, admin, eventually, resolve
from tests.internals import (
    KEYS,
    MUTEX,
    AcquireArgs,
    Call,
    hand_offs_heard,
    route_of,
    waiter_id,
    with_epoch,
)
from tests.peek import write_markers

ROOT = Path(__file__).resolve().parents[1]

# A backoff so slow that only a wake-up (or a hand-off) explains a quick acquisition.
SLOW_BACKOFF = {"retry_delay_min": 2.0, "retry_delay_max": 3.0}


def script_calls(nodes: RedisNodes) -> int:
    """EVALSHA and EVAL calls the nodes ran so far (INFO commandstats)."""
    total = 0
    for node in nodes:
        with node.client() as client:
            stats = client.info("commandstats")
            total += sum(stats.get(name, {}).get("calls", 0)
                         for name in ("cmdstat_evalsha", "cmdstat_eval"))
    return total


def reset_stats(nodes: RedisNodes) -> None:
    for node in nodes:
        with node.client() as client:
            client.config_resetstat()


def values(nodes: RedisNodes, resource: str) -> list[str | None]:
    found = []
    for node in nodes:
        with node.client() as client:
            value = client.get(KEYS.lock(resource))
            found.append(None if value is None else value.decode())
    return found


def records(nodes: RedisNodes, resource: str) -> list[int]:
    sizes = []
    for node in nodes:
        with node.client() as client:
            sizes.append(int(client.hlen(KEYS.line(resource) + "-ttls")))
    return sizes


def run(client: redis.Redis, call: Call) -> Any:
    assert call.script is not None
    return client.eval(call.script.source, len(call.keys), *call.keys, *call.args)


def waiter_by_hand(client: redis.Redis, resource: str, owner: str, ticket: int, *,
                   ttl_ms: int, attempt: int = 1, patience_ms: int = 60_000,
                   route: str = "") -> list[int]:
    """One node's ACQUIRE as a queued mutex waiter of this release sends it (it records
    its hand-off when refused): a waiter of another process (``route``: its manager's)."""
    [call] = with_epoch(MUTEX.acquire_calls(KEYS, range(1), (resource,), AcquireArgs(
        owner, ttl_ms, 0, str(ticket), patience_ms, attempt, route)), KEYS, 0)
    return [int(v) for v in run(client, call)]


def leave_by_hand(client: redis.Redis, resource: str, owner: str) -> int:
    """The RELEASE with leave of a waiter that gives up."""
    return int(run(client, MUTEX.release_call(KEYS, 0, resource, (owner, "1"))))


def published(subscriber: Any, settle: float = 0.2) -> list[tuple[str, str]]:
    """(channel, data) of the messages a subscriber hears: waits up to 5 s for the
    first, then takes what else comes within ``settle``."""
    heard: list[tuple[str, str]] = []
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        message = subscriber.get_message(timeout=0.5)
        if message and message["type"] == "message":
            heard.append((message["channel"].decode(), message["data"].decode()))
    time.sleep(settle)
    while (message := subscriber.get_message(timeout=0.1)) is not None:
        if message["type"] == "message":
            heard.append((message["channel"].decode(), message["data"].decode()))
    return heard


def attempts_recorded(nodes: RedisNodes, resource: str) -> list[int]:
    """Per node, the highest attempt number its hand-off records hold (0: none)."""
    found = []
    for node in nodes:
        with node.client() as client:
            fields = client.hvals(KEYS.line(resource) + "-ttls")
            found.append(max((int(v.split()[1]) for v in fields), default=0))
    return found


async def heard_everywhere(nodes: RedisNodes, resource: str) -> None:
    """Once every node has the waiter's subscription, and the waiter has made an attempt
    since: a hand-off counts only by a subscription that was up when its attempt went
    out (docs/design.md §6.7); a new waiter's first attempt precedes its subscriptions."""
    def subscribed() -> bool:
        for node in nodes:
            with node.client() as client:
                if not client.pubsub_numsub(KEYS.channel(resource))[0][1]:
                    return False
        return True

    assert await eventually(subscribed, 5.0)
    before = attempts_recorded(nodes, resource)
    assert await eventually(lambda: all(
        a > b for a, b in zip(attempts_recorded(nodes, resource), before, strict=True)), 5.0)


async def test_a_release_hands_the_lock_to_the_waiter_without_an_acquire_round(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    holder = me.on(flavour.manager(nodes3).lock("ho:one", ttl=30.0))
    assert await holder.acquire(blocking=False)
    first_token = await holder.token()
    waiter_dlm = flavour.manager(nodes3, **SLOW_BACKOFF)
    waiting = flavour.actor("waiter").on(waiter_dlm.lock("ho:one", ttl=10.0))
    with capture_events() as events:
        waiter = asyncio.create_task(waiting.actor.call_all(
            lambda: waiting.handle.acquire(timeout=20.0), time.monotonic))
        assert await eventually(lambda: records(nodes3, "ho:one") == [1, 1, 1], 5.0)
        await heard_everywhere(nodes3, "ho:one")
        before = script_calls(nodes3)
        released_at = time.monotonic()
        await holder.release()
        acquired, acquired_at = await asyncio.wait_for(waiter, 25)
        calls = script_calls(nodes3) - before
    assert acquired
    assert acquired_at - released_at < 1.0
    assert [e["heard"] for e in events if e["event"] == "redlock.handed_off"] in ([3], [2])
    # The holder's RELEASE on each node, and (at most, if its poll came just then) one
    # attempt of the waiter: no ACQUIRE round after the release.
    assert calls in (3, 6), calls
    assert await waiting.token() > first_token
    # The keys are reservations until a renewal makes them the lock value.
    reserved = values(nodes3, "ho:one")
    assert all(v is not None and v.startswith("handoff:") for v in reserved)
    # The status views show the reservation's waiter as the holder: the same prefix as
    # its lock value will show.
    status = await resolve(admin(waiter_dlm).inspect("ho:one"))
    assert status.locked
    assert {n.holder for n in status.nodes} == {reserved[0].removeprefix("handoff:")[:12]}
    await waiting.extend()
    assert not any(v is None or v.startswith("handoff:") for v in values(nodes3, "ho:one"))
    await waiting.release()
    assert values(nodes3, "ho:one") == [None] * 3
    assert records(nodes3, "ho:one") == [0, 0, 0]


def worker(flavour: Flavour, lock: Any, name: str, count: int, history: History,
           failures: list[str], hold: float = 0.001) -> Callable[[], Any]:
    """``count`` acquisitions of ``lock`` as one owner, each held ``hold`` seconds."""
    def record(invoked: float, start: float, token: int) -> None:
        end = min(time.monotonic(), start + lock.validity)
        history.held(Hold(name, lock.resource, token, start, end, invoked))

    if flavour.is_async:
        async def loop() -> None:
            for _ in range(count):
                invoked = time.monotonic()
                if not await lock.acquire(timeout=20.0):
                    failures.append(f"{name}: not acquired")
                    return
                start, token = time.monotonic(), lock.token
                await asyncio.sleep(hold)
                record(invoked, start, token)
                await lock.release()
        return loop

    def loop_sync() -> None:
        for _ in range(count):
            invoked = time.monotonic()
            if not lock.acquire(timeout=20.0):
                failures.append(f"{name}: not acquired")
                return
            start, token = time.monotonic(), lock.token
            time.sleep(hold)
            record(invoked, start, token)
            lock.release()
    return loop_sync


async def contend(flavour: Flavour, nodes: RedisNodes, resource: str, *, managers: int,
                  per_manager: int, count: int) -> History:
    """``managers`` managers (processes, as far as the nodes can tell) with
    ``per_manager`` owners each, ``count`` acquisitions per owner."""
    history, failures = History(), []
    jobs = []
    for m in range(managers):
        dlm = flavour.manager(nodes, retry_delay_max=0.25)
        for k in range(per_manager):
            actor = flavour.actor(f"m{m}-{k}", limit=120.0)
            lock = dlm.lock(resource, ttl=5.0)
            jobs.append(actor.call(worker(flavour, lock, actor.name, count, history,
                                          failures)))
    await asyncio.wait_for(asyncio.gather(*jobs), 150)
    assert failures == []
    assert len(history.holds) == managers * per_manager * count
    return history


async def test_contended_hand_offs_cost_about_two_scripts_per_node_and_acquisition(
        flavour: Flavour, nodes3: RedisNodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four managers on one lock: each acquisition costs three scripts per node without
    hand-offs (the attempt that joins the line, the one that gets the lock, the
    release; measured here first, with the waiters recording nothing), about two with
    them."""
    async def scripts_per_acquisition(resource: str) -> tuple[float, int, History]:
        await contend(flavour, nodes3, resource + ":warm", managers=4, per_manager=1,
                      count=2)
        reset_stats(nodes3)
        with capture_events() as events:
            history = await contend(flavour, nodes3, resource, managers=4, per_manager=1,
                                    count=15)
        handed = sum(1 for e in events if e["event"] == "redlock.handed_off")
        return (script_calls(nodes3) / len(history.holds) / len(nodes3), handed, history)

    with monkeypatch.context() as patch:
        patch.setattr(type(MUTEX), "hands_off", False)  # as before: plain wake-ups
        before, handed_before, history = await scripts_per_acquisition("ho:before")
    assert history.violations(exclusive=True) == []
    after, handed, history = await scripts_per_acquisition("ho:after")
    assert history.violations(exclusive=True) == []
    assert handed_before == 0
    assert handed >= len(history.holds) // 2, handed
    assert before > 2.8, before
    assert after < before - 0.5, (before, after)
    print(f"script calls per node and acquisition: {before:.2f} without hand-offs,"
          f" {after:.2f} with ({handed} of {len(history.holds)} handed off)")


@pytest.mark.parametrize("n", [1, 3], ids=lambda n: f"N={n}")
async def test_eight_owners_hold_one_at_a_time_with_rising_tokens(
        flavour: Flavour, n: int, request: pytest.FixtureRequest) -> None:
    nodes: RedisNodes = request.getfixturevalue(f"nodes{n}")
    history = await contend(flavour, nodes, "ho:load", managers=4, per_manager=2, count=8)
    assert history.violations(exclusive=True) == []  # one holder at a time, tokens rise
    tokens = [h.token for h in sorted(history.holds, key=lambda h: h.start)]
    assert tokens == sorted(set(tokens))


async def released_before_a_dead_waiter(
        flavour: Flavour, me: Actor, nodes: RedisNodes, resource: str, *, ttl_ms: int,
        patience_ms: int, route: str = "") -> tuple[list[str | None], float]:
    """A holder (TTL 30 s), a waiter written by hand first in line on every node that
    never asks again (``route``: the route its record names), and a live waiter behind
    it; the holder releases. The lock keys right after the release, and how long after
    it the live waiter acquired (it has released since)."""
    holder = me.on(flavour.manager(nodes).lock(resource, ttl=30.0))
    assert await holder.acquire(blocking=False)
    for node in nodes:
        with node.client() as client:
            assert waiter_by_hand(client, resource, "dead-waiter", 1, ttl_ms=ttl_ms,
                                  patience_ms=patience_ms, route=route)[0] == 0
    live = flavour.actor("live").on(flavour.manager(nodes).lock(resource, ttl=5.0))
    waiter = asyncio.create_task(live.actor.call_all(
        lambda: live.handle.acquire(timeout=20.0), time.monotonic))
    assert await eventually(lambda: records(nodes, resource) == [2, 2, 2], 5.0)
    released_at = time.monotonic()
    await holder.release()
    after_release = values(nodes, resource)
    acquired, acquired_at = await asyncio.wait_for(waiter, 25)
    assert acquired
    await live.release()
    return after_release, acquired_at - released_at


async def test_a_waiter_that_died_in_line_blocks_the_lock_for_its_ttl_only(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """A waiter of an earlier release (its record names no route, so nobody can tell
    whether it listens) joined the line and died: the release hands it the lock (a
    reservation with its TTL, 1 s), which nobody else gets until that expires, like a
    holder that died just after its grant."""
    after_release, waited = await released_before_a_dead_waiter(
        flavour, me, nodes3, "ho:dead", ttl_ms=1000, patience_ms=5000)
    assert after_release == ["handoff:" + waiter_id("dead-waiter")] * 3
    assert 0.8 < waited < 4.0


def routes_listening(nodes: RedisNodes, resource: str) -> list[int]:
    """Per node, how many of the routes in the line's hand-off records have a listener
    (a subscriber of '<channel>:<route>')."""
    found = []
    for node in nodes:
        with node.client() as client:
            routes = [v.decode().split()[3] for v in client.hvals(KEYS.line(resource) + "-ttls")
                      if len(v.split()) > 3]
            found.append(sum(1 for route in routes if client.pubsub_numsub(
                f"{KEYS.channel(resource)}:{route}")[0][1]))
    return found


async def test_a_waiter_nobody_hears_is_not_handed_the_lock(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """A waiter whose record names a route nobody listens on (its manager died, or has
    not subscribed there yet) is not handed the lock (docs/design.md §6.7): a
    reservation would keep everyone out for its TTL (30 s here). The key stays free and
    the waiter first, until its next attempt or until its entry lapses (1 s here); then
    the next waiter gets it."""
    after_release, waited = await released_before_a_dead_waiter(
        flavour, me, nodes3, "ho:unheard", ttl_ms=30_000, patience_ms=1000, route="deadbeef")
    assert after_release == [None] * 3  # free: no reservation
    assert waited < 4.0  # (the reservation would have held 30 s)


async def test_a_waiter_killed_in_line_is_not_handed_the_lock(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """A process killed while it waited in line (as gunicorn kills a worker past its
    timeout): the kernel closed its connections, so the nodes know nobody listens on its
    route, and the release does not hand it the lock, which would have kept everyone
    out for its TTL (30 s). The next caller gets it once the dead entry lapsed (its
    patience, about a second)."""
    holder = me.on(flavour.manager(nodes3).lock("ho:killed", ttl=30.0))
    assert await holder.acquire(blocking=False)
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.workers.line_waiter", "ho:killed", *nodes3.urls],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # In line on every node, with its record, and its manager listening on its route.
        assert await eventually(lambda: routes_listening(nodes3, "ho:killed") == [1] * 3,
                                10.0), worker.stderr.read() if worker.poll() is not None else ""
    finally:
        worker.kill()
        worker.wait(10)
        assert worker.stderr is not None
        worker.stderr.close()
    assert records(nodes3, "ho:killed") == [1, 1, 1]
    # (The nodes see its connections closed as soon as they next look.)
    assert await eventually(lambda: routes_listening(nodes3, "ho:killed") == [0] * 3, 5.0)
    released_at = time.monotonic()
    await holder.release()
    assert values(nodes3, "ho:killed") == [None] * 3  # free: no reservation for the dead
    following = flavour.actor("next").on(flavour.manager(nodes3).lock("ho:killed", ttl=5.0))
    acquired, acquired_at = await following.actor.call_all(
        lambda: following.handle.acquire(timeout=10.0), time.monotonic)
    assert acquired
    assert acquired_at - released_at < 5.0  # (the reservation would have held 30 s)
    await following.release()


async def test_a_waiter_that_gives_up_hands_its_reservation_to_the_next(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    holder = me.on(flavour.manager(nodes3).lock("ho:quit", ttl=30.0))
    assert await holder.acquire(blocking=False)
    for node in nodes3:
        with node.client() as client:
            assert waiter_by_hand(client, "ho:quit", "quitter", 1, ttl_ms=30_000)[0] == 0
    live = flavour.actor("live").on(
        flavour.manager(nodes3, **SLOW_BACKOFF).lock("ho:quit", ttl=5.0))
    with capture_events() as events:
        waiter = asyncio.create_task(live.actor.call_all(
            lambda: live.handle.acquire(timeout=20.0), time.monotonic))
        assert await eventually(lambda: records(nodes3, "ho:quit") == [2, 2, 2], 5.0)
        await holder.release()  # handed to the quitter (first in line)
        assert values(nodes3, "ho:quit") == ["handoff:" + waiter_id("quitter")] * 3
        await heard_everywhere(nodes3, "ho:quit")
        gave_up_at = time.monotonic()
        for node in nodes3:  # its acquire call is over: it leaves, handing off
            with node.client() as client:
                assert leave_by_hand(client, "ho:quit", "quitter") == 1
        acquired, acquired_at = await asyncio.wait_for(waiter, 25)
    assert acquired
    assert acquired_at - gave_up_at < 1.0
    assert any(e["event"] == "redlock.handed_off" for e in events)
    await live.release()


async def test_a_node_that_missed_the_release_makes_the_waiter_ask_the_nodes(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """The holder's release reaches one node only (the others still hold a key for
    1.5 s): one hand-off message, no quorum; the waiter falls back to ACQUIRE, which is
    granted the reservation and, once the other keys are gone, the rest."""
    holder = me.on(flavour.manager(nodes3).lock("ho:miss", ttl=30.0))
    assert await holder.acquire(blocking=False)
    live = flavour.actor("live").on(flavour.manager(nodes3).lock("ho:miss", ttl=5.0))
    with capture_events() as events:
        waiter = asyncio.create_task(live.actor.call_all(
            lambda: live.handle.acquire(timeout=20.0), time.monotonic))
        assert await eventually(lambda: records(nodes3, "ho:miss") == [1, 1, 1], 5.0)
        for node in list(nodes3)[1:]:  # not the holder's key any more: its release misses
            with node.client() as client:
                client.set(KEYS.lock("ho:miss"), "someone-else", px=1500)
        released_at = time.monotonic()
        with pytest.raises(LockLost):  # (its key was replaced on two nodes)
            await holder.release()
        acquired, acquired_at = await asyncio.wait_for(waiter, 25)
    assert acquired
    assert 1.2 < acquired_at - released_at < 5.0
    assert not any(e["event"] == "redlock.handed_off" for e in events)
    assert await live.token() > 0
    await live.release()
    # Ours are gone (the other owner's keys, set above for 1.5 s, may outlive them by ms).
    assert all(value in (None, "someone-else") for value in values(nodes3, "ho:miss"))


async def test_a_waiter_that_records_nothing_gets_a_plain_wake(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """An election's campaign (and any client of an earlier release) leaves no record:
    the release publishes the waiter id alone and sets no reservation."""
    holder = me.on(flavour.manager(nodes3).lock("ho:old", ttl=30.0))
    assert await holder.acquire(blocking=False)
    clients = [node.client() for node in nodes3]
    try:
        subscriber = clients[0].pubsub()
        subscriber.subscribe(KEYS.channel("ho:old"))
        for client in clients:  # ACQUIRE without an attempt number
            [call] = with_epoch(MUTEX.acquire_calls(KEYS, range(1), ("ho:old",), AcquireArgs(
                "old-waiter", 5000, 0, "1", 60_000)), KEYS, 0)
            assert int(run(client, call)[0]) == 0
        assert records(nodes3, "ho:old") == [0, 0, 0]
        await holder.release()
        assert values(nodes3, "ho:old") == [None] * 3
        messages = [data for _, data in published(subscriber)]
        assert messages == [waiter_id("old-waiter")]
        subscriber.close()
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize(("route", "routed"), [("0badf00d", True), ("", False),
                                               ("0badf00", False), ("not-hex!", False)],
                         ids=["route", "none", "seven-digits", "not-hex"])
def test_a_hand_off_is_published_on_the_route_its_waiter_recorded(
        nodes1: RedisNodes, route: str, routed: bool) -> None:
    """A waiter's record names its manager's route: the hand-off message goes on
    '<channel>:<route>' only (docs/design.md §6.7). Without a route, or with one that
    is not 8 hex digits (the script publishes on no channel a caller named freely), it
    goes on the resource's channel, as for a client of an earlier release."""
    resource, channel = f"ho:routed:{route}", KEYS.channel(f"ho:routed:{route}")
    write_markers(nodes1)
    with nodes1[0].client() as client:
        subscriber = client.pubsub()
        subscriber.subscribe(channel, f"{channel}:{route}" if route else f"{channel}:x")
        try:
            [call] = with_epoch(MUTEX.acquire_calls(KEYS, range(1), (resource,), AcquireArgs(
                "holder", 30_000, 0, "", 1000)), KEYS, 0)
            assert int(run(client, call)[0]) == 1
            assert waiter_by_hand(client, resource, "waiter", 1, ttl_ms=5000,
                                  route=route)[0] == 0
            assert int(run(client, MUTEX.release_call(KEYS, 0, resource, ("holder", "1")))) == 1
            assert values(nodes1, resource) == ["handoff:" + waiter_id("waiter")]
            heard = published(subscriber)  # (and nothing more within 0.2 s)
        finally:
            subscriber.close()
    assert len(heard) == 1, heard
    [(where, data)] = heard
    assert where == (f"{channel}:{route}" if routed else channel)
    assert data.split()[0] == waiter_id("waiter") and data.split()[3] == "1"


async def test_a_hand_off_wakes_only_the_waiters_manager(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    """Two managers wait in line for one lock: the release's hand-off messages reach the
    first one's manager only (its route), not the other's listener, which under
    contention would wake for every message of every node (docs/design.md §6.7); then
    the other is handed the lock in turn, by its own route."""
    holder = me.on(flavour.manager(nodes3).lock("ho:only", ttl=30.0))
    assert await holder.acquire(blocking=False)
    first_dlm = flavour.manager(nodes3, **SLOW_BACKOFF)
    second_dlm = flavour.manager(nodes3, **SLOW_BACKOFF)
    assert route_of(first_dlm) != route_of(second_dlm)
    first = flavour.actor("first").on(first_dlm.lock("ho:only", ttl=10.0))
    second = flavour.actor("second").on(second_dlm.lock("ho:only", ttl=10.0))
    first_call = asyncio.create_task(first.actor.call_all(
        lambda: first.handle.acquire(timeout=20.0), time.monotonic))
    assert await eventually(lambda: records(nodes3, "ho:only") == [1, 1, 1], 5.0)
    await heard_everywhere(nodes3, "ho:only")
    second_call = asyncio.create_task(second.actor.call_all(
        lambda: second.handle.acquire(timeout=20.0), time.monotonic))
    assert await eventually(lambda: records(nodes3, "ho:only") == [2, 2, 2], 5.0)

    def routes_subscribed() -> bool:
        for node in nodes3:
            with node.client() as client:
                counts = dict(client.pubsub_numsub(*(
                    f"{KEYS.channel('ho:only')}:{route_of(m)}" for m in (first_dlm,
                                                                         second_dlm))))
                if not all(counts.values()):
                    return False
        return True

    assert await eventually(routes_subscribed, 5.0)
    first_heard, second_heard = hand_offs_heard(first_dlm), hand_offs_heard(second_dlm)
    released_at = time.monotonic()
    await holder.release()
    acquired, acquired_at = await asyncio.wait_for(first_call, 25)
    assert acquired and acquired_at - released_at < 1.0
    # (A quorum's messages complete it: the third may come just after.)
    assert await eventually(lambda: len(first_heard) == 3, 5.0), first_heard
    assert second_heard == [], second_heard  # its listener never woke for them
    await first.release()  # hands off to the second, on its route
    acquired, _ = await asyncio.wait_for(second_call, 25)
    assert acquired
    assert await eventually(lambda: len(second_heard) == 3, 5.0), second_heard
    await second.release()
