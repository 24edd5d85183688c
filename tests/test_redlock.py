"""Behaviour of the synchronous client ``redlock.Redlock`` against real redis-server nodes.

No mocks: every test talks to real ``redis-server`` processes started by the harness
(``tests/conftest.py``), pauses them with SIGSTOP, restarts them empty, or points the
client at ports where nothing listens. Timing assertions are deliberately loose (the
suite shares two cores with other work); what is asserted exactly is the outcome:
exact counters, strictly increasing tokens, keys present or gone on each node, the
exception type and its per-node outcomes.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from redlock import (
    ClusterAmnesiaError,
    Lock,
    LockLost,
    LockNotAcquired,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    Redlock,
    RedlockError,
)
from redlock._rules import Keys
from redlock.testing import RedisNode, RedisNodes, capture_events
from redlock.testing.redis_nodes import free_port

KEYS = Keys("redlock")
# A healthy node on a busy shared machine must not look dead: larger than the default
# 50 ms. Tests about time bounds pass their own node_timeout.
NODE_TIMEOUT = 0.25
WORKER = Path(__file__).parent / "workers" / "counter_worker.py"

MakeRedlock = Callable[..., Redlock]


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture(params=[1, 3, 5], ids=lambda n: f"N={n}")
def cluster(request: pytest.FixtureRequest) -> RedisNodes:
    """The session's 1-, 3- or 5-node cluster, reset (running, empty) for this test."""
    nodes: RedisNodes = request.getfixturevalue(f"nodes{request.param}")
    return nodes


@pytest.fixture
def make_dlm() -> Iterator[MakeRedlock]:
    """Redlock instances closed after the test."""
    made: list[Redlock] = []

    def make(nodes: RedisNodes | Sequence[str | redis.Redis], **options: object) -> Redlock:
        options.setdefault("node_timeout", NODE_TIMEOUT)
        options.setdefault("retry_delay_max", 0.05)
        given = nodes.urls if isinstance(nodes, RedisNodes) else list(nodes)
        dlm = Redlock(given, **options)  # type: ignore[arg-type]
        made.append(dlm)
        return dlm

    yield make
    for dlm in made:
        dlm.close()


def get(node: RedisNode, key: str) -> bytes | None:
    with node.client() as client:
        value = client.get(key)
    assert value is None or isinstance(value, bytes)
    return value


def fence_counters(nodes: Sequence[RedisNode], resource: str) -> list[int]:
    return [int(get(node, KEYS.fence(resource)) or 0) for node in nodes]


def set_fence_counters(nodes: Sequence[RedisNode], resource: str, values: Sequence[int]) -> None:
    for node, value in zip(nodes, values, strict=True):
        with node.client() as client:
            client.set(KEYS.fence(resource), value)


def lock_key_on(nodes: Sequence[RedisNode], resource: str) -> list[bool]:
    """Which nodes hold a lock key for ``resource`` (any owner)."""
    return [get(node, KEYS.lock(resource)) is not None for node in nodes]


def delete_on(nodes: Sequence[RedisNode], key: str) -> None:
    for node in nodes:
        with node.client() as client:
            client.delete(key)


def resume_and_settle(nodes: Sequence[RedisNode], resource: str | None = None) -> None:
    """SIGCONT, then one round trip per node so the commands queued while it was stopped
    (an acquire script whose reply timed out, a release) have run; optionally drop a
    stray lock key such a late acquire left behind."""
    for node in nodes:
        node.resume()
        with node.client() as client:
            client.ping()
            if resource is not None:
                client.delete(KEYS.lock(resource))


def strictly_increasing(values: Sequence[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def outcomes_by_node(error: LockNotAcquired | LockLost | ClusterAmnesiaError,
                     nodes: Sequence[RedisNode]) -> list[Outcome]:
    by_address = {result.node: result.outcome for result in error.outcomes}
    return [by_address[f"{node.host}:{node.port}"] for node in nodes]


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# ---------------------------------------------------------------------------
# Mutual exclusion
# ---------------------------------------------------------------------------


def test_threads_mutual_exclusion_exact_counter_and_increasing_tokens(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    threads, rounds = 8, 10
    dlm = make_dlm(cluster)
    shared = dlm.lock("mx:threads", ttl=10.0, timeout=30.0)  # one handle shared by 4 threads
    counter = 0
    holds: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []
    record = threading.Lock()

    def worker(index: int) -> None:
        nonlocal counter
        handle = shared if index % 2 == 0 else dlm.lock("mx:threads", ttl=10.0, timeout=30.0)
        try:
            for _ in range(rounds):
                with handle as held:
                    entered = time.monotonic()
                    token = held.token
                    value = counter  # deliberately racy read-sleep-write
                    time.sleep(0.002)
                    counter = value + 1
                    left = time.monotonic()
                with record:
                    holds.append((entered, left, token))
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=90)
    assert not errors, errors
    assert counter == threads * rounds
    holds.sort()
    tokens = [token for _, _, token in holds]
    assert strictly_increasing(tokens), tokens
    for (_, left, _), (entered, _, _) in itertools.pairwise(holds):
        assert left <= entered, "two holders overlapped"
    # Every lock key is gone once everybody released.
    assert lock_key_on(cluster, "mx:threads") == [False] * len(cluster)


def test_processes_mutual_exclusion_exact_counter(cluster: RedisNodes) -> None:
    processes, rounds = 3, 20
    counter_node = cluster[0]
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), counter_node.url, str(rounds),
                          *cluster.urls],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    outputs = []
    try:
        for proc in workers:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            outputs.append([int(line) for line in out.split()])
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert int(get(counter_node, "mx:count") or 0) == processes * rounds
    every = [token for tokens in outputs for token in tokens]
    assert len(every) == processes * rounds
    assert len(set(every)) == len(every), "two holders got the same token"
    for tokens in outputs:  # each process saw its own tokens strictly increase
        assert strictly_increasing(tokens), tokens


