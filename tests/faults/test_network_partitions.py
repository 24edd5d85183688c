"""Scenarios 1-4: network faults between the client and the nodes, N = 5, through a real
Toxiproxy server (one proxy in front of each real redis-server node).

1. Minority partition (1 and 2 nodes blackholed, refused, or reset): acquisitions keep
   succeeding, each within about one node timeout; contending clients stay exclusive.
2. Majority partition (3 of 5 blackholed or refused): acquire fails within its deadline
   with a per-node reason, nothing hangs, no key is left once healed, and the lock is
   acquirable again at once.
3. Lost replies on a majority (the nodes run the acquire, the client never hears): the
   attempt counts as failed, it is released everywhere, and the next client gets the
   lock within the TTL after healing.
4. A latency spike longer than the validity: the lock is reported not acquired instead
   of being handed out expired; a spike shorter than the validity yields a handle whose
   validity is honest (it ends before the keys expire).

Every scenario records a history (acquisitions as hold intervals, fenced writes to a
store on a separate, unfaulted node) and runs the checker: no shared or backwards
tokens, accepted fenced writes in order, and (no clock or pause faults here) no two
holds overlap.

Rerun: ``bash scripts/faults -k network -s`` (figures as a table at the end), or
``.venv/bin/python -m pytest tests/faults/test_network_partitions.py -s``.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fencing import RedisFencedStore
from redlock import AsyncRedlock, Outcome, QuorumUnavailable, Redlock
from redlock.testing import Proxies, Proxy, RedisNode
from redlock.testing.history import ACCEPTED, ERROR, REJECTED, History, Hold, Write
from tests.faults.conftest import DLM_OPTIONS, MakeDlm, acquire_or_false, fenced_write
from tests.faults.fault_figures import Figures, scenario
from tests.peek import fence_counters, lock_keys

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

# Per node and request, small against the TTL: a blackholed node costs one node timeout
# per acquire and per release, which must leave most of the TTL; the latency and
# recovery bounds below are in node timeouts.
NODE_TIMEOUT = 0.15
TTL = 1.0


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture
def dlm_options() -> dict[str, Any]:
    return {**DLM_OPTIONS, "node_timeout": NODE_TIMEOUT}


@pytest.fixture
def proxied_dlm(make_dlm: MakeDlm, proxied5: Proxies) -> Callable[..., Redlock]:
    """Clients that talk to the nodes through the proxies, warmed up (connected, the
    one-time node inspection done) before any fault is injected."""
    def make(**options: Any) -> Redlock:
        dlm = make_dlm(proxied5, **options)
        with dlm.lock("warm-up", ttl=TTL, timeout=5.0):
            pass
        return dlm

    return make


def behind(proxies: Proxies) -> list[RedisNode]:
    """The nodes behind the proxies: read straight, not through the proxies."""
    nodes = [proxy.node for proxy in proxies]
    assert all(node is not None for node in nodes)
    return nodes  # type: ignore[return-value]


def fault(proxy: Proxy, kind: str) -> None:
    {"blackhole": proxy.blackhole, "refuse": proxy.refuse, "reset": proxy.reset_connections,
     "lose-replies": proxy.lose_replies}[kind]()


class Recorder:
    """Acquire, fenced write, release; each step recorded into the history."""

    def __init__(self, figures: Figures, store: RedisFencedStore) -> None:
        self.figures = figures
        self.store = store
        self.history = History()
        self.latencies: list[float] = []
        self._mutex = threading.Lock()

    def cycle(self, dlm: Redlock, client: str, resource: str, *, ttl: float = TTL,
              blocking: bool = True, timeout: float = 2.0, hold: float = 0.0) -> int | None:
        with self._mutex:
            self.figures.attempted += 1
        lock = dlm.lock(resource, ttl=ttl)
        invoked = time.monotonic()
        got = acquire_or_false(lock, blocking=blocking, timeout=timeout if blocking else None)
        completed = time.monotonic()
        if not got:
            with self._mutex:
                self.figures.failed_cleanly += 1
            return None
        # The holder may act on the lock until its validity runs out (measured now, so
        # a little before the real end: conservative for the overlap check).
        valid_until = completed + lock.validity
        token = lock.token
        with self._mutex:
            self.figures.succeeded += 1
            self.latencies.append(completed - invoked)
        try:
            self.write(client, resource, token)
            if hold:
                time.sleep(hold)
        finally:
            released = time.monotonic()
            lock.release()
            self.history.held(Hold(client, resource, token, completed,
                                   min(released, valid_until), invoked))
        return token

    def write(self, client: str, resource: str, token: int) -> None:
        invoked = time.monotonic()
        outcome = fenced_write(self.store, client, resource, token)
        self.history.wrote(Write(client, resource, token, invoked, time.monotonic(),
                                       outcome))

    def contend(self, dlms: Sequence[Redlock], resource: str, seconds: float) -> None:
        """Several clients (one thread each) loop on one resource for ``seconds``."""
        end = time.monotonic() + seconds
        errors: list[BaseException] = []

        def loop(index: int, dlm: Redlock) -> None:
            try:
                while time.monotonic() < end:
                    self.cycle(dlm, f"c{index}", resource, timeout=1.0, hold=0.005)
            except BaseException as exc:  # surfaced in the test thread below
                errors.append(exc)

        threads = [threading.Thread(target=loop, args=(i, dlm)) for i, dlm in enumerate(dlms)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(seconds + 30)
        assert not any(t.is_alive() for t in threads), "a client thread hung"
        assert not errors, errors

    def check(self) -> list[str]:
        problems = self.history.violations(exclusive=True)
        self.figures.violations = len(problems)
        self.figures.extra.update(
            writes_accepted=self.history.count(ACCEPTED),
            writes_rejected=self.history.count(REJECTED),
            writes_error=self.history.count(ERROR))
        if self.latencies:
            self.figures.extra.update(
                acquire_p50_ms=round(statistics.median(self.latencies) * 1000, 1),
                acquire_max_ms=round(max(self.latencies) * 1000, 1))
        return problems


# ---------------------------------------------------------------------------
# 1. Minority partition
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("faulted", [1, 2], ids=lambda n: f"{n}of5")
@pytest.mark.parametrize("kind", ["blackhole", "refuse", "reset"])
def test_minority_partition_keeps_granting_within_the_node_timeout(
        proxied5: Proxies, proxied_dlm: Callable[..., Redlock], store: RedisFencedStore,
        kind: str, faulted: int) -> None:
    dlms = [proxied_dlm() for _ in range(3)]
    with scenario(f"minority-partition-{kind}-{faulted}of5") as figures:
        recorder = Recorder(figures, store)
        for proxy in proxied5[:faulted]:
            fault(proxy, kind)
        # Uncontended: every non-blocking acquire succeeds, in about one node timeout.
        resource = f"minority:{kind}:{faulted}"
        for _ in range(12):
            assert recorder.cycle(dlms[0], "solo", resource, blocking=False) is not None
        solo_latencies = list(recorder.latencies)
        # Contended: three clients keep going and stay exclusive.
        recorder.contend(dlms, resource, seconds=2.0)
        problems = recorder.check()
        figures.extra["uncontended_max_ms"] = round(max(solo_latencies) * 1000, 1)
    assert not problems, problems
    # A hung node costs at most about one node timeout per acquire (bounded generously
    # for a loaded 2-core machine; the figures print the real values).
    assert max(solo_latencies) < NODE_TIMEOUT + 0.5
    assert figures.succeeded > 12  # the contended phase got the lock too
    assert figures.extra["writes_accepted"] == figures.succeeded


# ---------------------------------------------------------------------------
# 2. Majority partition
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["blackhole", "refuse"])
def test_majority_partition_fails_within_the_deadline_and_recovers_when_healed(
        proxied5: Proxies, proxied_dlm: Callable[..., Redlock], store: RedisFencedStore,
        kind: str) -> None:
    dlm = proxied_dlm()
    resource = f"majority:{kind}"
    with scenario(f"majority-partition-{kind}") as figures:
        recorder = Recorder(figures, store)
        for proxy in proxied5[:3]:
            fault(proxy, kind)
        # Non-blocking: one attempt, a typed failure naming each node's outcome.
        figures.attempted += 1
        started = time.monotonic()
        with pytest.raises(QuorumUnavailable) as failure:
            dlm.lock(resource, ttl=TTL).acquire(blocking=False)
        single = time.monotonic() - started
        figures.failed_cleanly += 1
        outcomes = failure.value.outcomes
        assert [r.outcome for r in outcomes[:3]] == [Outcome.ERROR] * 3
        assert all(r.detail for r in outcomes[:3])  # a reason per node
        assert [r.outcome for r in outcomes[3:]] == [Outcome.GRANTED] * 2
        # Blocking with a deadline: gives up at the deadline, not later.
        for _ in range(3):
            started = time.monotonic()
            assert recorder.cycle(dlm, "blocked", resource, timeout=0.5) is None
            assert time.monotonic() - started < 0.5 + 2 * NODE_TIMEOUT + 0.5
        blocked = time.monotonic() - started
        # The two reachable nodes granted each attempt: the failed attempt released them.
        assert lock_keys(behind(proxied5), resource) == [False] * 5
        healed = time.monotonic()
        for proxy in proxied5[:3]:
            proxy.heal()
        token = recorder.cycle(proxied_dlm(), "after", resource, timeout=TTL + 2.0)
        figures.recovery_s = time.monotonic() - healed
        problems = recorder.check()
        figures.extra.update(single_attempt_ms=round(single * 1000, 1),
                             blocking_timeout_0_5_s_took_ms=round(blocked * 1000, 1))
    assert token is not None
    assert not problems, problems
    assert single < 2 * NODE_TIMEOUT + 0.5
    assert figures.recovery_s < TTL + 1.0
    time.sleep(TTL)  # nothing may be left once the TTL has passed
    assert lock_keys(behind(proxied5), resource) == [False] * 5


# ---------------------------------------------------------------------------
# 3. Lost replies on a majority
# ---------------------------------------------------------------------------


def test_lost_replies_on_a_majority_fail_release_and_recover_within_the_ttl(
        proxied5: Proxies, proxied_dlm: Callable[..., Redlock], store: RedisFencedStore) -> None:
    dlm, other = proxied_dlm(), proxied_dlm()
    resource = "lost-replies"
    with scenario("lost-replies-majority-sync") as figures:
        recorder = Recorder(figures, store)
        before = fence_counters(behind(proxied5), resource)[:3]
        for proxy in proxied5[:3]:
            proxy.lose_replies()
        assert recorder.cycle(dlm, "a", resource, blocking=False) is None
        # The nodes did run the acquire (their replies were lost, not their requests):
        # each one's counter moved by one.
        ran_unheard = [after - b for after, b in zip(
            fence_counters(behind(proxied5), resource)[:3], before, strict=True)]
        healed = time.monotonic()
        for proxy in proxied5[:3]:
            proxy.heal()
        time.sleep(0.05)  # let any release queued behind the acquire run
        left_after_heal = lock_keys(behind(proxied5), resource)
        token = recorder.cycle(other, "b", resource, timeout=TTL + 2.0)
        figures.recovery_s = time.monotonic() - healed
        problems = recorder.check()
        figures.extra.update(nodes_that_ran_the_unheard_acquire=sum(ran_unheard),
                             keys_left_after_heal=sum(left_after_heal))
    assert token is not None
    assert not problems, problems
    assert ran_unheard == [1, 1, 1]
    assert figures.recovery_s < TTL + 1.0
    # The release was written behind the unanswered acquire on the same socket, so the
    # nodes whose replies were lost ran it too: nothing waits for the TTL.
    assert left_after_heal == [False] * 5


def test_lost_replies_on_a_majority_asyncio_client(
        proxied5: Proxies, proxied_dlm: Callable[..., Redlock], store: RedisFencedStore) -> None:
    resource = "lost-replies-async"

    async def attempt() -> tuple[bool, list[int]]:
        async with AsyncRedlock(proxied5.urls, node_timeout=NODE_TIMEOUT) as dlm:
            async with dlm.lock("warm-up", ttl=TTL, timeout=5.0):
                pass
            before = fence_counters(behind(proxied5), resource)
            for proxy in proxied5[:3]:
                proxy.lose_replies()
            try:
                got = await dlm.lock(resource, ttl=TTL).acquire(blocking=False)
            except QuorumUnavailable:
                got = False
            ran = [after - b for after, b in zip(fence_counters(behind(proxied5), resource),
                                                 before, strict=True)]
            for proxy in proxied5[:3]:
                proxy.heal()
            await asyncio.sleep(0.05)  # the release written behind the acquire runs
        return got, ran

    with scenario("lost-replies-majority-asyncio") as figures:
        recorder = Recorder(figures, store)
        figures.attempted += 1
        got, ran = asyncio.run(attempt())
        healed = time.monotonic()
        left_after_heal = lock_keys(behind(proxied5), resource)
        assert not got
        figures.failed_cleanly += 1
        token = recorder.cycle(proxied_dlm(), "b", resource, timeout=TTL + 2.0)
        figures.recovery_s = time.monotonic() - healed
        problems = recorder.check()
        figures.extra.update(nodes_that_ran_the_unheard_acquire=sum(ran[:3]),
                             keys_left_after_heal=sum(left_after_heal))
    assert token is not None
    assert not problems, problems
    assert ran[:3] == [1, 1, 1]
    # The asyncio shell keeps the unanswered connection and writes the release behind
    # the acquire: every node ran both, so nothing waits for the TTL.
    assert left_after_heal == [False] * 5
    assert figures.recovery_s < 0.5 + NODE_TIMEOUT


# ---------------------------------------------------------------------------
# 4. Latency spike longer than the validity
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("latency", [0.1, 0.3, 0.8])
def test_latency_spike_past_the_validity_is_reported_not_handed_out(
        proxied5: Proxies, proxied_dlm: Callable[..., Redlock], store: RedisFencedStore,
        latency: float) -> None:
    ttl = 0.5
    # The node timeout is larger than the TTL on purpose: the replies do arrive, after
    # the lock's validity is gone; the client must notice instead of handing it out.
    dlm = proxied_dlm(node_timeout=1.5)
    resource = f"latency:{latency}"
    with scenario(f"latency-spike-{int(latency * 1000)}ms-ttl-500ms") as figures:
        recorder = Recorder(figures, store)
        for proxy in proxied5[:3]:
            proxy.latency(latency)
        outcomes = []
        for _ in range(3):
            lock = dlm.lock(resource, ttl=ttl)
            figures.attempted += 1
            invoked = time.monotonic()
            # A refusal may also be QuorumUnavailable: a try keeps its deadline (here
            # node_timeout, 1.5 s), and the slow nodes' first connections (a handshake
            # of two round trips of 0.8 s) may not be open by then.
            got = acquire_or_false(lock, blocking=False)
            completed = time.monotonic()
            if got:
                validity = lock.validity
                figures.succeeded += 1
                outcomes.append(("granted", round(validity, 3)))
                # Honest validity: it ends before the keys, set after `invoked`, expire.
                assert validity > 0
                assert completed + validity <= invoked + ttl
                token = lock.token
                recorder.write("spiked", resource, token)
                released = time.monotonic()
                lock.release()
                recorder.history.held(Hold("spiked", resource, token, completed,
                                           min(released, completed + validity), invoked))
            else:
                figures.failed_cleanly += 1
                outcomes.append(("refused", round(completed - invoked, 3)))
        for proxy in proxied5[:3]:
            proxy.heal()
        time.sleep(ttl)
        left = lock_keys(behind(proxied5), resource)
        problems = recorder.check()
        figures.extra.update(latency_ms=int(latency * 1000), outcomes=outcomes)
    assert not problems, problems
    assert left == [False] * 5
    if latency > ttl:
        assert figures.succeeded == 0, "an expired lock was handed out"
    if latency < ttl / 4:
        assert figures.succeeded == 3
