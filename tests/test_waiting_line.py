"""The waiting line and release wake-ups across managers (docs/design.md §6).

Each manager here stands for a process of its own (it has its own connections, local
turns and release listener); tests/test_local_turns.py covers waiters of one
manager. Real nodes, both clients.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from redlock import Outcome
from redlock.testing import RedisNodes, capture_events
from tests.clients import Actor, Flavour, eventually
from tests.internals import KEYS, bucket, scripts
from tests.peek import node_address

# A backoff so slow that only a wake-up explains a quick acquisition.
SLOW_BACKOFF = {"retry_delay_min": 2.0, "retry_delay_max": 3.0}


def until_lapsed(nodes: RedisNodes, resource: str) -> float:
    """Seconds until every entry of the resource's line has lapsed on every node, by
    the nodes' own clocks (each entry's deadline, §6.3; 0 if none is left)."""
    left = 0.0
    for node in nodes:
        with node.client() as client:
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            last = client.zrange(KEYS.line_deadlines(resource), -1, -1, withscores=True)
            if last:
                left = max(left, (last[0][1] - now_ms) / 1000)
    return left


def line_sizes(nodes: RedisNodes, resource: str, line: str | None = None) -> list[int]:
    """How many waiters each node has in the resource's line (``line``: another kind's
    line key instead of the lock's)."""
    sizes = []
    for node in nodes:
        with node.client() as client:
            sizes.append(int(client.zcard(line or KEYS.line(resource))))
    return sizes


async def test_a_release_in_another_manager_wakes_the_waiter(
        flavour: Flavour, me: Actor, nodes3: RedisNodes) -> None:
    holder = me.on(flavour.manager(nodes3).lock("line:wake", ttl=30.0))
    assert await holder.acquire(blocking=False)
    waiting = flavour.manager(nodes3, **SLOW_BACKOFF).lock("line:wake", ttl=10.0)
    waiter = asyncio.create_task(flavour.actor("waiter").call_all(
        lambda: waiting.acquire(timeout=20.0), time.monotonic, waiting.release))
    # The waiter was refused and waits: its backoff says 2 s at least, the holder's key
    # 30 s; only the release's message can wake it sooner.
    assert await eventually(lambda: line_sizes(nodes3, "line:wake") == [1, 1, 1], 5.0)
    await asyncio.sleep(0.3)
    released_at = time.monotonic()
    await holder.release()
    acquired, acquired_at, _ = await asyncio.wait_for(waiter, 25)
    assert acquired
    assert acquired_at - released_at < 1.5
    assert line_sizes(nodes3, "line:wake") == [0, 0, 0]


async def test_waiters_of_several_managers_get_the_lock_in_line_order(
        flavour: Flavour, me: Actor, nodes5: RedisNodes) -> None:
    """Five managers queue one after the other behind a holder whose key then expires
    (no release: every waiter's wait ends at the expiry, together); each gets the lock
    in the order it came."""
    holder = me.on(flavour.manager(nodes5).lock("line:order", ttl=3.0))
    assert await holder.acquire(blocking=False)
    order: list[int] = []

    async def wait_in_line(index: int) -> None:
        lock = flavour.actor(f"waiter-{index}").on(
            flavour.manager(nodes5).lock("line:order", ttl=5.0))
        assert await lock.acquire(timeout=20.0)
        order.append(index)
        await asyncio.sleep(0.05)
        await lock.release()

    waiters = []
    for index in range(5):
        waiters.append(asyncio.create_task(wait_in_line(index)))
        assert await eventually(
            lambda count=index + 1: min(line_sizes(nodes5, "line:order")) == count, 5.0)
    await asyncio.wait_for(asyncio.gather(*waiters), 30)
    assert order == [0, 1, 2, 3, 4]
    assert line_sizes(nodes5, "line:order") == [0, 0, 0, 0, 0]


def test_waiters_woken_together_do_not_split_the_nodes(nodes5: RedisNodes) -> None:
    """Five waiters in line try the free lock at once, reaching the nodes in a different
    order on each node: every node grants the first in line, and only it."""
    waiters = [f"waiter-{i}" for i in range(5)]
    clients = [node.client() for node in nodes5]
    try:
        for client in clients:
            client.set(KEYS.marker, "format=1 run_id=unknown test")
            client.set(KEYS.lock("line:split"), "the-holder", px=30_000)
            for ticket, waiter in enumerate(waiters, start=1):
                assert acquire_by_hand(client, "line:split", waiter, ticket)[0] == \
                    scripts.ACQUIRE_REFUSED
            client.delete(KEYS.lock("line:split"))  # released
        granted: dict[str, int] = {}
        for shift, client in enumerate(clients):
            for waiter in waiters[shift:] + waiters[:shift]:
                code = acquire_by_hand(client, "line:split", waiter, 99)[0]
                if code == scripts.ACQUIRE_GRANTED:
                    granted[waiter] = granted.get(waiter, 0) + 1
                else:
                    assert code in (scripts.ACQUIRE_NOT_YOUR_TURN, scripts.ACQUIRE_REFUSED)
        assert granted == {"waiter-0": 5}
    finally:
        for client in clients:
            client.close()