# A holder that reports when it held the lock: CLOCK_MONOTONIC is system-wide on Linux,
# so hold intervals of different processes can be ordered.
TIMED_WORKER = """
import sys, time, redis
from redlock import Redlock
counter_url, processes, rounds, *urls = sys.argv[1:]
counter = redis.Redis.from_url(counter_url)
with Redlock(urls, node_timeout=0.25, retry_delay_max=0.05) as dlm:
    counter.incr("mx:ready")  # start together, so that the processes really contend
    while int(counter.get("mx:ready")) < int(processes):
        time.sleep(0.005)
    for _ in range(int(rounds)):
        with dlm.lock("mx:timed", ttl=10.0, timeout=60.0) as held:
            entered = time.monotonic()
            token = held.token
            value = int(counter.get("mx:timed-count") or 0)
            time.sleep(0.003)
            counter.set("mx:timed-count", value + 1)
            left = time.monotonic()
        print(entered, left, token, flush=True)
        time.sleep(0.01)  # give the others a chance: waiters poll, they are not woken
"""


@pytest.mark.parametrize("nodes_fixture", ["nodes3", "nodes5"])
def test_processes_tokens_increase_in_hold_order(
    request: pytest.FixtureRequest, nodes_fixture: str,
) -> None:
    nodes: RedisNodes = request.getfixturevalue(nodes_fixture)
    processes, rounds = 3, 8
    workers = [
        subprocess.Popen([sys.executable, "-c", TIMED_WORKER, nodes[0].url, str(processes),
                          str(rounds), *nodes.urls],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    holds: list[tuple[float, float, int, int]] = []
    try:
        for proc in workers:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            for line in out.splitlines():
                entered, left, token = line.split()
                holds.append((float(entered), float(left), int(token), proc.pid))
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(holds) == processes * rounds
    assert int(get(nodes[0], "mx:timed-count") or 0) == processes * rounds
    holds.sort()
    assert strictly_increasing([token for _, _, token, _ in holds])
    for (_, left, _, _), (entered, _, _, _) in itertools.pairwise(holds):
        assert left <= entered, "holders in two processes overlapped"
    # The lock really changed hands between processes (not three runs one after another).
    handovers = sum(1 for a, b in itertools.pairwise(holds) if a[3] != b[3])
    print(f"\n{handovers} handovers between processes in {len(holds)} holds")
    assert handovers >= processes


@pytest.mark.parametrize("nodes_fixture", ["nodes3", "nodes5"])
def test_threads_mutual_exclusion_with_a_hung_node(
    request: pytest.FixtureRequest, make_dlm: MakeRedlock, nodes_fixture: str,
) -> None:
    """Every acquire and release round also waits out a SIGSTOPped node (and reconnects
    to it): the failure path runs concurrently in every thread."""
    nodes: RedisNodes = request.getfixturevalue(nodes_fixture)
    dlm = make_dlm(nodes, node_timeout=0.05)
    with dlm.lock("mx:hung", timeout=5.0):
        pass
    nodes[1].pause()
    threads, rounds = 4, 5
    counter = 0
    holds: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []
    record = threading.Lock()

    def worker() -> None:
        nonlocal counter
        handle = dlm.lock("mx:hung", ttl=10.0, timeout=45.0)
        try:
            for _ in range(rounds):
                with handle as held:
                    entered, token = time.monotonic(), held.token
                    value = counter
                    time.sleep(0.002)
                    counter = value + 1
                    left = time.monotonic()
                with record:
                    holds.append((entered, left, token))
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=90)
    assert not errors, errors
    assert counter == threads * rounds
    holds.sort()
    assert strictly_increasing([token for _, _, token in holds])
    for (_, left, _), (entered, _, _) in itertools.pairwise(holds):
        assert left <= entered, "two holders overlapped"


# ---------------------------------------------------------------------------
# Quorum under node failures (SIGSTOP)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("paused", [[0], [4], [0, 1], [2, 4]], ids=str)
def test_acquire_succeeds_with_a_minority_of_five_paused(
    nodes5: RedisNodes, make_dlm: MakeRedlock, paused: list[int],
) -> None:
    dlm = make_dlm(nodes5)
    with dlm.lock("q:minority", timeout=5.0) as held:  # initialises the cluster
        before = held.token
    for i in paused:
        nodes5[i].pause()
    lock = dlm.lock("q:minority", ttl=10.0)
    assert lock.acquire(blocking=False)
    assert lock.token > before
    assert lock.validity > 8.0
    running = [node for i, node in enumerate(nodes5) if i not in paused]
    assert lock_key_on(running, "q:minority") == [True] * len(running)
    lock.release()
    assert lock_key_on(running, "q:minority") == [False] * len(running)


def test_acquire_fails_fast_with_three_of_five_paused(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    dlm = make_dlm(nodes5, node_timeout=0.05)  # the default node timeout
    with dlm.lock("q:majority", timeout=5.0):
        pass
    paused = [0, 2, 3]
    for i in paused:
        nodes5[i].pause()
    lock = dlm.lock("q:majority", ttl=10.0)
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable) as caught:
        lock.acquire(blocking=False)
    elapsed = time.monotonic() - started
    print(f"\nnon-blocking acquire with 3 of 5 paused failed after {elapsed:.3f} s")
    assert elapsed < 2.0
    error = caught.value
    assert isinstance(error, LockNotAcquired) and isinstance(error, RedlockError)
    assert error.resource == "q:majority"
    assert outcomes_by_node(error, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]
    message = str(error)
    assert "2 of 5 nodes granted, need 3" in message
    assert "error" in message and "Timeout" in message
    assert lock.last_failure is error
    # The failed attempt released what it took on the running nodes.
    assert lock_key_on([nodes5[1], nodes5[4]], "q:majority") == [False, False]

    # The context manager with a deadline: retries until it, then raises.
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable) as caught, dlm.lock("q:majority", timeout=1.0):
        pytest.fail("entered without a quorum")
    elapsed = time.monotonic() - started
    print(f"with-block (timeout=1.0) with 3 of 5 paused failed after {elapsed:.3f} s")
    assert 0.9 <= elapsed < 4.0
    assert "after" in str(caught.value) and "need 3" in str(caught.value)


