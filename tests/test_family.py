"""The lock family (docs/design.md §12) on real nodes, each behaviour once for both
clients: a counting semaphore, a read-write lock, a leader election; their input
errors; and the four kinds of one name not interfering."""

from __future__ import annotations

import asyncio
import json

import pytest

from redlock import Leader, LockLost, LockNotAcquired, QuorumUnavailable, Redlock
from redlock.testing import RedisNodes
from tests.clients import Actor, Flavour, eventually, resolve
from tests.test_cli import run_in_process

# -- counting semaphore ----------------------------------------------------------------


async def test_a_semaphore_grants_k_permits_on_distinct_slots(flavour: Flavour,
                                                             nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    actors = [flavour.actor(f"holder-{i}") for i in range(4)]
    sems = [actor.on(dlm.semaphore("jobs", permits=3, ttl=5.0)) for actor in actors]
    assert [await s.acquire(blocking=False) for s in sems[:3]] == [True, True, True]
    slots = {await s.actor.call(lambda s=s: s.handle.slot) for s in sems[:3]}
    assert slots == {0, 1, 2}
    assert await sems[3].acquire(blocking=False) is False  # the fourth waits its turn
    status = await resolve(dlm.semaphore("jobs", permits=3).status())
    assert status.held == 3
    freed = await sems[1].actor.call(lambda: sems[1].handle.slot)
    old_token = await sems[1].token()
    await sems[1].release()
    assert await sems[3].acquire(blocking=False) is True
    assert await sems[3].actor.call(lambda: sems[3].handle.slot) == freed
    assert await sems[3].token() > old_token  # the slot's tokens increase
    assert await sems[3].actor.call(lambda: sems[3].handle.slot_name) == f"jobs:permit:{freed}"
    for s in (sems[0], sems[2], sems[3]):
        await s.release()


async def test_a_blocking_semaphore_waiter_gets_the_permit_given_back(
        flavour: Flavour, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    holder, waiter = flavour.actor("holder"), flavour.actor("waiter")
    held = holder.on(dlm.semaphore("one", permits=1, ttl=5.0))
    waiting = waiter.on(dlm.semaphore("one", permits=1, ttl=5.0))
    assert await held.acquire()
    pending = asyncio.ensure_future(waiting.acquire(timeout=5.0))
    await asyncio.sleep(0.3)
    assert not pending.done()
    await held.release()
    assert await asyncio.wait_for(pending, 5.0) is True
    await waiting.release()


async def test_a_client_with_fewer_permits_is_told(flavour: Flavour,
                                                   nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    holders = [flavour.actor(f"h{i}").on(dlm.semaphore("mixed", permits=3)) for i in range(3)]
    for h in holders:
        assert await h.acquire(blocking=False)
    fewer = flavour.actor("fewer").on(dlm.semaphore("mixed", permits=2))
    with pytest.raises(QuorumUnavailable, match="configured with more permits"):
        await fewer.acquire(blocking=False)
    for h in holders:
        await h.release()


async def test_a_lapsed_permit_comes_back_and_its_holder_learns_it(
        flavour: Flavour, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    first = flavour.actor("first").on(dlm.semaphore("lease", permits=1, ttl=0.3))
    second = flavour.actor("second").on(dlm.semaphore("lease", permits=1, ttl=5.0))
    assert await first.acquire()
    assert await second.acquire(timeout=3.0)  # the lease ran out: the permit came back
    with pytest.raises(LockLost):
        await first.check()
    with pytest.raises(LockLost):
        await first.release()
    await second.release()


# -- read-write lock ----------------------------------------------------------------------


async def test_readers_share_and_a_writer_excludes(flavour: Flavour,
                                                   nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    rw = dlm.rwlock("doc", ttl=5.0)
    writer = flavour.actor("writer").on(rw.write())
    assert await writer.acquire(blocking=False)
    write_token = await writer.token()
    reader = flavour.actor("reader").on(rw.read())
    assert await reader.acquire(blocking=False) is False
    await writer.release()
    r1, r2 = reader, flavour.actor("reader-2").on(rw.read())
    assert await r1.acquire(blocking=False) and await r2.acquire(blocking=False)
    # A read's token is the last write token it saw.
    assert await r1.token() == write_token == await r2.token()
    status = await resolve(rw.status())
    assert status.writer is None and len(status.readers) == 2
    assert await writer.acquire(blocking=False) is False
    await r1.release()
    await r2.release()
    assert await writer.acquire(blocking=False)
    assert await writer.token() > write_token
    await writer.release()


async def test_a_waiting_writer_blocks_new_readers(flavour: Flavour,
                                                   nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    rw = dlm.rwlock("queue", ttl=5.0)
    early = flavour.actor("early").on(rw.read())
    assert await early.acquire()
    writer = flavour.actor("writer").on(rw.write())
    pending = asyncio.ensure_future(writer.acquire(timeout=5.0))
    await asyncio.sleep(0.3)  # the writer has joined the line
    late = flavour.actor("late").on(rw.read())
    assert await late.acquire(blocking=False) is False  # not past the waiting writer
    await early.release()
    assert await asyncio.wait_for(pending, 5.0) is True
    await writer.release()
    assert await late.acquire(blocking=False)
    await late.release()


# -- leader election ----------------------------------------------------------------------


async def test_an_election_has_one_leader_per_term(flavour: Flavour,
                                                   nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    a = dlm.election("cron", ttl=2.0, identity="a")
    b = dlm.election("cron", ttl=2.0, identity="b")
    assert await resolve(a.leader()) is None
    actor_a, actor_b = flavour.actor("a"), flavour.actor("b")
    async with actor_a.holding(a.campaign(timeout=3.0)) as lead_a:
        term_a = await lead_a.token()
        seen = await resolve(b.leader())
        assert isinstance(seen, Leader) and seen.identity == "a" and seen.token == term_a
        assert 0 < seen.time_left <= 2.0
        # b waits in line while a leads.
        with pytest.raises(LockNotAcquired):
            async with actor_b.holding(b.campaign(timeout=0.3)):
                pass
    async with actor_b.holding(b.campaign(timeout=3.0)) as lead_b:
        assert await lead_b.token() > term_a
        seen = await resolve(a.leader())
        assert seen is not None and seen.identity == "b"


async def test_observe_follows_the_leadership(flavour: Flavour, nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    election = dlm.election("watched", ttl=5.0, identity="x")
    changes: list[Leader | None] = []

    async def follow() -> None:
        if flavour.is_async:
            async for change in election.observe():
                changes.append(change)
        else:
            iterator = election.observe()

            def step() -> Leader | None:
                return next(iterator)
            observer = flavour.actor("observer")
            while True:
                changes.append(await observer.call(step))

    watching = asyncio.ensure_future(follow())
    try:
        assert await eventually(lambda: len(changes) == 1, 5.0)
        assert changes[0] is None
        leader = flavour.actor("leader")
        async with leader.holding(election.campaign(timeout=3.0)) as lead:
            term = await lead.token()
            # Woken by the proclamation, long before a 5 s poll would come round.
            assert await eventually(lambda: len(changes) == 2, 2.0)
            assert changes[1] is not None and changes[1].token == term
        assert await eventually(lambda: len(changes) == 3, 2.0)  # resigned: vacant
        assert changes[2] is None
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


# -- all kinds --------------------------------------------------------------------------


async def test_the_kinds_of_one_name_do_not_interfere(flavour: Flavour,
                                                      nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    me = flavour.actor("me")
    handles = [dlm.lock("x"), dlm.semaphore("x", permits=1), dlm.rwlock("x").write(),
               dlm.election("x", identity="me").campaign(timeout=1.0)]
    for handle in handles:
        assert await me.call(handle.acquire, False if handle is not handles[3] else None)
    for handle in reversed(handles):
        await me.call(handle.release)


@pytest.mark.parametrize("permits, error", [(0, ValueError), (-1, ValueError),
                                            (1025, ValueError), ("3", TypeError),
                                            (True, TypeError), (2.0, TypeError)])
async def test_bad_permits_are_refused_at_the_call(flavour: Flavour, nodes3: RedisNodes,
                                                   permits: object, error: type) -> None:
    dlm = flavour.manager(nodes3)
    with pytest.raises(error, match="permits"):
        dlm.semaphore("s", permits=permits)


async def test_bad_names_identities_and_ttls_are_refused(flavour: Flavour,
                                                         nodes3: RedisNodes) -> None:
    dlm = flavour.manager(nodes3)
    for make in (lambda: dlm.semaphore(""), lambda: dlm.rwlock(""),
                 lambda: dlm.election(""), lambda: dlm.rwlock("d").read(ttl=0),
                 lambda: dlm.election("e", identity=""), lambda: dlm.election("e", ttl=-1)):
        with pytest.raises(ValueError):
            make()
    with pytest.raises(TypeError):
        dlm.election("e", identity=7)
    with pytest.raises(TypeError):
        dlm.semaphore(3)


async def test_family_handles_are_not_exportable_or_reentrant(flavour: Flavour,
                                                              nodes3: RedisNodes,
                                                              me: Actor) -> None:
    dlm = flavour.manager(nodes3)
    sem = dlm.semaphore("s", permits=2)
    assert not hasattr(sem, "export")
    with pytest.raises(TypeError):
        dlm.semaphore("s", permits=2, reentrant=True)


# -- the CLI: redlock status --kind ------------------------------------------------------


def test_status_shows_the_leader_the_permits_and_the_readers(
        nodes3: RedisNodes, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = ("--nodes", *nodes3.urls)
    with Redlock(nodes3.urls) as dlm:
        code, out, _ = run_in_process(capsys, "status", *nodes, "--kind", "election", "cron")
        assert code == 0 and "'cron' has no leader" in out
        with dlm.election("cron", identity="host-a").campaign() as lead, \
                dlm.semaphore("jobs", permits=3) as permit, dlm.rwlock("doc").write():
            code, out, _ = run_in_process(capsys, "status", *nodes, "--kind", "election",
                                          "cron")
            assert code == 0 and f"led by 'host-a', term {lead.token}" in out
            code, out, _ = run_in_process(capsys, "status", *nodes, "--kind", "semaphore",
                                          "--permits", "3", "jobs", "--json")
            slots = json.loads(out)["slots"]
            assert code == 0 and [s is not None for s in slots].count(True) == 1
            assert slots[permit.slot] is not None
            code, out, _ = run_in_process(capsys, "status", *nodes, "--kind", "rwlock", "doc")
            assert code == 0 and "'doc': writer " in out and "0 reader(s)" in out


async def test_deadlines_hold_for_every_kind(flavour: Flavour, nodes3: RedisNodes) -> None:
    """The caller's timeout bounds a blocking acquire of each kind (§2.5, §12.4)."""
    dlm = flavour.manager(nodes3)
    holder, waiter = flavour.actor("holder"), flavour.actor("waiter")
    pairs = [(dlm.semaphore("d:s", permits=1, ttl=5.0), dlm.semaphore("d:s", permits=1)),
             (dlm.rwlock("d:rw", ttl=5.0).write(), dlm.rwlock("d:rw").read()),
             (dlm.rwlock("d:rw2", ttl=5.0).read(), dlm.rwlock("d:rw2").write())]
    for held, wanted in pairs:
        assert await holder.call(held.acquire)
        started = asyncio.get_running_loop().time()
        assert await waiter.call(wanted.acquire, True, 0.4) is False
        assert asyncio.get_running_loop().time() - started < 0.4 + 0.5
        await holder.call(held.release)
    election = dlm.election("d:e", ttl=5.0)
    async with holder.holding(election.campaign()):
        started = asyncio.get_running_loop().time()
        with pytest.raises(LockNotAcquired):
            async with waiter.holding(dlm.election("d:e").campaign(timeout=0.4)):
                pass
        assert asyncio.get_running_loop().time() - started < 0.4 + 0.5