def test_a_failed_attempt_keeps_its_place_where_it_was_granted(nodes5: RedisNodes) -> None:
    """W (first in line) is granted on two nodes and refused on two that still hold the
    previous holder's key: no quorum, it releases what it got and tries again. It must
    still be first on every node; it used to lose its place where it was granted, so X
    (behind it) was first there: each got half of the nodes, attempt after attempt
    (with one of five nodes down: a sale stalled for 20 s in the compose stack)."""
    up = [node.client() for node in list(nodes5)[:4]]  # node 4 is down: never asked
    try:
        for client in up:
            client.set(KEYS.marker, "format=1 run_id=unknown test")
            client.set(KEYS.lock("line:keep"), "the-holder", px=30_000)
            for ticket, waiter in enumerate(["W", "X"], start=1):
                assert acquire_by_hand(client, "line:keep", waiter, ticket)[0] == \
                    scripts.ACQUIRE_REFUSED
        for client in up[:2]:  # the holder's release reached two nodes so far
            client.delete(KEYS.lock("line:keep"))
        assert [acquire_by_hand(c, "line:keep", "W", 1)[0] for c in up] == [
            scripts.ACQUIRE_GRANTED] * 2 + [scripts.ACQUIRE_REFUSED] * 2
        for client in up[:2]:  # W's failed attempt gives back what it got, stays in line
            assert release_by_hand(client, "line:keep", "W", leave=False) == 1
            # for its patience (60 s), not only the 5 s TTL its grant cut the entry to
            seconds, micros = client.time()
            deadline = client.zscore(KEYS.line_deadlines("line:keep"),
                                     hashlib.sha1(b"W").hexdigest())
            assert deadline is not None and deadline > seconds * 1000 + micros / 1000 + 50_000
        for client in up[2:]:
            client.delete(KEYS.lock("line:keep"))
        assert [acquire_by_hand(c, "line:keep", "X", 2)[0] for c in up] == [
            scripts.ACQUIRE_NOT_YOUR_TURN] * 4
        assert [acquire_by_hand(c, "line:keep", "W", 1)[0] for c in up] == [
            scripts.ACQUIRE_GRANTED] * 4
        for client in up:  # W is done: its release leaves the line, X is first
            assert release_by_hand(client, "line:keep", "W", leave=True) == 1
        assert [acquire_by_hand(c, "line:keep", "X", 2)[0] for c in up] == [
            scripts.ACQUIRE_GRANTED] * 4
    finally:
        for client in up:
            client.close()


def test_a_holder_that_died_blocks_the_line_no_longer_than_its_key(
        nodes3: RedisNodes) -> None:
    """The place a granted waiter keeps lapses with its key: a holder that died (or is
    frozen) without releasing must not keep the next in line out for its patience."""
    with nodes3[0].client() as client:
        client.set(KEYS.marker, "format=1 run_id=unknown test")
        client.set(KEYS.lock("line:dead-holder"), "the-holder", px=30_000)
        for ticket, waiter in enumerate(["W", "X"], start=1):
            assert acquire_by_hand(client, "line:dead-holder", waiter, ticket)[0] == \
                scripts.ACQUIRE_REFUSED
        client.delete(KEYS.lock("line:dead-holder"))
        assert acquire_by_hand(client, "line:dead-holder", "W", 1, ttl_ms=200)[0] == \
            scripts.ACQUIRE_GRANTED
        assert acquire_by_hand(client, "line:dead-holder", "X", 2)[0] == \
            scripts.ACQUIRE_REFUSED  # W holds
        time.sleep(0.3)  # W's key expired (its 60 s patience did not)
        assert acquire_by_hand(client, "line:dead-holder", "X", 2)[0] == \
            scripts.ACQUIRE_GRANTED