def test_paused_nodes_cost_one_node_timeout_not_one_each(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    """Parallel means parallel, connection set-up included: with 3 nodes hung, one
    non-blocking attempt (acquire round + release round) costs about 2 node timeouts,
    not 2 per hung node."""
    node_timeout = 0.6
    dlm = make_dlm(nodes5, node_timeout=node_timeout)
    with dlm.lock("q:parallel", timeout=5.0):
        pass
    for i in (0, 1, 2):
        nodes5[i].pause()
    lock = dlm.lock("q:parallel", ttl=10.0)
    durations = []
    for _ in range(2):  # the second attempt has to reconnect to the hung nodes
        started = time.monotonic()
        with pytest.raises(QuorumUnavailable):
            lock.acquire(blocking=False)
        durations.append(time.monotonic() - started)
    print(f"\nattempts with 3 of 5 hung, node_timeout={node_timeout}: "
          + ", ".join(f"{d:.2f} s" for d in durations))
    for duration in durations:
        assert duration < 4 * node_timeout  # parallel: ~2; one at a time: 4-6


def test_extend_with_a_minority_hung_succeeds_with_a_majority_hung_raises(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    dlm = make_dlm(nodes5, node_timeout=0.1)
    lock = dlm.lock("q:extend", ttl=10.0)
    assert lock.acquire(timeout=5.0)
    nodes5[0].pause()
    nodes5[3].pause()
    lock.extend(20.0)
    assert lock.validity > 19.0
    nodes5[4].pause()
    started = time.monotonic()
    with pytest.raises(LockLost) as caught:
        lock.extend()
    assert time.monotonic() - started < 2.0
    assert outcomes_by_node(caught.value, nodes5) == [
        Outcome.ERROR, Outcome.GRANTED, Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR]
    assert lock.lost
    with pytest.raises(LockLost):
        lock.check()
    lock.release()


# ---------------------------------------------------------------------------
# Fencing tokens
# ---------------------------------------------------------------------------


def test_tokens_strictly_increase_over_1000_acquisitions(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    dlm = make_dlm(cluster)
    lock = dlm.lock("tokens:1000", ttl=5.0)
    tokens = []
    started = time.monotonic()
    for _ in range(1000):
        assert lock.acquire(timeout=5.0)
        tokens.append(lock.token)
        lock.release()
    elapsed = time.monotonic() - started
    print(f"\n1000 acquire/release on N={len(cluster)}: {elapsed:.2f} s"
          f" ({elapsed:.3f} ms per pair)")
    assert strictly_increasing(tokens)
    assert len(set(tokens)) == 1000
    # A majority of nodes remembers a counter at least as high as the last token.
    counters = fence_counters(cluster, "tokens:1000")
    assert sum(1 for c in counters if c >= tokens[-1]) >= dlm.quorum
    assert lock_key_on(cluster, "tokens:1000") == [False] * len(cluster)


def test_diverged_counters_all_nodes_up_token_is_max_and_written_back(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "fence:diverged"
    with make_dlm(nodes5).lock(resource, timeout=5.0):
        pass  # initialises the cluster (markers)
    set_fence_counters(nodes5, resource, [10, 5, 5, 5, 5])
    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:
        assert held.token == 11
    # The write-back raised the four lower counters to the token.
    assert fence_counters(nodes5, resource) == [11] * 5


def test_counters_agreeing_on_a_quorum_need_no_write_back(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    """The second round runs only when fewer than a quorum returned the token."""
    resource = "fence:agreeing"
    with make_dlm(nodes5).lock(resource, timeout=5.0):
        pass
    set_fence_counters(nodes5, resource, [10, 10, 10, 5, 5])
    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:
        assert held.token == 11
    assert fence_counters(nodes5, resource) == [11, 11, 11, 6, 6]


def test_token_stops_below_2_pow_53(nodes3: RedisNodes, make_dlm: MakeRedlock) -> None:
    resource = "fence:limit"
    dlm = make_dlm(nodes3)
    with dlm.lock(resource, timeout=5.0):
        pass
    set_fence_counters(nodes3, resource, [2**53 - 2] * 3)
    with dlm.lock(resource, timeout=5.0) as held:
        assert held.token == 2**53 - 1  # still exact on the nodes (Lua numbers)
    lock = dlm.lock(resource)
    assert not lock.acquire(blocking=False)
    assert lock.last_failure is not None
    assert "fence counter reached" in str(lock.last_failure)
    assert lock_key_on(nodes3, resource) == [False] * 3


def test_tokens_increase_across_different_majorities_after_divergence(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    """DESIGN.md §3: counters 10,5,5,5,5; A wins {0,1,2} and gets 11; B later wins
    {2,3,4}. Without the quorum write-back B would get 7. Each holder uses its own
    Redlock instance so no client-side token floor can hide a backwards token."""
    resource = "fence:majorities"
    with make_dlm(nodes5).lock(resource, timeout=5.0):
        pass
    set_fence_counters(nodes5, resource, [10, 5, 5, 5, 5])
    seen = []

    for i in (3, 4):
        nodes5[i].pause()
    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:
        seen.append(held.token)
    assert seen[0] == 11
    assert fence_counters(nodes5[:3], resource) == [11, 11, 11]
    resume_and_settle(nodes5[3:], resource)

    for i in (0, 1):
        nodes5[i].pause()
    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:
        seen.append(held.token)
    resume_and_settle(nodes5[:2], resource)

    for i in (0, 4):  # yet another majority: {1, 2, 3}
        nodes5[i].pause()
    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:
        seen.append(held.token)
    resume_and_settle([nodes5[0], nodes5[4]], resource)

    with make_dlm(nodes5).lock(resource, timeout=5.0) as held:  # everyone back
        seen.append(held.token)
    assert strictly_increasing(seen), seen


def test_minority_amnesia_is_excluded_then_repaired_and_tokens_keep_increasing(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    """Token t is committed on {0, 1, 2} only (3 and 4 lag far behind), then 0 and 1
    come back empty. They must stay out until one max_ttl has passed, then be re-seeded
    from a healthy majority (which includes node 2), so that the majority {0, 1, 3}
    still hands out a token above t. Without the re-seed it would hand out ~5."""
    fenced, busy = "amnesia:fenced", "amnesia:busy"
    max_ttl = 1.0
    dlm = make_dlm(nodes5, max_ttl=max_ttl)
    with dlm.lock(busy, ttl=max_ttl, timeout=5.0) as held:
        busy_seen = [held.token]  # also initialises the cluster
    set_fence_counters(nodes5, fenced, [10, 10, 10, 3, 3])
    for i in (3, 4):
        nodes5[i].pause()
    with make_dlm(nodes5).lock(fenced, ttl=max_ttl, timeout=5.0) as held:
        committed = held.token
    resume_and_settle(nodes5[3:], fenced)
    assert committed == 11
    assert max(fence_counters(nodes5[3:], fenced)) < 10

    amnesiac = [nodes5[0], nodes5[1]]
    for node in amnesiac:
        node.restart(keep_data=False)
        assert get(node, KEYS.marker) is None

    # Detected and excluded: locks are granted by the three healthy nodes only.
    lock = dlm.lock(busy, ttl=max_ttl)
    assert lock.acquire(timeout=5.0)
    busy_seen.append(lock.token)
    assert lock_key_on(nodes5, busy) == [False, False, True, True, True]
    lock.release()
    reports = {r.node: r for r in dlm.repair()}
    for node in amnesiac:
        report = reports[f"{node.host}:{node.port}"]
        assert report.status == "waiting", report
    assert [get(node, KEYS.marker) for node in amnesiac] == [None, None]

    # After one max_ttl the next acquire (of any resource) re-seeds every fence counter
    # of the namespace on them and gives their markers back.
    time.sleep(max_ttl + 0.1)
    with dlm.lock(busy, ttl=max_ttl, timeout=5.0) as held:
        busy_seen.append(held.token)
    assert all(get(node, KEYS.marker) is not None for node in amnesiac)
    assert fence_counters(amnesiac, fenced) == [committed, committed]
    assert strictly_increasing(busy_seen), busy_seen

    # The majority {0, 1, 3}: two repaired nodes and a lagging one. A fresh client (no
    # floor of its own) must still get a token above the committed one.
    for i in (2, 4):
        nodes5[i].pause()
    with make_dlm(nodes5, max_ttl=max_ttl).lock(fenced, ttl=max_ttl, timeout=5.0) as held:
        after = held.token
    resume_and_settle([nodes5[2], nodes5[4]], fenced)
    assert after > committed


def test_explicit_repair_force_reseeds_an_empty_node(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "amnesia:repair"
    dlm = make_dlm(nodes3)
    seen = []
    for _ in range(3):
        with dlm.lock(resource, timeout=5.0) as held:
            seen.append(held.token)
    nodes3[2].restart(keep_data=False)
    statuses = [report.status for report in dlm.repair()]
    assert statuses == ["healthy", "healthy", "waiting"]
    statuses = [report.status for report in dlm.repair(force=True)]
    assert statuses == ["healthy", "healthy", "repaired"]
    assert get(nodes3[2], KEYS.marker) is not None
    assert fence_counters(nodes3, resource)[2] == seen[-1]
    nodes3[0].pause()  # majority {1, 2} includes the repaired node
    with make_dlm(nodes3).lock(resource, timeout=5.0) as held:
        assert held.token > seen[-1]
    resume_and_settle([nodes3[0]])


def test_a_node_restarted_empty_cannot_grant_a_held_lock(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    """The restarted node forgot the holder's key; it must not help anyone else win."""
    resource = "amnesia:held"
    holder = make_dlm(nodes3).lock(resource, ttl=10.0)
    assert holder.acquire(timeout=5.0)
    nodes3[2].restart(keep_data=False)
    other = make_dlm(nodes3).lock(resource, ttl=10.0)
    assert not other.acquire(blocking=False)
    assert other.last_failure is not None
    assert [r.outcome for r in other.last_failure.outcomes] == [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.AMNESIAC]
    assert get(nodes3[2], KEYS.lock(resource)) is None
    holder.extend()  # two of three still hold the holder's key
    token = holder.token
    holder.release()
    assert other.acquire(timeout=5.0)
    assert other.token > token
    other.release()


def test_durable_nodes_restarted_with_their_data_are_not_amnesiac(
    fresh_nodes: Callable[..., RedisNodes], make_dlm: MakeRedlock,
) -> None:
    nodes = fresh_nodes(3, appendonly=True)
    dlm = make_dlm(nodes)
    seen = []
    with dlm.lock("aof:x", timeout=5.0) as held:
        seen.append(held.token)
    for node in nodes:  # kill -9 each one in turn; appendfsync always kept everything
        node.restart(keep_data=True)
        assert get(node, KEYS.marker) is not None
        with dlm.lock("aof:x", timeout=5.0) as held:
            seen.append(held.token)
    assert strictly_increasing(seen)
    assert all(report.status == "healthy" for report in dlm.repair())


def test_majority_amnesia_raises_cluster_amnesia_error(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "amnesia:majority"
    dlm = make_dlm(cluster)
    with dlm.lock(resource, timeout=5.0):
        pass
    lost = list(cluster)[: dlm.quorum]
    for node in lost:
        node.restart(keep_data=False)

    clients = [dlm] if len(cluster) == 1 else [dlm, make_dlm(cluster)]  # N=1: see below
    for client in clients:
        with pytest.raises(ClusterAmnesiaError) as caught:
            client.lock(resource).acquire(timeout=5.0)
        error = caught.value
        assert isinstance(error, RedlockError)
        assert "lost their node marker" in str(error)
        amnesiac = [r for r in error.outcomes if r.outcome is Outcome.AMNESIAC]
        assert len(amnesiac) == len(lost)
    # Nothing was silently reset: no markers written, no lock left anywhere.
    assert [get(node, KEYS.marker) for node in lost] == [None] * len(lost)
    assert lock_key_on(cluster, resource) == [False] * len(cluster)
    # (N=1: a brand-new client cannot tell a wiped single node from a new cluster;
    # only a client that saw the marker before can refuse.)


# ---------------------------------------------------------------------------
# Expiry, extend, auto-extend
# ---------------------------------------------------------------------------


def test_expiry_frees_the_lock_for_another_client(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "ttl:expiry"
    first = make_dlm(cluster).lock(resource, ttl=0.5)
    assert first.acquire(blocking=False)
    first_token = first.token
    dlm = make_dlm(cluster)
    second = dlm.lock(resource, ttl=10.0)
    assert not second.acquire(blocking=False)
    assert second.acquire(timeout=5.0)  # after the first holder's keys expired
    assert second.token > first_token
    assert not first.locked() and first.validity == 0.0
    with pytest.raises(LockLost):
        first.check()
    with pytest.raises(LockLost):
        _ = first.token
    with pytest.raises(LockLost):
        first.extend()
    # The second holder has its key on at least a quorum (a node where the first key
    # outlived the others may have refused it). The expired holder's release must not
    # delete any of them.
    before = [get(node, KEYS.lock(resource)) for node in cluster]
    assert sum(1 for value in before if value is not None) >= dlm.quorum
    first.release()
    assert [get(node, KEYS.lock(resource)) for node in cluster] == before
    second.extend()
    second.release()
    assert lock_key_on(cluster, resource) == [False] * len(cluster)


def test_extend_renews_on_every_node(cluster: RedisNodes, make_dlm: MakeRedlock) -> None:
    resource = "ttl:extend"
    dlm = make_dlm(cluster)
    lock = dlm.lock(resource, ttl=1.0)
    assert lock.acquire(blocking=False)
    token = lock.token
    time.sleep(0.5)
    lock.extend(3.0)
    assert lock.validity > 2.5
    for node in cluster:
        with node.client() as client:
            assert client.pttl(KEYS.lock(resource)) > 2500
    time.sleep(0.7)  # past the original 1 s TTL
    lock.check()
    assert lock.token == token
    assert not make_dlm(cluster).lock(resource).acquire(blocking=False)
    lock.release()


def test_extend_after_majority_lost_the_key_raises_lock_lost(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "ttl:deleted"
    dlm = make_dlm(cluster)
    lock = dlm.lock(resource, ttl=10.0)
    assert lock.acquire(blocking=False)
    delete_on(list(cluster)[: dlm.quorum], KEYS.lock(resource))
    with pytest.raises(LockLost) as caught:
        lock.extend()
    refused = [r for r in caught.value.outcomes if r.outcome is Outcome.REFUSED]
    assert len(refused) >= dlm.quorum
    assert "quorum" in str(caught.value)
    assert lock.lost and not lock.locked()
    with pytest.raises(LockLost):
        lock.check()
    with pytest.raises(LockLost):
        lock.extend()
    # The lost holder dropped its remaining keys: the next client need not wait 10 s.
    assert lock_key_on(cluster, resource) == [False] * len(cluster)
    assert make_dlm(cluster).lock(resource).acquire(blocking=False)
    before = [get(node, KEYS.lock(resource)) for node in cluster]
    lock.release()  # no error, and it does not touch the new owner's key
    assert [get(node, KEYS.lock(resource)) for node in cluster] == before


def test_auto_extend_keeps_the_lock_past_its_ttl(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "ttl:auto"
    lost = threading.Event()
    lock = make_dlm(cluster).lock(resource, ttl=0.6, auto_extend=True,
                                  on_lost=lambda _lock: lost.set())
    other = make_dlm(cluster).lock(resource, ttl=5.0)
    assert lock.acquire(blocking=False)
    token = lock.token
    held_until = time.monotonic() + 1.5  # 2.5 TTLs
    while time.monotonic() < held_until:
        lock.check()
        time.sleep(0.1)
    assert lock.token == token and lock.validity > 0
    assert not other.acquire(blocking=False)
    lock.release()
    assert other.acquire(blocking=False)
    assert other.token > token
    other.release()
    time.sleep(0.3)  # the stopped watchdog must not report the released lock as lost
    assert not lost.is_set() and not lock.lost


def test_auto_extend_signals_loss_when_keys_vanish(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "ttl:auto-deleted"
    dlm = make_dlm(cluster)
    called: list[Lock] = []
    lost = threading.Event()

    def on_lost(which: Lock) -> None:
        called.append(which)
        lost.set()

    lock = dlm.lock(resource, ttl=0.9, auto_extend=True, on_lost=on_lost)
    assert lock.acquire(blocking=False)
    delete_on(list(cluster)[: dlm.quorum], KEYS.lock(resource))
    assert lost.wait(5.0), "on_lost was never called"
    assert called == [lock]
    assert lock.lost
    with pytest.raises(LockLost) as caught:
        lock.check()
    assert "no longer hold our key" in str(caught.value)
    with pytest.raises(LockLost):
        lock.extend()
    assert make_dlm(cluster).lock(resource).acquire(blocking=False)
    lock.release()


def test_auto_extend_signals_loss_when_a_majority_hangs(
    nodes5: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "ttl:auto-paused"
    lost = threading.Event()
    lock = make_dlm(nodes5, node_timeout=0.05).lock(
        resource, ttl=0.6, auto_extend=True, on_lost=lambda _lock: lost.set())
    assert lock.acquire(timeout=5.0)
    for i in (1, 2, 3):
        nodes5[i].pause()
    paused_at = time.monotonic()
    assert lost.wait(5.0), "on_lost was never called"
    signalled_after = time.monotonic() - paused_at
    print(f"\nwatchdog signalled loss {signalled_after:.2f} s after a majority hung (ttl 0.6 s)")
    assert lock.lost
    with pytest.raises(LockLost) as caught:
        lock.check()
    assert "validity ran out" in str(caught.value)
    with pytest.raises(LockLost):
        lock.extend()
    lock.release()


# ---------------------------------------------------------------------------
# Reentrancy, release
# ---------------------------------------------------------------------------


def test_reentrant_reacquire_returns_the_same_token(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "re:entrant"
    dlm = make_dlm(nodes3)
    outer = dlm.lock(resource, reentrant=True)
    inner = dlm.lock(resource, reentrant=True)  # another handle, same thread
    assert outer.acquire(blocking=False)
    token = outer.token
    assert outer.acquire(blocking=False) and outer.token == token
    assert inner.acquire(blocking=False) and inner.token == token

    other_thread: list[bool] = []
    thread = threading.Thread(target=lambda: other_thread.append(outer.acquire(blocking=False)))
    thread.start()
    thread.join(10)
    assert other_thread == [False]  # reentrancy is per thread, never global

    inner.release()
    outer.release()
    assert lock_key_on(nodes3, resource) == [True] * 3  # still one level deep
    outer.check()
    outer.release()
    assert lock_key_on(nodes3, resource) == [False] * 3
    with dlm.lock(resource, timeout=5.0) as again:
        assert again.token > token


def test_non_reentrant_lock_refuses_to_nest(nodes3: RedisNodes, make_dlm: MakeRedlock) -> None:
    dlm = make_dlm(nodes3)
    lock = dlm.lock("re:plain")
    assert lock.acquire(blocking=False)
    with pytest.raises(RedlockError, match="reentrant"):
        lock.acquire(blocking=False)
    # A second handle in the same thread is another owner: it is simply refused.
    assert not dlm.lock("re:plain").acquire(blocking=False)
    lock.release()


def test_release_is_idempotent_and_needs_a_holder(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    dlm = make_dlm(nodes3)
    with pytest.raises(NotHeld):
        dlm.lock("rel:x").release()
    lock = dlm.lock("rel:x")
    assert lock.acquire(blocking=False)
    lock.release()
    lock.release()
    assert lock_key_on(nodes3, "rel:x") == [False] * 3
    with pytest.raises(NotHeld):
        lock.check()
    assert lock.acquire(blocking=False)  # the handle can be used again
    lock.release()


def test_release_never_deletes_another_owners_key(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "rel:other"
    mine = make_dlm(nodes3).lock(resource, ttl=10.0)
    assert mine.acquire(blocking=False)
    # Someone else's key replaces ours on every node (as after an expiry and re-acquire).
    for node in nodes3:
        with node.client() as client:
            client.set(KEYS.lock(resource), "someone-else", px=10_000)
    mine.release()
    assert [get(node, KEYS.lock(resource)) for node in nodes3] == [b"someone-else"] * 3


# ---------------------------------------------------------------------------
# Contention reporting, configuration, connections
# ---------------------------------------------------------------------------


def test_contention_raises_lock_not_acquired_with_reasons(
    cluster: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    resource = "cfg:busy"
    holder = make_dlm(cluster).lock(resource, ttl=10.0)
    assert holder.acquire(blocking=False)
    started = time.monotonic()
    with pytest.raises(LockNotAcquired) as caught, make_dlm(cluster).lock(resource, timeout=0.3):
        pytest.fail("entered a held lock")
    assert time.monotonic() - started < 3.0
    error = caught.value
    assert not isinstance(error, QuorumUnavailable)  # contention, not an outage
    assert [r.outcome for r in error.outcomes] == [Outcome.REFUSED] * len(cluster)
    assert "held by another owner" in str(error)
    assert all(r.pttl_ms is not None and r.pttl_ms > 0 for r in error.outcomes)
    holder.release()


def test_namespace_changes_key_names(nodes3: RedisNodes, make_dlm: MakeRedlock) -> None:
    mine = make_dlm(nodes3, namespace="billing").lock("invoice:7")
    assert mine.acquire(blocking=False)
    for node in nodes3:
        with node.client() as client:
            keys = sorted(k.decode() for k in client.keys("*"))
        assert keys == ["billing:node-marker", "billing:{invoice:7}:fence",
                        "billing:{invoice:7}:lock"]
    # Another namespace is another set of locks: no contention.
    theirs = make_dlm(nodes3).lock("invoice:7")
    assert theirs.acquire(blocking=False)
    assert lock_key_on(nodes3, "invoice:7") == [True] * 3  # redlock:{invoice:7}:lock
    theirs.release()
    mine.release()


def _acl_node(fresh_nodes: Callable[..., RedisNodes]) -> tuple[RedisNode, str]:
    node = fresh_nodes(1)[0]
    with node.client() as client:
        client.execute_command("ACL", "SETUSER", "alice", "on", ">pw", "~*", "+@all")
    return node, f"redis://alice:pw@{node.host}:{node.port}"


def test_acl_user_url_works(fresh_nodes: Callable[..., RedisNodes],
                            make_dlm: MakeRedlock) -> None:
    node, url = _acl_node(fresh_nodes)
    lock = make_dlm([url]).lock("acl:x")
    assert lock.acquire(blocking=False)
    assert lock.token == 1
    with node.client() as client:
        assert "user=alice" in client.execute_command("CLIENT", "LIST").decode()
    assert get(node, KEYS.lock("acl:x")) is not None
    lock.release()
    assert get(node, KEYS.lock("acl:x")) is None
    bad = make_dlm([f"redis://alice:nope@{node.host}:{node.port}"]).lock("acl:x")
    with pytest.raises(QuorumUnavailable, match="AuthenticationError"):
        bad.acquire(blocking=False)


def test_acl_user_without_channel_permission_releases_cleanly(
    fresh_nodes: Callable[..., RedisNodes], make_dlm: MakeRedlock,
) -> None:
    node, url = _acl_node(fresh_nodes)
    lock = make_dlm([url]).lock("acl:y")
    assert lock.acquire(blocking=False)
    with capture_events() as events:
        lock.release()
    assert get(node, KEYS.lock("acl:y")) is None
    assert [e for e in events if e["event"] == "redlock.release_incomplete"] == []


def test_nodes_given_as_redis_clients(nodes3: RedisNodes, make_dlm: MakeRedlock) -> None:
    clients = [redis.Redis(host=node.host, port=node.port, decode_responses=True)
               for node in nodes3]
    try:
        dlm = make_dlm(clients)
        assert dlm.nodes == tuple(f"{node.host}:{node.port}" for node in nodes3)
        tokens = []
        for _ in range(3):
            with dlm.lock("cli:x", timeout=5.0) as held:
                tokens.append(held.token)
                assert all(c.get(KEYS.lock("cli:x")) for c in clients)
        assert strictly_increasing(tokens)
        dlm.close()
        assert all(c.ping() for c in clients)  # the caller's clients stay usable
    finally:
        for client in clients:
            client.close()


def test_wrong_password_fails_fast_with_a_typed_error(
    fresh_nodes: Callable[..., RedisNodes], make_dlm: MakeRedlock,
) -> None:
    nodes = fresh_nodes(3, password="right")
    good = make_dlm(nodes).lock("auth:x")
    assert good.acquire(blocking=False)
    good.release()
    for auth in (":wrong@", ""):
        urls = [f"redis://{auth}{node.host}:{node.port}" for node in nodes]
        lock = make_dlm(urls).lock("auth:x", timeout=10.0)
        started = time.monotonic()
        with pytest.raises(QuorumUnavailable) as caught:
            lock.acquire()  # blocking, 10 s deadline: a credential error is not retried
        elapsed = time.monotonic() - started
        assert elapsed < 2.0, f"{elapsed:.2f} s"
        assert [r.outcome for r in caught.value.outcomes] == [Outcome.ERROR] * 3
        assert "AuthenticationError" in str(caught.value)
        assert "after 1 attempt(s)" in str(caught.value)


def test_unreachable_nodes_tolerated_as_minority_fail_fast_as_majority(
    nodes3: RedisNodes, make_dlm: MakeRedlock,
) -> None:
    with make_dlm(nodes3).lock("dead:x", timeout=5.0):
        pass  # initialise the cluster: a partial view never counts as a fresh cluster
    dead = [f"redis://127.0.0.1:{free_port()}" for _ in range(2)]
    assert dead[0] != dead[1]
    minority = make_dlm([nodes3[0].url, nodes3[1].url, dead[0]]).lock("dead:x")
    assert minority.acquire(blocking=False)
    minority.release()

    majority = make_dlm([nodes3[0].url, *dead])
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable) as caught:
        majority.lock("dead:x").acquire(blocking=False)
    assert time.monotonic() - started < 2.0
    assert [r.outcome for r in caught.value.outcomes] == [
        Outcome.GRANTED, Outcome.ERROR, Outcome.ERROR]
    assert "ConnectionError" in str(caught.value)
    started = time.monotonic()
    with pytest.raises(QuorumUnavailable), majority.lock("dead:x", timeout=0.5):
        pytest.fail("entered without a quorum")
    assert time.monotonic() - started < 3.0
    assert get(nodes3[0], KEYS.lock("dead:x")) is None
