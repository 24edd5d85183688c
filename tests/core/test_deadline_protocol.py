"""The acquire flow keeps the caller's deadline (``RedlockCore.acquire``, docs/design.md
§2.5) on scripted nodes: every round and wait is cut to what is left of it (a single
try: one request ceiling), a round at the deadline still gets LAST_ROUND, nothing starts
again past it (a new cluster's re-asks and retry, the second look at a node without
its marker), the first attempt's INFO takes no round of its own, and a first attempt
learns its timeout from its own replies.

The rounds here take their whole timeout whenever a node does not answer, as a hung
node makes them on real servers (tests/faults/test_deadlines.py has those)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.internals import (
    LAST_ROUND,
    Broadcast,
    Call,
    Invoke,
    RedlockCore,
    Settings,
    Wait,
    drive,
    node_scripts,
    real_environment,
)
from tests.scripted import MARKER, PASS, FakeClock, ScriptedNodes, make_core

Executor = Callable[[Broadcast | Wait | Invoke], list[object]]


def hanging(nodes: ScriptedNodes) -> Executor:
    """The nodes' executor, where a broadcast with a call left unanswered (a node down,
    or an intercepted TimeoutError) takes its whole timeout."""
    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        replies = nodes.execute(request)
        if isinstance(request, Broadcast) and any(
                "no reply" in str(r) for r in replies if isinstance(r, Exception)):
            nodes.clock.advance(request.timeout)
        return replies
    return execute


@pytest.mark.parametrize("mode", ["try", "timeout=1.0"])
def test_a_hung_majority_costs_the_deadline_and_no_more(mode: str) -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(5, down={0, 2, 3}, clock=clock)
    core = make_core(5, clock)  # ttl 5: a ceiling of 1 s, as a try's deadline
    started = clock()
    blocking, timeout = (False, None) if mode == "try" else (True, 1.0)
    result = drive(core.acquire("r", 5.0, blocking=blocking, timeout=timeout),
                   hanging(nodes))
    assert result.state is None and result.unavailable
    # The acquire round took the whole second; the release (and, queued, leaving the
    # line) only LAST_ROUND each.
    rounds = nodes.broadcasts()
    assert rounds[0].timeout == 1.0
    assert all(r.timeout == LAST_ROUND for r in rounds[1:])
    assert clock() - started <= 1.0 + 2 * LAST_ROUND + 1e-9


def test_a_new_managers_first_attempt_carries_info_and_learns_its_timeout() -> None:
    nodes = ScriptedNodes(3)
    core = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(),
                       real_environment(FakeClock()))
    result = drive(core.acquire("r", 5.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    first = nodes.broadcasts()[0]
    assert len(first.calls) == 6  # ACQUIRE, then INFO, on each node: one round
    assert first.learn == 2  # round trips unknown: a quorum's replies set the timeout
    for node in range(3):
        core.round_trips.sample_many({node: 0.001})
    drive(core.holding.release(result.state), nodes.execute)
    drive(core.acquire("s", 5.0, blocking=False, timeout=None), nodes.execute)
    assert nodes.broadcasts()[-1].learn == 0  # known now: the adaptive timeout

    with_timeout = RedlockCore(["n0:6379", "n1:6379", "n2:6379"], Settings(node_timeout=0.2),
                               real_environment(FakeClock()))
    with_timeout.amnesia.health.inspected = True
    drive(with_timeout.acquire("t", 5.0, blocking=False, timeout=None), nodes.execute)
    assert nodes.broadcasts()[-1].learn == 0  # node_timeout: as given


def test_a_new_cluster_is_not_asked_again_past_the_deadline() -> None:
    """Every node answered the acquire (no marker anywhere: a new cluster), but node 4
    does not answer INIT_MARKER: it used to be asked three more times, a whole request
    timeout each, and the attempt retried after that. Past the try's deadline neither
    happens; the next attempt finds node 4 unmarked beside marked ones and looks again."""
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    for db in nodes.data:
        db.clear()

    def init_marker_lost_on_4(call: Call) -> object:
        if call.node == 4 and call.script is node_scripts.INIT_MARKER:
            return TimeoutError("no reply")
        return PASS

    nodes.intercept = init_marker_lost_on_4
    core = make_core(5, clock)
    started = clock()
    result = drive(core.acquire("r", 5.0, blocking=False, timeout=None), hanging(nodes))
    assert nodes.commands_sent() == ["acquire", "init_marker", "release"]
    assert clock() - started <= 1.0 + LAST_ROUND + 1e-9
    assert result.state is None and not result.unavailable
    assert result.reason == "cluster initialised; no time was left to try again"
    assert [MARKER in db for db in nodes.data] == [True, True, True, True, False]


def test_the_second_look_at_a_missing_marker_is_skipped_past_the_deadline() -> None:
    """Node 0 answers without its marker, beside marked nodes; nodes 3 and 4 hang, so the
    acquire round takes the try's whole second. No time is left to wait and probe node 0:
    it is neither benched nor counted, and the attempt ends within the deadline."""
    clock = FakeClock()
    nodes = ScriptedNodes(5, down={3, 4}, clock=clock)
    del nodes.data[0][MARKER]
    core = make_core(5, clock)
    started = clock()
    result = drive(core.acquire("r", 5.0, blocking=False, timeout=None), hanging(nodes))
    assert result.state is None and result.unavailable
    assert nodes.commands_sent() == ["acquire", "release"]  # no Pause, no EXISTS
    assert core.amnesia.health.benched() == set()
    assert clock() - started <= 1.0 + LAST_ROUND + 1e-9

    # With time left (a warm manager's 50 ms rounds), the second look happens.
    fast = ScriptedNodes(5, clock=clock)
    del fast.data[0][MARKER]
    core = make_core(5, clock, node_timeout=0.05)
    drive(core.acquire("r", 5.0, blocking=False, timeout=None), hanging(fast))
    assert fast.commands_sent() == ["acquire", "EXISTS"]
    assert core.amnesia.health.benched() == {0}