async def test_a_single_try_does_not_jump_the_line(flavour: Flavour, me: Actor,
                                                   nodes3: RedisNodes) -> None:
    """A waiter whose turn it is (the lock is free, it has not taken it yet) is not
    overtaken by a try from elsewhere; the try says why it failed."""
    holder = me.on(flavour.manager(nodes3).lock("line:try", ttl=30.0))
    assert await holder.acquire(blocking=False)
    # A waiter in another process that is slow to take its turn: it joins the line
    # (held lock, a ticket) with the script itself, then never comes back.
    for node in nodes3:
        with node.client() as client:
            reply = acquire_by_hand(client, "line:try", "a-waiter-elsewhere", ticket=1)
            assert reply[0] == scripts.ACQUIRE_REFUSED  # held: it waits in line
    await holder.release()
    trying = me.on(flavour.manager(nodes3).lock("line:try", ttl=5.0))
    assert not await trying.acquire(blocking=False)
    failure = trying.last_failure
    assert failure is not None and "first in line" in str(failure)


def script_calls(node: Any) -> int:
    """How many scripts a node ran so far (EVAL and EVALSHA), by its commandstats."""
    with node.client() as client:
        stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in ("eval", "evalsha"))


# Per kind: (the holder, the waiter, the holder's key) on a resource name.
BARE_QUORUM_KINDS: dict[str, Callable[[Any, str], tuple[Any, Any, str]]] = {
    "lock": lambda dlm, r: (dlm.lock(r, ttl=30.0), dlm.lock(r, ttl=5.0), KEYS.lock(r)),
    "permit": lambda dlm, r: (dlm.semaphore(r, permits=1, ttl=30.0),
                              dlm.semaphore(r, permits=1, ttl=5.0), KEYS.part(r, "permit:0")),
    "read": lambda dlm, r: (dlm.rwlock(r).write(ttl=30.0), dlm.rwlock(r).read(ttl=5.0),
                            KEYS.part(r, "write")),
    "write": lambda dlm, r: (dlm.rwlock(r).write(ttl=30.0), dlm.rwlock(r).write(ttl=5.0),
                             KEYS.part(r, "write")),
}


async def bare_quorum(flavour: Flavour, me: Actor, nodes: RedisNodes, kind: str,
                      resource: str) -> tuple[Any, Any]:
    """A holder of ``resource`` on two of the three nodes (its key deleted from the
    third), as ``me``; and the waiter's handle (not acquired yet)."""
    holding, waiting, key = BARE_QUORUM_KINDS[kind](flavour.manager(nodes), resource)
    holder = me.on(holding)
    assert await holder.acquire(blocking=False)
    with nodes[2].client() as client:
        assert client.delete(key) == 1
    return holder, waiting


@pytest.mark.parametrize("kind", sorted(BARE_QUORUM_KINDS))
async def test_a_waiter_does_not_spin_behind_a_holder_of_a_bare_quorum(
        flavour: Flavour, me: Actor, nodes3: RedisNodes, kind: str) -> None:
    """The holder has two of three nodes (its key is gone from the third: a node its
    acquire did not count). The waiter is granted there and refused by the others, on
    every attempt, and gives that grant back. The give-back's release message named
    nobody (the waiter is not in that node's line: it was granted) or the waiter: heard
    as a release, it woke the waiter itself at once. An attempt every half millisecond,
    each raising that node's fence counter (a fresh cluster's first token was ~100)."""
    holder, waiting = await bare_quorum(flavour, me, nodes3, kind, f"line:bare:{kind}")
    before = script_calls(nodes3[2])
    waiter = me.on(waiting)
    assert not await waiter.acquire(timeout=1.5)
    # The waiter's own backoff: a few attempts in 1.5 s (it keeps its place in line
    # with one every half second at the most: 11-12 scripts, an ACQUIRE and a give-back
    # each; its exponential backoff without a release feed stays below 60), not
    # thousands (4000-8000 before).
    calls = script_calls(nodes3[2]) - before
    assert 2 <= calls <= 60, f"{calls} scripts on the free node in 1.5 s"
    await holder.release()


# Each kind's line, and a single try that the waiter in it is ahead of.
LINES: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "lock": ("line", lambda dlm, r: dlm.lock(r, ttl=5.0)),
    "permit": ("permit-line", lambda dlm, r: dlm.semaphore(r, permits=1, ttl=5.0)),
    "read": ("rw-line", lambda dlm, r: dlm.rwlock(r).write()),  # no reader in line lets it pass
    "write": ("rw-line", lambda dlm, r: dlm.rwlock(r).write()),
}


