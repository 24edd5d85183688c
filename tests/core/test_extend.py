"""Extend (``RedlockCore.extend`` and ``extend_or_lose``, docs/design.md §5.1) on scripted
nodes: what counts as renewed and from when, the bound of the validity left, what a
failed extend loses and releases, replies not read, and locks that need no request."""

from __future__ import annotations

import pytest

from redlock import LockLost, Outcome
from tests.core.support import held, held_lock
from tests.internals import (
    KEYS,
    PENDING,
    Settings,
    Status,
    drive,
    scripts,
)
from tests.scripted import PASS, FakeClock, ScriptedNodes, lock_key, make_core


def test_extend_with_a_quorum_of_acks_renews_from_the_start_of_the_extend() -> None:
    clock, nodes, core, state = held_lock()
    clock.advance(4.0)
    del nodes.data[2][lock_key("r")]  # one node lost our key: two acks are a quorum
    nodes.round_trip = 0.5
    started, deadline = clock(), state.deadline
    assert drive(core.holding.extend(state, 20.0), nodes.execute) is None
    [request] = nodes.broadcasts()
    assert [(c.node, c.script, c.keys, c.args) for c in request.calls] == [
        (i, scripts.EXTEND, (lock_key("r"), KEYS.horizon, KEYS.members), (state.value, 20_000, 0))
        for i in range(3)]  # the membership key and epoch last (docs/design.md §13.1)
    # Adaptive (no round trip measured yet: the ceiling), or half the validity left if
    # that is longer: an answer is in time as long as the lock is valid.
    assert request.timeout == pytest.approx(max(core.timeout(20.0), (deadline - started) / 2))
    # Measured from when the extend was sent, not from when the acks came back.
    assert state.deadline == pytest.approx(started + 20.0 - Settings().drift(20.0))
    assert state.ttl == 20.0 and state.status == Status.HELD
    assert [nodes.ttl_ms[i][lock_key("r")] for i in (0, 1)] == [20_000, 20_000]


def test_extend_without_a_quorum_of_acks_changes_nothing_and_reports_why() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    state = held(core, nodes)
    deadline = state.deadline
    del nodes.data[0][lock_key("r")]
    nodes.down = {1}
    failure = drive(core.holding.extend(state, 10.0), nodes.execute)
    assert failure is not None
    assert [r.outcome for r in failure] == [Outcome.REFUSED, Outcome.ERROR, Outcome.GRANTED]
    assert "our key is gone" in failure[0].detail
    # One extend round decides nothing about loss: its callers do.
    assert (state.deadline, state.status) == (deadline, Status.HELD)


def test_extend_is_bounded_by_the_validity_left_and_late_acks_do_not_count() -> None:
    clock, nodes, core, state = held_lock()
    deadline = state.deadline
    clock.advance(deadline - clock() - 0.01)  # 10 ms of validity left
    nodes.round_trip = 0.02  # every node acks, 20 ms later: past the deadline
    failure = drive(core.holding.extend(state, 10.0), nodes.execute)
    [request] = nodes.broadcasts()
    assert request.timeout == pytest.approx(0.01)  # not the 50 ms node timeout
    assert failure is not None
    assert [r.outcome for r in failure] == [Outcome.GRANTED] * 3
    assert state.deadline == deadline


def test_extend_of_an_expired_or_released_lock_sends_nothing() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    expired = held(core, nodes, "a")
    released = held(core, nodes, "b")
    drive(core.holding.release(released), nodes.execute)
    clock.advance(10.0)
    for state in (expired, released):
        with pytest.raises(StopIteration) as finished:  # returns before its first request
            next(core.holding.extend(state, 10.0))
        assert finished.value.value == ()


def test_drive_returns_the_value_of_a_protocol_that_needs_no_request() -> None:
    clock, nodes, core, state = held_lock()
    clock.advance(10.0)
    assert drive(core.holding.extend(state, 10.0), nodes.execute) == ()


