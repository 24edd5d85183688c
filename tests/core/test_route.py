"""One route per acquisition (docs/design.md §2.6), in the core on scripted nodes: a new
core and a core that knows its nodes take the same flow; the usual replies (every node
granted, nothing to write back) make the lock in one request, and every other reply is
judged on the same route with its own outcome: a refusal, counters written back, an
interruption cleaned up, a restarted node's grant not counted."""

from __future__ import annotations

import pytest

from tests.internals import (
    MUTEX,
    Broadcast,
    Invoke,
    RedlockCore,
    Wait,
    drive,
    lock_value,
    scripts,
)
from tests.scripted import FakeClock, ScriptedNodes, lock_key, make_core


def core_and_nodes(n: int = 3, **settings: object) -> tuple[ScriptedNodes, RedlockCore]:
    nodes = ScriptedNodes(n, clock=FakeClock())
    return nodes, make_core(n, nodes.clock, node_timeout=0.05, **settings)


def test_a_new_core_takes_the_same_route_as_one_that_knows_its_nodes() -> None:
    """Its first attempt also reads the nodes' configuration (INFO behind the acquire
    calls, the same round) and learns its timeout from the replies; the next one sends
    the acquire alone. Both are one request, both hold the lock."""
    nodes = ScriptedNodes(3, clock=FakeClock())
    core = make_core(3, nodes.clock)
    core.amnesia.health.inspected = False  # (make_core spares tests this round)
    first = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert first.state is not None and first.attempts == 1
    [request] = nodes.broadcasts()
    assert [c.args[0] for c in request.calls[3:]] == ["INFO"] * 3
    assert request.learn == core.quorum and request.packed is None
    drive(core.holding.release(first.state), nodes.execute)
    nodes.requests.clear()
    second = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert second.state is not None and second.state.token == first.state.token + 1
    [request] = nodes.broadcasts()
    assert len(request.calls) == 3 and request.packed is not None


def test_the_usual_replies_hold_the_lock_in_one_request() -> None:
    nodes, core = core_and_nodes()
    for node in range(3):
        nodes.set_counter(node, 41)
    result = drive(core.acquire("r", 10.0, blocking=True, timeout=None), nodes.execute)
    state = result.state
    assert state is not None and state.token == 42 and result.attempts == 1
    assert state.value == lock_value(state.value[:32], 1)  # the first attempt's value
    assert [nodes.data[i].get(lock_key("r")) for i in range(3)] == [state.value] * 3
    assert nodes.scripts_sent() == ["acquire"]
    assert 9.8 < state.validity() <= 10.0


def test_refused_replies_are_judged_on_the_same_route() -> None:
    nodes, core = core_and_nodes()
    for node in range(3):
        nodes.data[node][lock_key("r")] = "someone else"
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is None and result.attempts == 1 and not result.unavailable
    # Refused everywhere: nothing of ours to release.
    assert nodes.scripts_sent() == ["acquire"]


def test_counters_that_differ_are_written_back() -> None:
    nodes, core = core_and_nodes()
    nodes.set_counter(0, 50)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 51
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    assert [nodes.counter(i) for i in range(3)] == [51, 51, 51]


def test_a_restarted_nodes_grant_is_not_counted() -> None:
    """A node whose new connection met another server run (docs/design.md §4.4) grants
    like the others, but its grant is not counted until it is judged: with 2 of 3 nodes
    counted the lock is held, and not by the usual one-pass decision."""
    nodes, core = core_and_nodes()
    nodes.attach(core)
    warm = drive(core.acquire("w", 10.0, blocking=False, timeout=None), nodes.execute)
    assert warm.state is not None
    drive(core.holding.release(warm.state), nodes.execute)
    nodes.restart(1, keep_data=True, durable=False)
    nodes.new_connections.add(1)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    assert [r.outcome.value for r in result.outcomes] == ["granted", "amnesiac", "granted"]


@pytest.mark.parametrize("blocking", [False, True])
def test_an_interrupted_attempt_is_cleaned_up(blocking: bool) -> None:
    """The acquire ran on the nodes, then the caller was interrupted (KeyboardInterrupt,
    cancellation) before its replies were taken: the flow releases where the key may
    be, and leaves the line."""
    nodes, core = core_and_nodes()

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        replies = nodes.execute(request)
        if isinstance(request, Broadcast) and request.calls[0].script is scripts.ACQUIRE:
            raise KeyboardInterrupt
        return replies

    with pytest.raises(KeyboardInterrupt):
        drive(core.acquire("r", 10.0, blocking=blocking, timeout=None, kind=MUTEX), execute)
    assert nodes.scripts_sent() == ["acquire", "release"]
    release = nodes.broadcasts()[-1]
    assert release.calls[0].script is scripts.RELEASE
    assert release.calls[0].args[1] == "1"  # the call is over: its line entries go too
    assert [nodes.data[i].get(lock_key("r")) for i in range(3)] == [None] * 3