@pytest.mark.parametrize("kind", sorted(LINES))
async def test_a_failed_attempt_gives_the_waiter_its_place_back(
        flavour: Flavour, me: Actor, nodes3: RedisNodes, kind: str) -> None:
    """Behind a holder of a bare quorum, the waiter is granted on the third node at every
    attempt and refused by the others. A permit's or a reader's grant takes its entry out
    of that node's line (docs/design.md §12.2); a lock's or a writer's grant on an empty
    line never puts it in (§6.3). Its give-back puts the entry there: the nodes' lines
    agree, and a later single try is not served first on that node. Without it the
    waiter stood in line on two nodes of three; after a one-node stall, waits on a
    semaphore stretched to a second and more."""
    resource = f"line:back:{kind}"
    holder, waiting = await bare_quorum(flavour, me, nodes3, kind, resource)
    waiter = flavour.actor("waiter").on(waiting)
    pending = asyncio.ensure_future(waiter.acquire(timeout=5.0))
    part, single_try = LINES[kind]
    line = KEYS.part(resource, part)
    # (Between two of its attempts; during one, the free node holds its grant instead.)
    assert await eventually(lambda: line_sizes(nodes3, resource, line) == [1, 1, 1],
                            3.0), line_sizes(nodes3, resource, line)
    later = flavour.actor("later").on(single_try(flavour.manager(nodes3), resource))
    for _ in range(5):  # until the free node's answer was awaited (design §2.4)
        assert not await later.acquire(blocking=False)
        failure = later.last_failure
        assert failure is not None
        [free] = [r for r in failure.outcomes if r.node == node_address(nodes3[2])]
        if free.outcome is not Outcome.NOT_AWAITED:
            break
    assert free.outcome is Outcome.REFUSED, free
    await holder.release()
    assert await asyncio.wait_for(pending, 5.0)
    await waiter.release()


async def test_a_waiter_that_gives_up_leaves_the_line(flavour: Flavour, me: Actor,
                                                      nodes3: RedisNodes) -> None:
    holder = me.on(flavour.manager(nodes3).lock("line:leave", ttl=30.0))
    assert await holder.acquire(blocking=False)
    waiting = me.on(flavour.manager(nodes3).lock("line:leave", ttl=5.0))
    assert not await waiting.acquire(timeout=0.4)
    assert line_sizes(nodes3, "line:leave") == [0, 0, 0]
    await holder.release()
    # Nobody in line: the next try gets the lock at once.
    assert await me.cycle(flavour.manager(nodes3).lock("line:leave", timeout=0)) >= 2


async def _killed_in_line(nodes: RedisNodes, script: str) -> None:
    """Run ``script`` (a waiter of 'line:dead') in a process, and SIGKILL it (no goodbye)
    once it stands in the line on every node."""
    waiter = subprocess.Popen([sys.executable, "-c", script, *nodes.urls])
    try:
        assert await eventually(lambda: line_sizes(nodes, "line:dead") == [1, 1, 1], 15.0)
    finally:
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait(10)


async def test_a_dead_waiter_blocks_the_line_only_briefly(
        flavour: Flavour, me: Actor, nodes3: RedisNodes, tmp_path: object) -> None:
    """A waiter killed while in line (SIGKILL: no goodbye) holds its place only until
    its entries lapse (patience: about a second with the default settings). A release
    within that time hands it the lock (docs/design.md §6.7): its reservation then
    blocks the lock for the dead waiter's TTL (5 s here), as a holder that died right
    after its grant would; a release after its entries lapsed does not."""
    holder = me.on(flavour.manager(nodes3).lock("line:dead", ttl=30.0))
    assert await holder.acquire(blocking=False)
    script = ("import sys; from redlock import Redlock\n"
              "Redlock(sys.argv[1:]).lock('line:dead', ttl=5.0).acquire(timeout=60)\n")
    await _killed_in_line(nodes3, script)
    await holder.release()
    started = time.monotonic()
    lock = me.on(flavour.manager(nodes3).lock("line:dead", ttl=5.0))
    assert await lock.acquire(timeout=10.0)
    waited = time.monotonic() - started
    assert waited < 7.0  # the dead waiter's TTL at most, not the 60 s it asked for
    await lock.release()
    # Again, the release after the dead waiter's entries lapsed: no hand-off to it.
    assert await holder.acquire(blocking=False)
    await _killed_in_line(nodes3, script)
    assert await eventually(lambda: line_sizes(nodes3, "line:dead") == [1, 1, 1], 1.0)
    # Its entries lapse (the patience: about a second, longer when the measured round
    # trips are, on a busy machine).
    await asyncio.sleep(until_lapsed(nodes3, "line:dead") + 0.05)
    await holder.release()
    started = time.monotonic()
    assert await lock.acquire(timeout=10.0)
    assert time.monotonic() - started < 1.0
    await lock.release()


