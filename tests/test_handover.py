"""Hand-over (docs/design.md §5.6): a held acquisition is exported and adopted by another
manager or process, which extends and releases it; the exporter lets go; the adopter's
validity is its own and never more than the exporter's; a stale hand-over fails
clearly. Real nodes, both clients, and a real second process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from redlock import (
    AsyncRedlock,
    Handover,
    LockLost,
    NotHeld,
    QuorumUnavailable,
    Redlock,
    RedlockError,
)
from redlock.testing import RedisNodes
from tests.peek import delete_lock_keys, lock_values

NODE_TIMEOUT = 0.25  # a healthy node on a busy shared machine must not look dead
WORKER = Path(__file__).parent / "workers" / "handover_worker.py"


def _exported(dlm: Redlock, resource: str, ttl: float) -> Handover:
    """``resource`` acquired on ``dlm`` and exported at once (the handle lets go)."""
    lock = dlm.lock(resource, ttl=ttl)
    assert lock.acquire()
    return lock.export()


@pytest.fixture
def two(nodes3: RedisNodes) -> Iterator[tuple[Redlock, Redlock]]:
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as a, \
            Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as b:
        yield a, b


@pytest.fixture
async def atwo(nodes3: RedisNodes) -> AsyncIterator[tuple[AsyncRedlock, AsyncRedlock]]:
    async with AsyncRedlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as a, \
            AsyncRedlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as b:
        yield a, b


def test_adopted_by_another_manager_which_extends_and_releases(
        two: tuple[Redlock, Redlock], nodes3: RedisNodes) -> None:
    a, b = two
    lock = a.lock("ho:a", ttl=10.0)
    assert lock.acquire()
    # (A quorum granted when acquire() returned; a node whose reply was not awaited may
    # hold no key: the hand-over must leave each node as the acquire left it.)
    token, held_on = lock.token, lock_values(nodes3, "ho:a")
    exported = lock.export()

    # The exporter let go: no token, no extend, and its release sends nothing.
    assert not lock.locked()
    with pytest.raises(NotHeld, match="handed over"):
        _ = lock.token
    with pytest.raises(NotHeld):
        lock.extend()
    lock.release()
    assert lock_values(nodes3, "ho:a") == held_on  # still held, by the hand-over
    assert sum(value is not None for value in held_on) >= 2

    adopted = b.adopt(Handover.from_json(exported.to_json()))
    assert adopted.resource == "ho:a" and adopted.ttl == 10.0
    assert adopted.token == token
    assert 0 < adopted.validity <= exported.validity
    adopted.extend()
    assert adopted.validity > 9.0  # a fresh lease, measured on the adopter's clock
    # Someone else still cannot get in, and gets a larger token once it is free.
    other = a.lock("ho:a", ttl=5.0)
    assert not other.acquire(blocking=False)
    adopted.release()
    assert lock_values(nodes3, "ho:a") == [None, None, None]
    assert other.acquire(blocking=False)
    assert other.token > token
    other.release()


def test_the_exporters_watchdog_stops(two: tuple[Redlock, Redlock],
                                      nodes3: RedisNodes) -> None:
    a, b = two
    lost: list[object] = []
    lock = a.lock("ho:wd", ttl=1.0, auto_extend=True, on_lost=lost.append)
    assert lock.acquire()
    adopted = b.adopt(lock.export())  # adopter without auto-extend
    assert adopted.locked()
    time.sleep(1.6)  # past the TTL: nobody renews it any more
    assert lock_values(nodes3, "ho:wd") == [None, None, None]
    assert not adopted.locked()
    with pytest.raises(LockLost, match="expired"):
        adopted.check()
    assert lost == []  # handing over is not losing


def test_the_adopter_can_auto_extend(two: tuple[Redlock, Redlock]) -> None:
    a, b = two
    lock = a.lock("ho:ae", ttl=1.5)
    assert lock.acquire()
    adopted = b.adopt(lock.export().to_dict(), auto_extend=True)
    time.sleep(2.5)  # longer than the TTL
    adopted.check()
    assert adopted.locked()
    adopted.release()


def test_validity_counts_the_time_in_transit(two: tuple[Redlock, Redlock]) -> None:
    a, b = two
    exported = _exported(a, "ho:age", 10.0)
    time.sleep(0.3)
    adopted = b.adopt(exported)
    # At least the wall-clock age is charged to the adopter: never longer than the
    # exporter's own view of the same instant.
    assert adopted.validity <= exported.validity - 0.3
    adopted.release()


def test_a_stale_hand_over_fails_clearly(two: tuple[Redlock, Redlock],
                                         nodes3: RedisNodes) -> None:
    a, b = two
    # 1. Expired by its own validity: refused without asking the nodes.
    exported = _exported(a, "ho:old", 0.3)
    time.sleep(0.4)
    with pytest.raises(LockLost, match="expired"):
        b.adopt(exported)

    # 2. Validity left on paper, but the key is gone on the nodes (released by hand).
    exported = _exported(a, "ho:gone", 30.0)
    delete_lock_keys(nodes3, "ho:gone")
    with pytest.raises(LockLost, match="only 0 of 3 nodes still hold") as failure:
        b.adopt(exported)
    assert len(failure.value.outcomes) == 3

    # 3. Adopted once and released: adopting the same value again fails too.
    exported = _exported(a, "ho:twice", 30.0)
    b.adopt(exported).release()
    with pytest.raises(LockLost):
        a.adopt(exported)


def test_an_outage_is_not_a_lost_lock(two: tuple[Redlock, Redlock],
                                      nodes3: RedisNodes) -> None:
    a, b = two
    exported = _exported(a, "ho:down", 30.0)
    nodes3[0].stop()
    nodes3[1].stop()
    with pytest.raises(QuorumUnavailable):
        b.adopt(exported)


def test_values_are_checked(two: tuple[Redlock, Redlock], nodes3: RedisNodes) -> None:
    a, _ = two
    exported = _exported(a, "ho:val", 30.0)
    assert exported.owner not in repr(exported)  # the secret stays out of logs
    assert pickle.loads(pickle.dumps(exported)) == exported
    data = exported.to_dict()
    assert json.loads(exported.to_json()) == data
    with Redlock(nodes3.urls, namespace="other") as elsewhere, \
            pytest.raises(ValueError, match="namespace"):
        elsewhere.adopt(exported)
    for broken in ({**data, "owner": "x"}, {**data, "token": "7"}, {**data, "version": 9},
                   {k: v for k, v in data.items() if k != "ttl"}):
        with pytest.raises(ValueError):
            a.adopt(broken)
    with pytest.raises(ValueError, match="not a hand-over"):
        a.adopt("{not json")


def test_a_reentered_lock_cannot_be_exported_halfway(two: tuple[Redlock, Redlock]) -> None:
    a, _ = two
    lock = a.lock("ho:re", ttl=10.0, reentrant=True)
    with lock, lock, pytest.raises(RedlockError, match="re-entered"):
        lock.export()


def test_each_thread_exports_its_own(two: tuple[Redlock, Redlock]) -> None:
    a, b = two
    lock = a.lock("ho:thr", ttl=10.0)
    exported: list[Handover] = []

    def holder() -> None:
        assert lock.acquire()
        exported.append(lock.export())

    thread = threading.Thread(target=holder)
    thread.start()
    thread.join(30)
    with pytest.raises(NotHeld):
        lock.export()  # this thread holds nothing through the handle
    adopted = b.adopt(exported[0])
    adopted.release()


async def test_asyncio_hand_over_across_managers_and_clients(
        atwo: tuple[AsyncRedlock, AsyncRedlock], nodes3: RedisNodes) -> None:
    a, b = atwo
    lock = a.lock("ho:aio", ttl=10.0)
    assert await lock.acquire()
    token = lock.token
    adopted = await b.adopt(lock.export().to_json())
    assert adopted.token == token
    await adopted.extend()
    await lock.release()  # the exporter's: sends nothing
    assert None not in lock_values(nodes3, "ho:aio")
    exported_again = adopted.export()  # and on to a sync manager
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as sync_dlm:
        held = sync_dlm.adopt(exported_again)
        assert held.token == token
        held.release()
    assert lock_values(nodes3, "ho:aio") == [None, None, None]


def _worker(*args: str, stdin: str = "") -> str:
    done = subprocess.run([sys.executable, str(WORKER), *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_acquired_here_adopted_extended_released_in_another_process(
        nodes3: RedisNodes) -> None:
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as dlm:
        lock = dlm.lock("ho:proc", ttl=15.0)
        assert lock.acquire()
        token = lock.token
        result = json.loads(_worker("adopt", *nodes3.urls, stdin=lock.export().to_json()))
        assert result["token"] == token
        assert 0 < result["validity"] <= 15.0
        assert result["extended_validity"] > 14.0
        assert result["released"] is True
        assert lock_values(nodes3, "ho:proc") == [None, None, None]
        lock.release()  # sends nothing: the other process owned and released it
        # A stale value (its lock now released elsewhere) fails clearly over there too.
        stale = Handover.from_dict(_stale_copy(dlm, nodes3))
        result = json.loads(_worker("adopt", *nodes3.urls, stdin=stale.to_json()))
        assert result["error"] == "LockLost"
        assert "expired" in result["message"]


def _stale_copy(dlm: Redlock, nodes3: RedisNodes) -> dict[str, object]:
    """A hand-over whose lock expired: acquired with a short TTL, exported, waited out."""
    lock = dlm.lock("ho:stale", ttl=0.2)
    assert lock.acquire()
    data = lock.export().to_dict()
    time.sleep(0.3)
    assert lock_values(nodes3, "ho:stale") == [None, None, None]
    return data


def test_acquired_in_another_process_finished_here(nodes3: RedisNodes) -> None:
    exported = Handover.from_json(_worker("export", "ho:from-child", "15", *nodes3.urls))
    # The exporting process has exited; its lock lives on in Redis until adopted.
    assert None not in lock_values(nodes3, "ho:from-child")
    with Redlock(nodes3.urls, node_timeout=NODE_TIMEOUT) as dlm:
        held = dlm.adopt(exported)
        assert held.token == exported.token
        held.extend(ttl=20.0)
        held.release()
    assert lock_values(nodes3, "ho:from-child") == [None, None, None]
