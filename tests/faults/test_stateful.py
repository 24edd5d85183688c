"""Scenario 8: randomised schedules, a Hypothesis state machine on real nodes (N = 5).

Two clients (separate ``Redlock`` instances) acquire, extend, release and write to a
fenced store (its own healthy node) while Hypothesis pauses (SIGSTOP) and resumes
nodes and kill -9 restarts nodes empty (amnesia), keeping the faulted nodes a
minority, and lets time pass so TTLs run out and amnesiac nodes rejoin. Clients also
write with tokens they no longer hold (stale writers).

The history checker is the invariant, after every step:

* no two committed acquisitions share a token, and an acquisition invoked after
  another completed has a larger token (tokens never go backwards, amnesia included);
* accepted fenced writes never go backwards;
* no two hold intervals overlap (nodes are paused, never clients; clocks are normal).

Bounded: ``max_examples`` 15, ``stateful_step_count`` 25, no deadline; the whole test
takes about a minute at most. Rerun:
``.venv/bin/python -m pytest tests/faults/test_stateful.py -v -s``
(``REDLOCK_STATEFUL_EXAMPLES=<n>`` runs more examples, e.g. for a soak run).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fencing import RedisFencedStore
from redlock import Lock, LockLost, NotHeld
from redlock.testing import RedisNodes
from redlock.testing.history import ACCEPTED, ERROR, REJECTED, History, Hold, Write
from tests.faults.conftest import DLM_OPTIONS, MakeDlm, acquire_or_false, fenced_write
from tests.faults.fault_figures import scenario
from tests.internals import KEYS

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

RESOURCE = "stateful:r"
TTL = 1.0
CLIENTS = ("a", "b")
EXAMPLES = int(os.environ.get("REDLOCK_STATEFUL_EXAMPLES", "15"))
STEPS = 25
# Rules have no preconditions and draw values of one fixed shape: which rules can act
# depends on timing (an acquire may fail, a node rejoins once repaired), and Hypothesis
# requires the same draws to enable the same rules (else FlakyStrategyDefinition). A
# rule that cannot act now does nothing; ``pick`` chooses among what it can act on.
PICK = st.integers(min_value=0, max_value=4)


def _pick(options: list[Any], pick: int) -> Any:
    return options[pick % len(options)]


@pytest.fixture
def dlm_options() -> dict[str, Any]:
    # Nodes are paused for whole steps and locks live TTL = 1 s: each attempt waits a
    # node timeout for a paused node, which must leave most of the TTL as validity. The
    # clients' max_ttl is the TTL, so an amnesiac node rejoins within a few steps.
    return {**DLM_OPTIONS, "node_timeout": 0.1, "max_ttl": TTL}


class Totals:
    """Figures summed over every example of the run."""

    def __init__(self) -> None:
        self.examples = 0
        self.steps = 0
        self.attempted = 0
        self.succeeded = 0
        self.failed_cleanly = 0
        self.lost = 0
        self.violations: list[str] = []
        self.overlaps = 0
        self.writes = {ACCEPTED: 0, REJECTED: 0, ERROR: 0}
        self.pauses = 0
        self.restarts = 0
        self.rejoins: list[float] = []


class LockMachine(RuleBasedStateMachine):
    """One example: fresh (flushed) nodes, two fresh clients, a fresh fenced resource."""

    nodes: RedisNodes
    store_client: redis.Redis
    totals: Totals
    make_dlm: MakeDlm

    def __init__(self) -> None:
        super().__init__()
        self.nodes.reset()  # all running, none paused, all empty
        self.totals.examples += 1
        self.store = RedisFencedStore(self.store_client,
                                      namespace=f"stateful-{secrets.token_hex(4)}")
        self.dlms = {name: self.make_dlm(self.nodes) for name in CLIENTS}
        self.history = History()
        # client -> (lock, acquire invoked, acquire completed, token, validity deadline)
        self.held: dict[str, tuple[Lock, float, float, int, float]] = {}
        self.last_token: dict[str, int] = {}
        self.paused: set[int] = set()
        self.restarted: dict[int, float] = {}  # node -> when it was restarted empty

    # -- helpers ---------------------------------------------------------------

    def _out(self) -> set[int]:
        """Nodes that cannot count for a quorum now: paused, or empty and not rejoined."""
        for node in list(self.restarted):
            if node not in self.paused and self._has_marker(node):
                self.totals.rejoins.append(time.monotonic() - self.restarted.pop(node))
        return self.paused | set(self.restarted)

    def _has_marker(self, node: int) -> bool:
        with self.nodes[node].client() as client:
            return bool(client.exists(KEYS.marker))

    def _end_hold(self, name: str, when: float) -> None:
        _, invoked, start, token, deadline = self.held.pop(name)
        self.history.held(Hold(name, RESOURCE, token, start, min(when, deadline), invoked))

    # -- lock operations -------------------------------------------------------

    # One acquire rule per client (more acquisitions per step than one shared rule);
    # every rule picks among the clients or nodes it can act on (see PICK).

    @rule()
    def acquire_a(self) -> None:
        self._acquire("a")

    @rule()
    def acquire_b(self) -> None:
        self._acquire("b")

    def _acquire(self, name: str) -> None:
        if name in self.held:
            return
        self.totals.attempted += 1
        lock = self.dlms[name].lock(RESOURCE, ttl=TTL)
        invoked = time.monotonic()
        if not acquire_or_false(lock, timeout=1.0):
            self.totals.failed_cleanly += 1
            return
        start = time.monotonic()
        self.totals.succeeded += 1
        token = lock.token
        self.held[name] = (lock, invoked, start, token, time.monotonic() + lock.validity)
        self.last_token[name] = token
        self.write(name)  # the protected work; later writes may come from a stale holder

    @rule(pick=PICK)
    def release(self, pick: int) -> None:
        if not self.held:
            return
        name = _pick(sorted(self.held), pick)
        lock = self.held[name][0]
        self._end_hold(name, time.monotonic())
        # LockLost: the hold ran past its validity, or the lock was taken meanwhile.
        with contextlib.suppress(NotHeld, LockLost):
            lock.release()

    @rule(pick=PICK)
    def extend(self, pick: int) -> None:
        if not self.held:
            return
        name = _pick(sorted(self.held), pick)
        lock, invoked, start, token, _ = self.held[name]
        began = time.monotonic()
        try:
            lock.extend()
        except LockLost:
            self.totals.lost += 1
            self._end_hold(name, began)
            return
        self.held[name] = (lock, invoked, start, token, time.monotonic() + lock.validity)

    @rule(pick=PICK)
    def write_again(self, pick: int) -> None:
        if self.last_token:
            self.write(_pick(sorted(self.last_token), pick))

    def write(self, name: str) -> None:
        """Write with the client's latest token, held or not (a stale writer)."""
        token = self.last_token.get(name)
        if token is None:
            return
        invoke = time.monotonic()
        outcome = fenced_write(self.store, name, RESOURCE, token)
        self.totals.writes[outcome] += 1
        self.history.wrote(Write(name, RESOURCE, token, invoke, time.monotonic(),
                                       outcome))

    # -- faults ----------------------------------------------------------------

    @rule(pick=PICK)
    def pause(self, pick: int) -> None:
        out = self._out()
        if len(out) >= 2:
            return
        node = _pick(sorted(set(range(5)) - out), pick)
        self.nodes[node].pause()
        self.paused.add(node)
        self.totals.pauses += 1

    @rule(pick=PICK)
    def resume(self, pick: int) -> None:
        if not self.paused:
            return
        node = _pick(sorted(self.paused), pick)
        self.nodes[node].resume()
        self.paused.discard(node)
        with self.nodes[node].client() as client:
            client.ping()  # commands queued while stopped have run

    @rule(pick=PICK)
    def restart_empty(self, pick: int) -> None:
        """kill -9 and restart without data (a node not rejoined yet may be hit again):
        only while that keeps the faulted nodes a minority (at most two of five out)."""
        if len(self._out()) >= 2:
            return
        node = _pick(sorted(set(range(5)) - self.paused), pick)
        self.nodes[node].restart(keep_data=False)
        self.restarted[node] = time.monotonic()
        self.totals.restarts += 1

    @rule(seconds=st.sampled_from([0.1, 0.4, 1.1]))
    def wait(self, seconds: float) -> None:
        """Let time pass: TTLs run out, amnesiac nodes become due to rejoin."""
        time.sleep(seconds)

    # -- the checker -------------------------------------------------------------

    @invariant()
    def history_is_safe(self) -> None:
        self.totals.steps += 1
        # Holds still open count up to now (or their validity deadline).
        now = time.monotonic()
        snapshot = History()
        snapshot.writes = list(self.history.writes)
        snapshot.holds = list(self.history.holds) + [
            Hold(name, RESOURCE, token, start, min(now, deadline), invoked)
            for name, (_, invoked, start, token, deadline) in self.held.items()]
        problems = snapshot.violations(exclusive=True)
        if problems:
            self.totals.violations += problems
        assert not problems, problems

    def teardown(self) -> None:
        for node in self.paused:
            self.nodes[node].resume()
        now = time.monotonic()
        for name in list(self.held):
            lock = self.held[name][0]
            self._end_hold(name, now)
            with contextlib.suppress(NotHeld, LockLost):
                lock.release()
        for dlm in self.dlms.values():
            dlm.close()
        self.totals.overlaps += len(self.history.overlaps())


def test_randomised_fault_schedules_keep_the_history_safe(
    nodes5: RedisNodes, store_client: redis.Redis, make_dlm: MakeDlm,
) -> None:
    totals = Totals()
    machine = type("Machine", (LockMachine,), {
        "nodes": nodes5, "store_client": store_client, "totals": totals,
        "make_dlm": staticmethod(make_dlm)})
    with scenario("randomised-stateful") as figures:
        try:
            run_state_machine_as_test(machine, settings=settings(
                max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                database=None, print_blob=True,
                suppress_health_check=list(HealthCheck)))
        finally:
            figures.attempted, figures.succeeded = totals.attempted, totals.succeeded
            figures.failed_cleanly = totals.failed_cleanly
            figures.violations = len(totals.violations)
            figures.recovery_s = max(totals.rejoins) if totals.rejoins else None
            figures.extra.update(
                examples=totals.examples, steps=totals.steps, lost_on_extend=totals.lost,
                overlaps=totals.overlaps, pauses=totals.pauses, restarts=totals.restarts,
                rejoins=len(totals.rejoins), writes_accepted=totals.writes[ACCEPTED],
                writes_rejected=totals.writes[REJECTED], writes_error=totals.writes[ERROR])
    assert not totals.violations, totals.violations
