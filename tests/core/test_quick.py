"""The quick lane in the core (docs/design.md §2.6) on scripted nodes: when a call may be
opened for it, what its clean grant holds, and that the flow, given the quick attempt's
request and what it came to, goes on from there (no second first attempt) with the
flow's own outcome: a refusal, counters written back, an interruption cleaned up."""

from __future__ import annotations

import pytest

from tests.internals import MUTEX, Opening, RedlockCore, Replies, attempt_owner, drive, scripts
from tests.scripted import FakeClock, ScriptedNodes, lock_key, make_core


def warm(n: int = 3, **settings: object) -> tuple[ScriptedNodes, RedlockCore]:
    """A core that has seen its nodes (a marker, round trips) through one flow."""
    nodes = ScriptedNodes(n, clock=FakeClock())
    core = make_core(n, nodes.clock, node_timeout=0.05, **settings)
    result = drive(core.acquire("warm", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    drive(core.release(result.state), nodes.execute)
    nodes.requests.clear()
    return nodes, core


def sent_quickly(core: RedlockCore, nodes: ScriptedNodes, *, blocking: bool = False) -> Opening:
    """A call opened for the quick lane, its request run on the nodes (and absorbed)."""
    opening = core.open_quickly("r", 10.0, blocking=blocking, timeout=None, kind=MUTEX)
    assert opening is not None and opening.sent is not None
    replies = Replies(nodes.execute(opening.sent.request))
    core.absorb(replies)
    opening.sent.outcome = replies
    return opening


def test_a_new_core_takes_the_flow_until_it_has_seen_its_nodes() -> None:
    nodes = ScriptedNodes(3, clock=FakeClock())
    core = make_core(3, nodes.clock)
    assert core.open_quickly("r", 10.0, blocking=False, timeout=None, kind=MUTEX) is None
    core.amnesia.health.marker_seen = True
    # No round trips measured yet and no node_timeout: the flow learns its timeout.
    assert core.open_quickly("r", 10.0, blocking=False, timeout=None, kind=MUTEX) is None


def test_a_clean_grant_holds_what_the_flow_would_hold() -> None:
    nodes, core = warm()
    for node in range(3):
        nodes.set_counter(node, 41)
    opening = sent_quickly(core, nodes)
    state = core.clean_grant(opening, 10.0)
    assert state is not None and state.token == 42
    assert state.owner == attempt_owner(opening.owner, 1)
    assert [nodes.data[i].get(lock_key("r")) for i in range(3)] == [state.owner] * 3
    assert nodes.scripts_sent() == ["acquire"]
    assert 9.8 < state.validity() <= 10.0


def test_refused_replies_go_on_in_the_flow_without_a_second_attempt() -> None:
    nodes, core = warm()
    for node in range(3):
        nodes.data[node][lock_key("r")] = "someone else"
    opening = sent_quickly(core, nodes)
    assert core.clean_grant(opening, 10.0) is None
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None,
                                opening=opening), nodes.execute)
    assert result.state is None and result.attempts == 1 and not result.unavailable
    # Refused everywhere: nothing of ours to release, and no attempt of the flow's own.
    assert nodes.scripts_sent() == ["acquire"]


def test_counters_to_write_back_are_written_back_by_the_flow() -> None:
    nodes, core = warm()
    nodes.set_counter(0, 50)
    opening = sent_quickly(core, nodes)
    assert core.clean_grant(opening, 10.0) is None
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None,
                                opening=opening), nodes.execute)
    assert result.state is not None and result.state.token == 51
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    assert [nodes.counter(i) for i in range(3)] == [51, 51, 51]


@pytest.mark.parametrize("blocking", [False, True])
def test_an_interrupted_quick_send_is_cleaned_up_by_the_flow(blocking: bool) -> None:
    """The acquire ran on the nodes, then the caller was interrupted (KeyboardInterrupt,
    cancellation): the flow releases where the key may be, and leaves the line."""
    nodes, core = warm()
    opening = sent_quickly(core, nodes, blocking=blocking)
    assert opening.sent is not None
    opening.sent.outcome = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        drive(core.acquire("r", 10.0, blocking=blocking, timeout=None,
                           opening=opening), nodes.execute)
    assert nodes.scripts_sent() == ["acquire", "release"]
    release = nodes.broadcasts()[-1]
    assert release.calls[0].script is scripts.RELEASE
    assert release.calls[0].args[1] == "1"  # the call is over: its line entries go too
    assert [nodes.data[i].get(lock_key("r")) for i in range(3)] == [None] * 3
