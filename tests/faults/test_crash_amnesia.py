"""Scenario 6: node crash (kill -9) and restart, N = 5, with and without persistence.

* With AOF and ``appendfsync always`` a crashed node loses nothing: a held lock is
  still held after any number of nodes (all five at once included) were killed and
  restarted, the holder can extend and release it, and tokens continue exactly.
* Without persistence a restarted node is empty (amnesia, docs/design.md §4.3): it is
  detected (the acquire script refuses on it with its own reply), counted as failed
  for the quorum, kept out for one ``max_ttl`` (delayed rejoin), then re-seeded with
  every fence counter from a healthy majority, so tokens never go backwards, even for a
  fresh client that has no floor of its own.
* Ten rounds of random minority restarts (some while other nodes are paused, so fence
  counters diverge, and checked by fresh clients): tokens never go backwards and every
  fenced write is accepted.
* A majority restarted empty at once: ``ClusterAmnesiaError``, never lower tokens.

Rerun: ``.venv/bin/python -m pytest tests/faults/test_crash_amnesia.py -v -s``
(``REDLOCK_FAULT_SEED=<n>`` replays a random schedule; the seed is printed).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from fencing import RedisFencedStore, StaleTokenError
from redlock import (
    ClusterAmnesiaError,
    LockNotAcquired,
    Outcome,
    QuorumUnavailable,
    Redlock,
)
from redlock.admin import Admin
from redlock.testing import RedisNodes
from tests.faults.conftest import DLM_OPTIONS, MakeDlm
from tests.faults.fault_figures import Figures, scenario
from tests.internals import KEYS
from tests.peek import decided_as, fence_counters, get, lock_keys, lock_values, resume_and_settle

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

MAX_TTL = 1.0  # how long an amnesiac node stays out; every lock here has ttl <= MAX_TTL
# The single-amnesia test checks that the nodes are still out before one max_ttl has
# passed: a little more room for a loaded machine.
SLOW_MAX_TTL = 2.0


# ---------------------------------------------------------------------------
# Fixtures and helpers
# ---------------------------------------------------------------------------


@pytest.fixture
def dlm_options() -> dict[str, Any]:
    # An amnesiac node rejoins one max_ttl after it was seen empty: small, so that the
    # scenarios see it rejoin.
    return {**DLM_OPTIONS, "max_ttl": MAX_TTL}


class Tokens:
    """Acquisitions of one test, in real-time order (one client thread at a time):
    every token must be larger than every earlier one of its resource, and every
    fenced write with it must be accepted."""

    def __init__(self, figures: Figures, store: RedisFencedStore) -> None:
        self.figures = figures
        self.store = store
        self.seen: dict[str, list[int]] = {}
        self.problems: list[str] = []

    def acquire(self, dlm: Redlock, resource: str, *, ttl: float = MAX_TTL,
                timeout: float = 10.0, write: bool = True) -> int | None:
        """One acquire-write-release; returns the token, or None when it failed cleanly."""
        self.figures.attempted += 1
        lock = dlm.lock(resource, ttl=ttl)
        try:
            if not lock.acquire(timeout=timeout):
                self.figures.failed_cleanly += 1
                return None
        except (LockNotAcquired, ClusterAmnesiaError):
            self.figures.failed_cleanly += 1
            raise
        try:
            token = lock.token
            self.figures.succeeded += 1
            self.record(resource, token)
            if write:
                self.write(resource, token)
            return token
        finally:
            lock.release()

    def record(self, resource: str, token: int) -> None:
        earlier = self.seen.setdefault(resource, [])
        if earlier and token <= max(earlier):
            self.violation(f"{resource}: token {token} after {max(earlier)}")
        earlier.append(token)

    def write(self, resource: str, token: int) -> None:
        try:
            self.store.write(resource, token, str(token).encode())
        except StaleTokenError as exc:
            self.violation(f"{resource}: fenced write with the current token rejected: {exc}")

    def violation(self, text: str) -> None:
        self.figures.violations += 1
        self.problems.append(text)


# ---------------------------------------------------------------------------
# With AOF, appendfsync always: nothing lost
# ---------------------------------------------------------------------------


def test_aof_crash_restart_loses_nothing(
    make_dlm: MakeDlm, store: RedisFencedStore,
) -> None:
    """Five rounds: hold a lock, kill -9 a random 1..5 nodes (all at once in the last
    round), restart them with their files. The lock is still held (another client is
    refused by every node; a restarted one counts as amnesiac until it is re-stamped,
    docs/design.md §4), the holder extends it and writes; every fence counter and lock
    key is as it was before the crash (nothing lost, nothing re-seeded) and tokens go
    on."""
    rng = random.Random(_seed())
    resource = "crash:aof"
    with RedisNodes(5, appendonly=True) as nodes, scenario("crash-restart-aof") as figures:
        tokens = Tokens(figures, store)
        dlm, other = make_dlm(nodes, max_ttl=30.0), make_dlm(nodes, max_ttl=30.0)
        tokens.acquire(dlm, resource, ttl=10.0)
        recoveries = []
        for round_ in range(5):
            holder = dlm.lock(resource, ttl=10.0)
            figures.attempted += 1
            assert holder.acquire(timeout=10.0)
            figures.succeeded += 1
            token = holder.token
            tokens.record(resource, token)
            crashed = list(range(5)) if round_ == 4 else rng.sample(range(5), rng.randint(1, 4))
            counters = fence_counters(nodes, resource)
            holders = lock_values(nodes, resource)
            killed_at = time.monotonic()
            for i in crashed:
                nodes[i].kill()
            for i in crashed:
                nodes[i].start()  # same files: replays the AOF
            assert all(get(node, KEYS.marker) is not None for node in nodes)
            # Nothing lost: every counter and every key as before the crash.
            assert fence_counters(nodes, resource) == counters
            assert lock_values(nodes, resource) == holders
            # Restarted nodes are suspects until judged: durable (AOF, fsync always),
            # they are re-stamped, not benched.
            assert [r.status for r in Admin(other).repair()] == ["healthy"] * 5
            # Still held: the other client is refused by all five nodes.
            figures.attempted += 1
            rival = other.lock(resource, ttl=10.0)
            try:
                got = rival.acquire(blocking=False)
            except QuorumUnavailable:  # a majority restarted: too few judged nodes answer
                got = False
            if got:
                tokens.violation(f"round {round_}: a second holder after restarting {crashed}")
                rival.release()
            else:
                figures.failed_cleanly += 1
                assert rival.last_failure is not None
                # A restarted node's refusal does not count until it is judged (it may
                # be an older copy, docs/design.md §4): AMNESIAC until re-stamped. A
                # node still to answer once the other replies decided the attempt is
                # NOT_AWAITED (early decision, §2.4); which node that is, is a race.
                outcomes = [r.outcome for r in rival.last_failure.outcomes]
                assert all(outcome in (Outcome.REFUSED, Outcome.NOT_AWAITED)
                           or (outcome is Outcome.AMNESIAC and i in crashed)
                           for i, outcome in enumerate(outcomes)), (crashed, outcomes)
            holder.extend()  # a quorum still holds our key
            recoveries.append(time.monotonic() - killed_at)
            tokens.write(resource, token)
            holder.release()
            after = tokens.acquire(dlm, resource, ttl=10.0)
            # One more, or a little more: an attempt that met restarted nodes before they
            # were re-stamped fails and still raises the counters of the nodes it reached.
            assert after is not None and after > token, f"tokens go on: {token} then {after}"
        assert all(report.status == "healthy" for report in Admin(dlm).repair())
        figures.recovery_s = max(recoveries)
        figures.extra.update(rounds=5, restarts_per_round="1-4, then all 5",
                             tokens=tokens.seen[resource])
        assert not tokens.problems, tokens.problems


# ---------------------------------------------------------------------------
# Without persistence: amnesia
# ---------------------------------------------------------------------------


def test_minority_amnesia_detected_excluded_rejoins_late_and_reseeded(
    nodes5: RedisNodes, make_dlm: MakeDlm, store: RedisFencedStore,
) -> None:
    """Tokens of ``fenced`` are committed on {0, 1, 2} only (3 and 4 paused), then 0 and
    1 crash and come back empty while a holder holds ``held``.

    Detected: the next acquire sees AMNESIAC on 0 and 1. Excluded: they get no lock key
    and count as failed (with one more node paused there is no quorum). Delayed: they
    stay out until one max_ttl after they were first seen, and the holder's lock stays
    exclusive meanwhile. Re-seeded: afterwards their fence counters equal the highest
    committed token, so a fresh client (no floor) on the majority {0, 1, 4} still gets a
    larger token; without the re-seed it would get a small one."""
    fenced, held_res, other_res = "amnesia:fenced", "amnesia:held", "amnesia:other"
    max_ttl = SLOW_MAX_TTL
    with scenario("crash-restart-no-persistence-minority") as figures:
        tokens = Tokens(figures, store)
        dlm = make_dlm(nodes5, max_ttl=max_ttl)
        tokens.acquire(dlm, other_res)  # initialises the cluster
        for i in (3, 4):
            nodes5[i].pause()
        committed = [t for t in (tokens.acquire(dlm, fenced) for _ in range(5)) if t]
        resume_and_settle(nodes5.nodes[3:])
        top = committed[-1]
        assert fence_counters(nodes5, fenced)[:3] == [top] * 3
        assert max(fence_counters(nodes5.nodes[3:], fenced)) < top

        holder = dlm.lock(held_res, ttl=max_ttl)
        figures.attempted += 1
        assert holder.acquire(timeout=10.0)
        figures.succeeded += 1
        tokens.record(held_res, holder.token)
        crashed_at = time.monotonic()
        for i in (0, 1):
            nodes5[i].restart(keep_data=False)
            assert get(nodes5[i], KEYS.marker) is None

        # Excluded: granted by the three healthy nodes only; no key on the amnesiac ones.
        lock = dlm.lock(other_res, ttl=max_ttl)
        figures.attempted += 1
        assert lock.acquire(timeout=10.0)
        figures.succeeded += 1
        tokens.record(other_res, lock.token)
        assert lock_keys(nodes5, other_res) == [False, False, True, True, True]
        lock.release()

        # Delayed: still out before one max_ttl has passed (checked when the machine was
        # quick enough to get here in time; the rejoin time is asserted below anyway).
        waiting_checked = time.monotonic() - crashed_at < max_ttl * 0.7
        if waiting_checked:
            statuses = [r.status for r in Admin(dlm).repair()]
            assert statuses[:2] == ["waiting", "waiting"], statuses
            assert [get(nodes5[0], KEYS.marker), get(nodes5[1], KEYS.marker)] == [None, None]

        # Detected by a fresh client too, and the holder's lock is still exclusive
        # (2, 3, 4 hold its key).
        rival = make_dlm(nodes5, max_ttl=max_ttl).lock(held_res, ttl=max_ttl)
        figures.attempted += 1
        assert not rival.acquire(blocking=False)
        figures.failed_cleanly += 1
        assert rival.last_failure is not None
        assert decided_as(rival.last_failure.outcomes, [
            Outcome.AMNESIAC, Outcome.AMNESIAC, Outcome.REFUSED, Outcome.REFUSED,
            Outcome.REFUSED], quorum=3), rival.last_failure.outcomes
        tokens.write(held_res, holder.token)
        holder.release()

        # Counted as failed: two amnesiac + one paused leave two healthy nodes.
        nodes5[2].pause()
        figures.attempted += 1
        with pytest.raises(QuorumUnavailable) as caught:
            dlm.lock(other_res, ttl=max_ttl).acquire(timeout=0.5)
        figures.failed_cleanly += 1
        assert [r.outcome for r in caught.value.outcomes][:3] == [
            Outcome.AMNESIAC, Outcome.AMNESIAC, Outcome.ERROR]
        resume_and_settle([nodes5[2]])

        # After max_ttl the next acquire re-seeds them and gives their markers back.
        rejoined_at = None
        deadline = crashed_at + max_ttl + 20.0
        while time.monotonic() < deadline:
            tokens.acquire(dlm, other_res)
            if get(nodes5[0], KEYS.marker) is not None and get(nodes5[1], KEYS.marker) is not None:
                rejoined_at = time.monotonic()
                break
            time.sleep(0.1)
        assert rejoined_at is not None, "the amnesiac nodes never rejoined"
        figures.recovery_s = rejoined_at - crashed_at
        assert figures.recovery_s >= max_ttl, "rejoined before one max_ttl had passed"
        assert min(fence_counters(nodes5.nodes[:2], fenced)) >= top

        # A fresh client on the majority {0, 1, 4} (4 lags far behind): above top.
        for i in (2, 3):
            nodes5[i].pause()
        try:
            after = tokens.acquire(make_dlm(nodes5, max_ttl=max_ttl), fenced)
        finally:
            resume_and_settle(nodes5.nodes[2:4])
        assert after is not None and after > top, (after, top)
        figures.extra.update(committed_before_crash=top, token_after_rejoin=after,
                             max_ttl_s=max_ttl, waiting_checked=waiting_checked)
        assert not tokens.problems, tokens.problems


def test_random_minority_restarts_tokens_never_go_backwards(
    nodes5: RedisNodes, make_dlm: MakeDlm, store: RedisFencedStore,
) -> None:
    """Ten rounds. Each round kills -9 and restarts empty a random minority (1 or 2
    nodes, never more than two without their marker at once), then runs 2-4
    acquisitions, some while a random healthy node or two are paused (so fence counters
    diverge between nodes), some through a fresh client with no floor of its own.
    Every token must exceed every earlier one and every fenced write must be accepted;
    every restarted node must eventually rejoin."""
    seed = _seed()
    rng = random.Random(seed)
    resources = ["rounds:a", "rounds:b"]
    with scenario("crash-restart-random-minority") as figures:
        tokens = Tokens(figures, store)
        dlm = make_dlm(nodes5)
        for resource in resources:
            tokens.acquire(dlm, resource)
        restarted_at: dict[int, float] = {}
        recoveries: list[float] = []
        schedule = []

        def note_rejoins() -> None:
            for i, since in list(restarted_at.items()):
                if get(nodes5[i], KEYS.marker) is not None:
                    recoveries.append(time.monotonic() - since)
                    del restarted_at[i]

        for _ in range(10):
            out = {i for i in range(5) if get(nodes5[i], KEYS.marker) is None}
            # 1 or 2 nodes; with two still out, one or both of those again.
            want, crash = rng.randint(1, 2), set[int]()
            for i in rng.sample(range(5), 5):
                if len(crash) < want and len(out | crash | {i}) <= 2:
                    crash.add(i)
            assert crash
            for i in sorted(crash):
                nodes5[i].restart(keep_data=False)
                restarted_at[i] = time.monotonic()
            out |= crash
            events = [f"restart {sorted(crash)}"]
            for _ in range(rng.randint(2, 4)):
                resource = rng.choice(resources)
                healthy = [i for i in range(5) if i not in out]
                budget = 2 - len(out)  # paused + amnesiac <= 2 leaves a quorum
                paused = rng.sample(healthy, rng.randint(1, budget)) \
                    if budget > 0 and rng.random() < 0.6 else []
                for i in paused:
                    nodes5[i].pause()
                fresh = rng.random() < 0.5
                client = make_dlm(nodes5) if fresh else dlm
                try:
                    token = tokens.acquire(client, resource)
                finally:
                    resume_and_settle([nodes5[i] for i in paused])
                    if fresh:
                        client.close()
                events.append(f"{resource}={token}{' fresh' if fresh else ''}"
                              f"{f' paused {sorted(paused)}' if paused else ''}")
                note_rejoins()
                time.sleep(rng.uniform(0.0, 0.4))
            if rng.random() < 0.4:  # sometimes let every node rejoin before the next round
                heal_by = time.monotonic() + MAX_TTL + 10.0
                while restarted_at and time.monotonic() < heal_by:
                    token = tokens.acquire(dlm, resources[0])
                    events.append(f"{resources[0]}={token}")
                    note_rejoins()
                    time.sleep(0.2)
                events.append("healed" if not restarted_at else "not healed")
            schedule.append("; ".join(events))
        # Heal: one max_ttl after the last restart every node must be back.
        deadline = time.monotonic() + MAX_TTL + 20.0
        while restarted_at and time.monotonic() < deadline:
            tokens.acquire(dlm, resources[0])
            note_rejoins()
            time.sleep(0.1)
        print(f"\nseed {seed}:\n  " + "\n  ".join(schedule))
        figures.recovery_s = max(recoveries) if recoveries else None
        figures.extra.update(seed=seed, rounds=10, rejoins=len(recoveries),
                             mean_rejoin_s=round(sum(recoveries) / len(recoveries), 3)
                             if recoveries else None, max_ttl_s=MAX_TTL)
        assert not restarted_at, f"nodes {sorted(restarted_at)} never rejoined"
        assert all(get(node, KEYS.marker) is not None for node in nodes5)
        assert not tokens.problems, tokens.problems
        for resource in resources:
            assert store.highest(resource) == max(tokens.seen[resource])


def test_majority_restarted_empty_refuses_with_cluster_amnesia_error(
    nodes5: RedisNodes, make_dlm: MakeDlm, store: RedisFencedStore,
) -> None:
    """Three of five come back empty at once: the client that knew the cluster and a
    fresh client both get ClusterAmnesiaError (with the per-node outcomes), nothing is
    re-initialised, and no token is handed out at all, let alone a lower one. All five
    empty: the client that knew the cluster still refuses."""
    resource = "amnesia:majority"
    with scenario("crash-restart-no-persistence-majority") as figures:
        tokens = Tokens(figures, store)
        dlm = make_dlm(nodes5)
        top = max(t for t in (tokens.acquire(dlm, resource) for _ in range(3)) if t)
        for i in (0, 2, 4):
            nodes5[i].restart(keep_data=False)
        for client in (dlm, make_dlm(nodes5), dlm):
            started = time.monotonic()
            with pytest.raises(ClusterAmnesiaError) as caught:
                tokens.acquire(client, resource, timeout=5.0)
            assert time.monotonic() - started < 5.0
            assert "have no node marker" in str(caught.value)
            assert [r.outcome for r in caught.value.outcomes] == [
                Outcome.AMNESIAC, Outcome.GRANTED, Outcome.AMNESIAC, Outcome.GRANTED,
                Outcome.AMNESIAC]
        statuses = [r.status for r in Admin(dlm).repair(force=True)]
        assert statuses.count("failed") == 3, statuses  # no healthy majority to seed from
        assert [get(nodes5[i], KEYS.marker) for i in (0, 2, 4)] == [None] * 3
        assert lock_keys(nodes5, resource) == [False] * 5
        for i in (1, 3):
            nodes5[i].restart(keep_data=False)
        with pytest.raises(ClusterAmnesiaError):
            tokens.acquire(dlm, resource, timeout=5.0)
        assert all(get(node, KEYS.marker) is None for node in nodes5)
        assert store.highest(resource) == top
        figures.extra.update(note="refused until an operator restores the data; "
                                  "a brand-new client facing five empty nodes cannot tell "
                                  "them from a new cluster (see the next test)")
        assert not tokens.problems, tokens.problems


def test_all_nodes_empty_and_a_new_client_reinitialises_but_fencing_rejects(
    nodes5: RedisNodes, make_dlm: MakeDlm, store: RedisFencedStore,
) -> None:
    """The one case the library cannot detect (docs/design.md §4.6: all N answer, none has a
    marker, so a client that never saw the cluster initialises it): every node restarted
    empty and a brand-new client. Its tokens start again from 1; the fenced store, which
    keeps its own highest token, rejects them. Safety holds through fencing; liveness
    needs an operator. Documented here so the limit is measured, not assumed."""
    resource = "amnesia:all"
    with scenario("crash-restart-no-persistence-all-new-client") as figures:
        tokens = Tokens(figures, store)
        dlm = make_dlm(nodes5)
        top = max(t for t in (tokens.acquire(dlm, resource) for _ in range(3)) if t)
        for node in nodes5:
            node.restart(keep_data=False)
        rejected = 0
        newcomer = make_dlm(nodes5)
        lock = newcomer.lock(resource, ttl=MAX_TTL)
        figures.attempted += 1
        assert lock.acquire(timeout=5.0)
        figures.succeeded += 1
        token = lock.token
        try:
            store.write(resource, token, b"from a re-initialised cluster")
        except StaleTokenError:
            rejected += 1
        lock.release()
        assert token <= top
        assert rejected == 1
        assert store.highest(resource) == top
        figures.extra.update(token_before=top, token_after_reinit=token,
                             lock_token_regressions=1, fenced_writes_rejected=rejected,
                             note="lock tokens went back after a total wipe seen by a new "
                                  "client; the fenced store rejected the stale writes")


def _seed() -> int:
    explicit = os.environ.get("REDLOCK_FAULT_SEED")
    seed = int(explicit) if explicit else random.SystemRandom().randrange(2**32)
    # Printed first, so that a run that fails anywhere (even inside the library, before
    # the test's own report) can be replayed.
    print(f"[seed] REDLOCK_FAULT_SEED={seed}")
    return seed