async def test_waiters_still_get_the_lock_where_subscribing_is_refused(
        flavour: Flavour, me: Actor, fresh_nodes: Callable[..., RedisNodes]) -> None:
    """A lock user without channel permissions (ACL resetchannels) cannot hear releases:
    it is warned once per node, and its waiters fall back to polling."""
    nodes = fresh_nodes(3)
    for node in nodes:
        with node.client() as client:
            client.execute_command("ACL", "SETUSER", "carol", "on", ">pw", "~*",
                                   "resetchannels", "+@all")
    urls = [f"redis://carol:pw@{node.host}:{node.port}" for node in nodes]
    holder = me.on(flavour.manager(urls).lock("line:acl", ttl=30.0))
    assert await holder.acquire(blocking=False)
    with capture_events() as events:
        waiting = flavour.manager(urls, retry_delay_max=0.1).lock("line:acl", ttl=5.0)
        waiter = asyncio.create_task(flavour.actor("waiter").call_all(
            lambda: waiting.acquire(timeout=20.0), waiting.release))
        assert await eventually(
            lambda: len({e["node"] for e in events
                         if e["event"] == "redlock.release_feed_refused"}) == 3, 10.0)
        await holder.release()
        acquired, _ = await asyncio.wait_for(waiter, 25)
    assert acquired


# Run in a process of its own where hiredis cannot be imported (redis-py then parses
# in pure Python): one manager holds, another waits with SLOW_BACKOFF; prints how long
# the waiter took after the release.
_WITHOUT_HIREDIS = """
import asyncio, sys, threading, time
sys.modules["hiredis"] = None  # as if it were not installed
import redis.utils
assert not redis.utils.HIREDIS_AVAILABLE
from redlock import AsyncRedlock, Redlock

kind, urls = sys.argv[1], sys.argv[2:]
options = {"retry_delay_min": 2.0, "retry_delay_max": 3.0}

def sync():
    with Redlock(urls) as a, Redlock(urls, **options) as b:
        holder = a.lock("line:plain", ttl=30.0)
        assert holder.acquire(blocking=False)
        waiting, took = b.lock("line:plain", ttl=10.0), []
        def wait():
            assert waiting.acquire(timeout=20.0)
            took.append(time.monotonic())
            waiting.release()
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)  # refused, in line, listening
        released = time.monotonic()
        holder.release()
        thread.join(25)
        print(took[0] - released)

async def asyncio_():
    async with AsyncRedlock(urls) as a, AsyncRedlock(urls, **options) as b:
        holder = a.lock("line:plain", ttl=30.0)
        assert await holder.acquire(blocking=False)
        waiting = b.lock("line:plain", ttl=10.0)
        async def wait():
            assert await waiting.acquire(timeout=20.0)
            took = time.monotonic()
            await waiting.release()
            return took
        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0.5)
        released = time.monotonic()
        await holder.release()
        print(await asyncio.wait_for(waiter, 25) - released)

sync() if kind == "sync" else asyncio.run(asyncio_())
"""


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_releases_are_heard_without_hiredis(kind: str, nodes3: RedisNodes) -> None:
    """Without hiredis, a subscription connection built from a pool with redis-py's
    maintenance notifications on raised in its constructor: the listener died (a
    traceback on stderr) and waiters in other managers only polled."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_HIREDIS, kind, *nodes3.urls],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert float(done.stdout) < 1.5  # woken by the release, not its 2 s backoff


def acquire_by_hand(client: redis.Redis, resource: str, owner: str,
                    ticket: int, *, patience_ms: int = 60_000, ttl_ms: int = 5000
                    ) -> list[int]:
    """One node's ACQUIRE as a blocking acquire sends it (with a ticket)."""
    keys = (KEYS.lock(resource), KEYS.counter, KEYS.marker, KEYS.line(resource),
            KEYS.line_deadlines(resource),
            KEYS.horizon, KEYS.members)  # the horizon, the membership record and epoch 0
    # last (docs/design.md §4.3.1, §13.1)
    return [int(v) for v in client.eval(scripts.ACQUIRE.source, len(keys), *keys, owner,
                                        ttl_ms, 0, ticket, patience_ms, bucket(resource), 0)]


def release_by_hand(client: redis.Redis, resource: str, owner: str, *, leave: bool,
                    patience_ms: int = 60_000) -> int:
    """One node's RELEASE (``leave``: the acquire call is over, out of the line; else a
    failed attempt's, which keeps its place for ``patience_ms``)."""
    keys = (KEYS.lock(resource), KEYS.channel(resource), KEYS.line(resource),
            KEYS.line_deadlines(resource))
    args = (owner, "1") if leave else (owner, "0", patience_ms)
    return int(client.eval(scripts.RELEASE.source, len(keys), *keys, *args))