def test_explicit_extend_that_fails_loses_the_lock_releases_everywhere_and_raises() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    state = held(core, nodes)
    assert drive(core.holding.extend_or_lose(state, 5.0), nodes.execute) is None  # success
    assert nodes.scripts_sent() == ["extend"]
    nodes.requests.clear()
    for i in (0, 1):
        del nodes.data[i][lock_key("r")]
    gone = "2 of 3 nodes answered that our key is gone"
    with pytest.raises(LockLost, match=gone) as caught:
        drive(core.holding.extend_or_lose(state, 5.0), nodes.execute)
    assert [r.outcome for r in caught.value.outcomes] == [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.GRANTED]
    assert state.status == Status.LOST
    assert nodes.scripts_sent() == ["extend", "release"]
    assert sorted(c.node for c in nodes.broadcasts()[-1].calls) == [0, 1, 2]
    assert all(lock_key("r") not in db for db in nodes.data)  # what was left is dropped
    # Lost stays lost: the next explicit extend raises at once, without I/O.
    nodes.requests.clear()
    with pytest.raises(LockLost, match=gone):
        drive(core.holding.extend_or_lose(state, 5.0), nodes.execute)
    assert nodes.requests == []


def test_explicit_extend_retries_through_a_stall_while_validity_is_left() -> None:
    """Nodes that do not answer in time say nothing about our key: the extend tries again
    (backing off) while validity is left, and a lock whose nodes answer again is kept,
    keys and all. Before, one timed-out round marked the lock lost and deleted its keys
    everywhere, with 9 s of validity left (nodes ~2 ms away, stalled 0.3 s once)."""
    _, nodes, core, state = held_lock(ttl=10.0)
    nodes.down = {0, 1, 2}
    rounds = 0

    def stall_for_two_rounds(call: object) -> object:
        nonlocal rounds
        if getattr(call, "node", None) == 0 and getattr(call, "script", None) is scripts.EXTEND:
            rounds += 1
            if rounds == 3:
                nodes.down = set()
        return PASS

    nodes.intercept = stall_for_two_rounds
    assert drive(core.holding.extend_or_lose(state, 10.0), nodes.execute) is None
    assert nodes.scripts_sent() == ["extend"] * 3  # two timed out, the third acked
    assert len(nodes.sleeps()) == 2  # the backoff between them
    assert state.status == Status.HELD
    assert all(lock_key("r") in db for db in nodes.data)  # never released


def test_explicit_extend_gives_up_when_the_validity_runs_out() -> None:
    clock, nodes, core, state = held_lock(ttl=0.9, retry_delay_min=0.1, retry_delay_max=0.25)
    nodes.down = {0, 1, 2}
    with pytest.raises(LockLost, match="no quorum of the 3 nodes renewed it"):
        drive(core.holding.extend_or_lose(state, 5.0), nodes.execute)
    assert state.status == Status.LOST
    assert clock() >= state.deadline


def test_replies_not_read_never_count_as_our_key_gone() -> None:
    """A reply the transport never read (PENDING) is an error, not a refusal: neither an
    extend nor the renewal loop may decide that a majority lost our key from it."""
    _, nodes, core, state = held_lock(ttl=9.0)
    nodes.intercept = lambda call: PENDING if getattr(call, "node", None) in (0, 1) else PASS
    failure = drive(core.holding.extend(state, 9.0), nodes.execute)
    assert failure is not None
    assert [r.outcome for r in failure] == [Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]
    assert not core.holding.key_gone(failure)


def test_explicit_extend_of_an_expired_lock_raises_without_io() -> None:
    clock, nodes, core, state = held_lock()
    clock.advance(10.0)
    with pytest.raises(LockLost, match="expired"):
        drive(core.holding.extend_or_lose(state, 10.0), nodes.execute)
    assert nodes.requests == []
