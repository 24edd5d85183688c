"""An outage is not a vacancy (docs/design.md §12.1): the family's views (``leader()``,
``status()``) raise QuorumUnavailable when fewer than a quorum of nodes answered, instead
of reporting nobody; ``observe()`` yields nothing through an outage and raises once it
has lasted ``outage_timeout``. Real nodes, hung with SIGSTOP; both clients."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from redlock import AsyncRedlock, Leader, QuorumUnavailable, Redlock
from redlock.errors import Outcome
from redlock.testing import RedisNodes
from tests.peek import paused


def test_a_leader_is_unknown_without_a_quorum_of_answers(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls) as dlm:
        election = dlm.election("jobs", ttl=5.0, identity="a")
        with election.campaign() as term:
            assert dlm.election("jobs").leader() == Leader("a", term.token, pytest.approx(5.0,
                                                                                          abs=0.2))
            with paused(nodes3, [1, 2]), pytest.raises(QuorumUnavailable) as raised:
                dlm.election("jobs").leader()
            assert str(raised.value).startswith(
                "the leadership of 'jobs' is unknown: 1 of 3 nodes answered, need 2;")
            assert [o.outcome for o in raised.value.outcomes] == [Outcome.ERROR] * 2
            assert raised.value.resource == "jobs"
            with paused(nodes3, [2]):  # a quorum answers: the leader, as before
                leader = dlm.election("jobs").leader()
                assert leader is not None and leader.identity == "a"
        assert dlm.election("jobs").leader() is None  # vacant, and said so by all


def test_a_leader_the_answering_quorum_cannot_rule_out_is_unknown(nodes3: RedisNodes) -> None:
    """The leader's key on nodes 0 and 2 only (node 1's is gone, as a grant that did not
    reach it); node 2 hung: nodes 0 and 1 answer, a quorum, but only node 0 names the
    leader, who may hold nodes 0 and 2: unknown, not vacant (before: None)."""
    with Redlock(nodes3.urls) as dlm:
        term = dlm.election("jobs", ttl=10.0, identity="a").campaign()
        assert term.acquire()
        with nodes3[1].client() as client:
            assert client.delete("redlock:{jobs}:leader") == 1
        with paused(nodes3, [2]), pytest.raises(QuorumUnavailable) as raised:
            dlm.election("jobs").leader()
        assert str(raised.value).startswith(
            "the leadership of 'jobs' is unknown: a holder is named by 1 of the nodes that"
            " answered, and with the 1 that did not it may hold a quorum;"), str(raised.value)
        leader = dlm.election("jobs").leader()  # all three answer: the leader, by nodes 0, 2
        assert leader is not None and leader.identity == "a"
        term.release()
        assert dlm.election("jobs").leader() is None


def test_semaphore_and_rwlock_status_are_unknown_without_a_quorum(nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls) as dlm:
        permits, rwlock = dlm.semaphore("pool", permits=2, ttl=5.0), dlm.rwlock("doc", ttl=5.0)
        with permits, rwlock.write():
            assert permits.status().held == 1
            assert rwlock.status().writer is not None
            with paused(nodes3, [0, 1]):
                with pytest.raises(QuorumUnavailable, match="the semaphore of 'pool' is"):
                    permits.status()
                with pytest.raises(QuorumUnavailable, match="the read-write lock of 'doc' is"):
                    rwlock.status()


def test_observe_rides_through_a_short_outage_and_gives_up_after_outage_timeout(
        nodes3: RedisNodes) -> None:
    """The observer reads at least every second (its election's ttl). An outage shorter
    than outage_timeout yields nothing (the vacancy it saw before is not re-reported, nor is
    the outage reported as one); a longer one ends the iteration with QuorumUnavailable
    (before: it reported nothing for ever)."""
    with Redlock(nodes3.urls, outage_timeout=1.5) as dlm:
        seen: list[Leader | BaseException | None] = []

        def watch() -> None:
            try:
                for leader in dlm.election("jobs", ttl=1.0).observe():
                    seen.append(leader)
            except QuorumUnavailable as exc:
                seen.append(exc)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [None]
        with paused(nodes3, [1, 2]):
            time.sleep(1.2)  # at least one read in the outage, shorter than outage_timeout
            assert seen == [None]
        time.sleep(0.2)
        started = time.monotonic()
        with paused(nodes3, [1, 2]):
            watcher.join(timeout=6)
            ended = time.monotonic() - started
        assert not watcher.is_alive()
        assert 1.5 <= ended < 4.5, ended  # the outage_timeout, after at most a wait and a read
        assert len(seen) == 2 and isinstance(seen[1], QuorumUnavailable), seen
        assert "the leadership of 'jobs' is unknown" in str(seen[1])


async def test_asyncio_views_and_observe_in_an_outage(nodes3: RedisNodes) -> None:
    async with AsyncRedlock(nodes3.urls, outage_timeout=0.5) as dlm, \
            dlm.election("jobs", ttl=5.0, identity="a").campaign():
        with paused(nodes3, [0, 2]):
            with pytest.raises(QuorumUnavailable, match="1 of 3 nodes answered"):
                await dlm.election("jobs").leader()
            seen = []
            with pytest.raises(QuorumUnavailable):
                async with asyncio.timeout(5):
                    async for leader in dlm.election("jobs").observe():
                        seen.append(leader)
            assert seen == []
