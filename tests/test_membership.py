"""Changing the nodes online (docs/design.md §13) on real nodes: a stale client is
refused and follows the joint configuration, a node added by the change serves at once,
a removed node is refused, the change is idempotent and resumable, and bad input gets
typed errors. The fault test (both configurations contending during a change) is
tests/faults/test_membership.py."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable

import pytest
import redis

from redlock import AsyncRedlock, LockNotAcquired, MembershipError, Redlock
from redlock.admin import Admin, AsyncAdmin, Members
from redlock.testing import RedisNodes, capture_events
from tests.internals import KEYS, membership_rule, node_scripts

FAST = {"max_ttl": 1.0, "node_timeout": 0.3, "outage_timeout": None}


def write_record(nodes: RedisNodes, which: list[int], record: Members) -> None:
    for i in which:
        with nodes[i].client() as client:
            assert client.eval(node_scripts.WRITE_MEMBERS.source, 1, KEYS.members,
                               *record.fields()) == [1]


def epoch_of(dlm: Redlock) -> int:
    return membership_rule(dlm).epoch


def test_grow_three_to_five_new_nodes_serve_at_once(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls[:3], **FAST) as old, Redlock(nodes.urls, **FAST) as dlm:
        admin = Admin(dlm)
        with old.lock("grow", ttl=1.0) as held:
            before = held.token
        assert admin.members() == Members(0, dlm.nodes)
        with capture_events() as events:  # the nodes named as the manager was given them
            change = admin.change_members(nodes.urls, current=nodes.urls[:3])
        assert change.epoch == 2 and change.members == dlm.nodes
        assert change.previous == dlm.nodes[:3]
        assert change.seeded == dlm.nodes[3:] and change.unreached == ()
        assert 0.9 < change.waited <= 1.1
        assert [e["event"] for e in events if e["event"].startswith("redlock.members_")] == [
            "redlock.members_change_started", "redlock.members_joint",
            "redlock.members_seeded", "redlock.members_waiting", "redlock.members_seeded",
            "redlock.members_changed"]
        assert admin.members() == Members(2, dlm.nodes)
        # The new nodes serve at once: with two of the old nodes hung, C, D, E grant.
        nodes[0].pause()
        nodes[1].pause()
        try:
            with Redlock(nodes.urls, **FAST) as new, new.lock("grow", ttl=1.0) as held:
                assert held.token > before
            # The old client (A, B, C) learns the 5 members and needs all it knows.
            with pytest.raises(LockNotAcquired), old.lock("grow", ttl=1.0, timeout=0.5):
                pass
            assert epoch_of(old) == 2
        finally:
            nodes[0].resume()
            nodes[1].resume()
        with old.lock("grow", ttl=1.0) as held:
            assert held.token > before


def test_a_stale_client_is_refused_and_follows_the_joint_configuration(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls[:3], **FAST) as old, Redlock(nodes.urls, **FAST) as dlm:
        with old.lock("stale", ttl=1.0):
            pass
        joint = Members(1, dlm.nodes[:3], dlm.nodes)
        write_record(nodes, [0], joint)  # A alone knows: B and C would be the old quorum
        with capture_events() as events, old.lock("stale", ttl=1.0) as held:
            assert held.token > 0
        assert epoch_of(old) == 1
        [adopted] = [e for e in events if e["event"] == "redlock.members_adopted"]
        assert adopted["epoch"] == 1 and adopted["joining"] == list(dlm.nodes)
        # Under the joint rule a client of A, B, C needs 3 of the new 5: all it knows.
        nodes[2].pause()
        try:
            with pytest.raises(LockNotAcquired, match="of the new 5 nodes"), old.lock(
                    "stale", ttl=1.0, timeout=0.3):
                pass
        finally:
            nodes[2].resume()


def test_shrink_five_to_three_a_removed_node_is_refused(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls, **FAST) as dlm:
        with dlm.lock("shrink", ttl=1.0) as held:
            before = held.token
        change = Admin(dlm).change_members(dlm.nodes[:3])
        assert change.members == dlm.nodes[:3] and change.seeded == ()
        assert change.retired == dlm.nodes[3:]
        with Redlock(nodes.urls, **FAST) as everyone:
            lock = everyone.lock("shrink", ttl=1.0)
            assert lock.acquire(blocking=False) or lock.acquire(blocking=False)
            assert lock.token > before
            lock.release()
            # D and E no longer count: with C hung, A and B alone are a quorum of 3...
            nodes[2].pause()
            try:
                assert lock.acquire(timeout=1.0)
                lock.release()
                nodes[1].pause()  # ...and A alone is not, whatever D and E say
                with pytest.raises(LockNotAcquired) as failure:
                    lock.acquire(timeout=0.3)
                assert "removed from the cluster" in str(failure.value)
            finally:
                nodes[1].resume()
                nodes[2].resume()
        with Redlock(nodes.urls[3:], **FAST) as removed, pytest.raises(
                MembershipError, match="cannot form a quorum"):
            removed.lock("shrink", ttl=1.0).acquire(timeout=0.5)


def test_the_change_is_resumable_and_idempotent(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls, **FAST) as dlm:
        admin = Admin(dlm)
        with Redlock(nodes.urls[:3], **FAST) as old, old.lock("resume", ttl=1.0):
            pass
        # A change that stopped after its joint record (on a majority of both sets).
        write_record(nodes, [0, 1, 3], Members(1, dlm.nodes[:3], dlm.nodes))
        with pytest.raises(MembershipError, match="another change is in progress"):
            admin.change_members(dlm.nodes[:4])
        change = admin.change_members(dlm.nodes)
        assert change.epoch == 2 and change.seeded == dlm.nodes[3:]
        again = admin.change_members(dlm.nodes)  # done already: nothing changes
        assert again.epoch == 2 and again.members == dlm.nodes
        with Redlock(nodes.urls, **FAST) as new, new.lock("resume", ttl=1.0) as held:
            assert held.token >= 1


def test_bad_input_is_refused_before_anything_is_written(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(4)
    with Redlock(nodes.urls[:3], **FAST) as old, old.lock("bad", ttl=1.0):
        pass
    with Redlock(nodes.urls, **FAST) as dlm:
        admin = Admin(dlm)
        with pytest.raises(ValueError, match="empty"):
            admin.change_members([])
        with pytest.raises(ValueError, match="twice"):
            admin.change_members([dlm.nodes[0], dlm.nodes[0]])
        with pytest.raises(ValueError, match="not one of this manager's nodes"):
            admin.change_members([*dlm.nodes, "elsewhere:6379"])
        with pytest.raises(MembershipError, match="nothing to change"):
            admin.change_members(dlm.nodes[:3])
        nodes[3].stop()
        with pytest.raises(MembershipError, match="did not answer"):
            admin.change_members(dlm.nodes, current=dlm.nodes[:3])
        assert admin.members() == Members(0, dlm.nodes)


def test_nodes_are_named_the_way_the_manager_was_given_them(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    """URLs, clients, the addresses ``dlm.nodes`` shows, or another spelling of the same
    server: ``change_members`` maps each to the manager's node, and refuses, naming it,
    only what is none of them (issue 41: ``Redlock(urls).change_members(urls)``)."""
    nodes = fresh_nodes(4)
    with Redlock(nodes.urls[:3], **FAST) as old, old.lock("names", ttl=1.0):
        pass
    clients = [redis.Redis.from_url(url) for url in nodes.urls]
    given = [nodes.urls[0], clients[1], nodes.urls[2], clients[3]]  # as a manager may be
    try:
        with Redlock(given, **FAST) as dlm:
            admin = Admin(dlm)
            with pytest.raises(ValueError) as refused:
                admin.change_members([*given, "redis://:secret@10.255.255.1:6379"])
            assert str(refused.value).startswith(
                "new names 'redis://:***@10.255.255.1:6379', which is not one of this"
                f" manager's nodes ({', '.join(dlm.nodes)})")
            with pytest.raises(ValueError, match=r"current names redis\.Redis\(localhost:1\)"):
                admin.change_members(given, current=[redis.Redis(port=1)])
            with pytest.raises(ValueError, match=f"new names node {dlm.nodes[0]} twice"):
                admin.change_members([nodes.urls[0], dlm.nodes[0]])
            with pytest.raises(TypeError, match="collection of nodes"):
                admin.change_members(nodes.urls[0])
            assert admin.members() == Members(0, dlm.nodes)  # nothing was written
            localhost = nodes.urls[1].replace("127.0.0.1", "localhost")
            change = admin.change_members(
                [nodes.urls[0], localhost, clients[2], dlm.nodes[3]],
                current=[clients[0], dlm.nodes[1], nodes.urls[2]])
            assert change.members == dlm.nodes and change.previous == dlm.nodes[:3]
            assert change.seeded == dlm.nodes[3:]
    finally:
        for client in clients:
            client.close()


def test_asyncio_change(fresh_nodes: Callable[..., RedisNodes]) -> None:
    nodes = fresh_nodes(4)

    async def main() -> None:
        async with AsyncRedlock(nodes.urls[:3], **FAST) as old, old.lock("aio", ttl=1.0):
            pass
        async with AsyncRedlock(nodes.urls, **FAST) as dlm:
            admin = AsyncAdmin(dlm)
            change = await admin.change_members(nodes.urls[1:])
            assert change.epoch == 2 and change.seeded == dlm.nodes[3:]
            assert await admin.members() == Members(2, dlm.nodes[1:])
            async with dlm.lock("aio", ttl=1.0) as held:
                assert held.token > 1

    asyncio.run(main())


def test_cli_members_shows_and_changes(fresh_nodes: Callable[..., RedisNodes],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from redlock.cli.commands import main

    nodes = fresh_nodes(4)
    with Redlock(nodes.urls[:3], **FAST) as old, old.lock("cli", ttl=1.0):
        pass
    assert main(["members", "--nodes", *nodes.urls, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epoch"] == 0
    assert main(["members", "--nodes", *nodes.urls, "--change", nodes.urls[0]]) == 4
    assert "without confirmation" in capsys.readouterr().err  # (stdin is no terminal)
    assert main(["members", "--nodes", *nodes.urls, "--change", *nodes.urls[1:],
                 "--wait", "1", "--yes", "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert changed["epoch"] == 2 and changed["retired"] == [changed["previous"][0]]
    assert changed["seeded"] == [changed["members"][-1]]
    assert main(["members", "--nodes", *nodes.urls, "--change", "redis://elsewhere:1",
                 "--yes"]) == 2
    assert main(["members", "--nodes", *nodes.urls]) == 0
    assert capsys.readouterr().out.startswith("epoch 2 [")


def test_a_lock_renewed_across_the_change_stays_held(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    """Its renewals are refused once for the old epoch, then counted under the joint and
    the new configuration: its key is on all of A, B, C, a majority of both sets."""
    nodes = fresh_nodes(5)
    with Redlock(nodes.urls[:3], **FAST) as old, Redlock(nodes.urls, **FAST) as dlm, \
            old.lock("renewed", ttl=1.0, auto_extend=True) as held:
        token = held.token
        with capture_events() as events:
            Admin(dlm).change_members(dlm.nodes, current=dlm.nodes[:3])
            time.sleep(0.5)  # a renewal or two under the new configuration
        assert held.token == token  # check(): not lost
        assert epoch_of(old) == 2
        assert "redlock.extend_retry" not in [e["event"] for e in events]


def test_views_count_holders_by_the_joint_rule(fresh_nodes: Callable[..., RedisNodes]) -> None:
    """``leader()`` and ``status()`` believe a holder only as the quorum rule does: during
    a change from A, B, C to A..E, a grant on A, D, E (3 of the new 5, 1 of the old 3) is
    nobody's; on A, B, D, E (a majority of both) it is the holder's."""

    nodes = fresh_nodes(5)
    owner = "0123456789abcdef0123456789abcdef"  # another client's lock value
    holder = hashlib.sha1(owner.encode()).hexdigest()[:12]

    def grant_on(which: list[int]) -> None:
        for i in which:
            with nodes[i].client() as client:
                client.set("redlock:{views}:leader", owner, px=10_000)
                client.set("redlock:{views}:term", f"7 {holder} elsewhere")
                client.set("redlock:{views:sem}:permit:0", owner, px=10_000)

    with Redlock(nodes.urls, **FAST) as dlm:
        with dlm.lock("views:warm-up", ttl=1.0):  # the nodes get their markers
            pass
        write_record(nodes, list(range(5)), Members(1, dlm.nodes[:3], dlm.nodes))
        with dlm.lock("views:warm-up", ttl=1.0):  # refused for epoch 0: adopts the record
            pass
        assert membership_rule(dlm).joint
        election = dlm.election("views", ttl=1.0)
        semaphore = dlm.semaphore("views:sem", permits=2, ttl=1.0)

        grant_on([0, 3, 4])
        assert election.leader() is None
        assert semaphore.status().held == 0
        grant_on([1])
        leader = election.leader()
        assert leader is not None and (leader.identity, leader.token) == ("elsewhere", 7)
        assert semaphore.status().slots[0] is not None
        assert semaphore.status().held == 1
