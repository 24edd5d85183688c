"""Issue 40: a rolling restart of the lock nodes must not stop locking.

The most common way to run lock nodes is Redis without persistence, and the routine
operation on them is a rolling restart: each node in turn stopped and brought back
empty. A node that lost its data stays out of quorums until every lease it may have
granted has expired; that wait used to be ``max_ttl`` (an hour by default), so the second
restart of the roll took the majority out and no lock could be granted for the rest of
it (N=3: 45 s without a lock, 3,499 ``ClusterAmnesiaError``; N=5: 65 s). It is now
bounded by the lease horizons of the node's peers (docs/design.md §4.3.1).

Every scenario runs on the library's default settings (``Redlock(urls)``), under load:
threads lock names (TTL 5 s) and do a read-modify-write of the name's value in a fenced
store under each lock. Checked: no stretch longer than MAX_GAP without a successful
acquire (across all clients), no lost update (the values add up to the accepted
increments), no token backwards (the fenced store's history), no history violation
(redlock/testing/history.py), and each node restarted empty rejoins within REJOIN.

Rerun: ``bash scripts/test tests/faults/test_rolling_restarts.py -s`` (figures printed).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fencing import RedisFencedStore
from redlock import ClusterAmnesiaError, LockLost, LockNotAcquired, Redlock
from redlock.admin import Admin
from redlock.testing import RedisNode, RedisNodes
from tests.faults.load import Workload, recorded, wait_for
from tests.internals import KEYS
from tests.peek import get

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(300)]

TTL = 5.0  # the locks' TTL: the longest lease in use
SPACING = 20.0  # seconds between two restarts of the roll
WARM_UP = 5.0  # seconds of load before the first restart
MAX_GAP = 2.0  # the longest stretch allowed without a successful acquire
REJOIN = 15.0  # a node restarted empty is back within this (TTL 5 s locks in use)
THREADS, NAMES = 4, 8


def healthy(node: RedisNode) -> bool:
    """The node has its marker, stamped by the server run that answers."""
    marker = get(node, KEYS.marker)
    if marker is None:
        return False
    with node.client() as client:
        run = str(client.info("server")["run_id"])
    return f"run_id={run}" in marker.decode()


def roll(nodes: RedisNodes, *, keep_data: bool, spacing: float,
         order: list[int] | None = None) -> Iterator[tuple[int, float]]:
    """Restart each node in turn, the first after WARM_UP of load, then ``spacing``
    seconds apart (restart to restart, whatever the caller does in between); yields
    (node, when)."""
    due = time.monotonic() + WARM_UP
    for index in order if order is not None else range(len(nodes)):
        time.sleep(max(0.0, due - time.monotonic()))
        nodes[index].restart(keep_data=keep_data)
        yield index, time.monotonic()
        due += spacing


def checked(workload: Workload, figures: Any, started: float, ended: float,
            rejoins: list[float]) -> None:
    """Once the clients stopped: the longest stretch without a lock, the lost updates
    and the rejoin times, into the figures and checked."""
    gap = workload.longest_gap(started, ended)
    lost = workload.lost_updates()
    figures.extra.update(
        longest_gap_s=round(gap, 3), lost_updates=lost, increments=workload.increments,
        rejoin_s=[round(r, 2) for r in rejoins], failures=workload.failures,
        cluster_amnesia=workload.failures.get("ClusterAmnesiaError", 0))
    assert lost == 0, (figures.extra, workload.where_lost())
    assert gap <= MAX_GAP, (gap, workload.failures, workload.examples)
    assert all(r <= REJOIN for r in rejoins), rejoins


@pytest.mark.parametrize("n", [3, 5])
def test_a_rolling_restart_without_persistence_keeps_locking(
        n: int, fresh_nodes: Callable[..., RedisNodes], store: RedisFencedStore) -> None:
    """Every node restarted empty in turn, SPACING apart, under load, default settings."""
    nodes = fresh_nodes(n)
    with recorded(f"rolling-restart-N{n}", store) as (figures, run):
        with Workload(nodes.urls, run, store, f"roll{n}", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            started = time.monotonic()
            rejoins = []
            for index, when in roll(nodes, keep_data=False, spacing=SPACING):
                wait_for(lambda i=index: healthy(nodes[i]), REJOIN + 5.0,
                         f"node {index} back")
                rejoins.append(time.monotonic() - when)
            time.sleep(3.0)
            ended = time.monotonic()
        checked(workload, figures, started, ended, rejoins)


def test_a_second_restart_before_the_first_node_is_back(
        fresh_nodes: Callable[..., RedisNodes], store: RedisFencedStore) -> None:
    """N=5: node 0 restarted empty, then node 1 a second later, before node 0 is back.
    Three healthy nodes keep a quorum; node 1's wait is bounded by its healthy peers'
    horizons and node 0's own rejoin time, so both are back within REJOIN."""
    nodes = fresh_nodes(5)
    with recorded("second-restart-before-the-first-is-back", store) as (figures, run):
        with Workload(nodes.urls, run, store, "second", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            started = time.monotonic()
            time.sleep(3.0)
            nodes[0].restart(keep_data=False)
            first = time.monotonic()
            time.sleep(1.0)
            nodes[1].restart(keep_data=False)
            second = time.monotonic()
            assert not healthy(nodes[0]), "node 0 was back within a second: no overlap"
            wait_for(lambda: healthy(nodes[0]), REJOIN + 5.0, "node 0 back")
            rejoins = [time.monotonic() - first]
            wait_for(lambda: healthy(nodes[1]), REJOIN + 5.0, "node 1 back")
            rejoins.append(time.monotonic() - second)
            time.sleep(2.0)
            ended = time.monotonic()
        checked(workload, figures, started, ended, rejoins)


def test_a_rolling_restart_with_appendfsync_everysec(
        fresh_nodes: Callable[..., RedisNodes], store: RedisFencedStore) -> None:
    """AOF with ``appendfsync everysec``: each restart keeps the data but may lose the
    last second, so the node is judged not durable and kept out until its leases have
    expired, like an empty one (docs/design.md §4.4). 10 s apart."""
    nodes = fresh_nodes(3, appendonly=True, appendfsync="everysec")
    with recorded("rolling-restart-everysec", store) as (figures, run):
        with Workload(nodes.urls, run, store, "everysec", threads=THREADS, names=NAMES,
                      ttl=TTL) as workload:
            started = time.monotonic()
            rejoins = []
            for index, when in roll(nodes, keep_data=True, spacing=10.0):
                wait_for(lambda i=index: get(nodes[i], KEYS.marker) is None, 5.0,
                         f"node {index} demoted (not durable)")
                wait_for(lambda i=index: healthy(nodes[i]), REJOIN + 5.0,
                         f"node {index} back")
                rejoins.append(time.monotonic() - when)
            time.sleep(2.0)
            ended = time.monotonic()
        checked(workload, figures, started, ended, rejoins)


def test_the_lock_family_through_a_rolling_restart(
        fresh_nodes: Callable[..., RedisNodes]) -> None:
    """A semaphore (2 permits), a read-write lock and an election, each used by two
    threads while every node is restarted empty, 10 s apart: each kind keeps granting
    (no stretch above MAX_GAP), never more holders than it allows, tokens rising."""
    nodes = fresh_nodes(3)
    stop = threading.Event()
    grants: dict[str, list[float]] = {"semaphore": [], "write": [], "leader": []}
    holding: dict[str, int] = {"semaphore": 0, "write": 0, "leader": 0}
    most: dict[str, int] = {"semaphore": 0, "write": 0, "leader": 0}
    tokens: dict[str, list[int]] = {"write": [], "leader": []}
    errors: list[BaseException] = []
    mutex = threading.Lock()

    def use(kind: str, dlm: Redlock) -> None:
        try:
            while not stop.is_set():
                if kind == "semaphore":
                    handle: Any = dlm.semaphore("roll:sem", permits=2, ttl=TTL)
                elif kind == "write":
                    handle = dlm.rwlock("roll:rw", ttl=TTL).write()
                else:
                    handle = dlm.election("roll:leader", ttl=TTL).campaign()
                try:
                    got = handle.acquire(timeout=1.0)
                except LockNotAcquired:
                    got = False
                if not got:
                    continue
                with mutex:
                    grants[kind].append(time.monotonic())
                    holding[kind] += 1
                    most[kind] = max(most[kind], holding[kind])
                    if kind in tokens:
                        tokens[kind].append(handle.token)
                time.sleep(0.02)
                with mutex:
                    holding[kind] -= 1
                with contextlib.suppress(LockLost):
                    handle.release()
        except BaseException as exc:
            errors.append(exc)

    managers = [Redlock(nodes.urls) for _ in range(6)]
    threads = [threading.Thread(target=use, args=(kind, managers[i * 3 + k]), daemon=True)
               for k, kind in enumerate(grants) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        started = time.monotonic()
        for _ in roll(nodes, keep_data=False, spacing=10.0):
            pass
        time.sleep(6.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        for dlm in managers:
            dlm.close()
    assert not errors, errors
    ended = time.monotonic()
    for kind, times in grants.items():
        points = [started, *sorted(t for t in times if t >= started), ended]
        gap = max(b - a for a, b in itertools.pairwise(points))
        assert gap <= MAX_GAP, (kind, gap)
    assert most == {"semaphore": 2, "write": 1, "leader": 1}, most
    for kind, seen in tokens.items():
        assert seen == sorted(set(seen)), (kind, "tokens not rising")


def test_majority_amnesia_names_the_way_out_and_no_token_goes_backwards(
        fresh_nodes: Callable[..., RedisNodes], store: RedisFencedStore) -> None:
    """Two of three nodes restarted empty at once: no quorum of healthy nodes can
    re-seed their counters, so nothing is granted; the error and ``repair()`` say what
    happened, when it becomes safe and the command (with what it risks). After the
    operator's ``initialise(force=True)`` tokens may restart low: the fenced store
    refuses them, and no accepted write goes backwards."""
    nodes = fresh_nodes(3)
    with recorded("majority-amnesia", store) as (figures, run):
        dlm = Redlock(nodes.urls)
        try:
            tokens = [run.cycle(dlm, "A", "majority") for _ in range(5)]
            assert None not in tokens
            nodes[0].restart(keep_data=False)
            nodes[1].restart(keep_data=False)
            with pytest.raises(ClusterAmnesiaError) as raised:
                dlm.lock("majority", ttl=TTL).acquire(timeout=2.0)
            message = str(raised.value)
            assert "redlock initialise --force" in message and "fenced stores" in message
            reports = Admin(dlm).repair()
            waiting = [r for r in reports if r.status == "waiting"]
            assert waiting, reports
            assert all("no lock can be granted" in r.detail
                       and "redlock initialise --force" in r.detail for r in waiting), reports
            Admin(dlm).initialise(force=True)
            after = run.cycle(dlm, "A", "majority")
            figures.extra.update(tokens_before=tokens, token_after=after,
                                 message=message[:200])
        finally:
            dlm.close()
