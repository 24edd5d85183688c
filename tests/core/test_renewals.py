"""Auto-extend: the manager's renewal loop (redlock/_core/renewals.py, docs/design.md §5.2) on
scripted nodes: when renewals go out, batched, retried with backoff while validity is
left, when the lock is lost, and acquisitions released meanwhile or abandoned."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import pytest

from redlock import Outcome
from redlock.testing import capture_events
from tests.core.support import held, held_lock
from tests.internals import (
    Broadcast,
    Invoke,
    LockState,
    RedlockCore,
    Renewals,
    Replies,
    Settings,
    Status,
    Wait,
    drive,
    scripts,
)
from tests.scripted import PASS, FakeClock, ScriptedNodes, lock_key, make_core


class Holder:
    """Stands for a lock handle (the renewal loop holds handles weakly)."""


def run_renewals(core: RedlockCore, states: list[LockState], nodes: ScriptedNodes,
                 release_after: int | None = None,
                 holders: list[Holder] | None = None,
                 absorb: Callable[[Replies], None] | None = None) -> list[LockState]:
    """Renew ``states`` with the manager's loop until none is left; the owner releases
    them all at the first sleep after ``release_after`` extend rounds (None: never).
    ``absorb``: what the driver hands each request's replies to (as the transports'
    replies). Returns the states the loop reported lost."""
    loops: list[object] = []
    lost: list[LockState] = []
    renewals = Renewals(core, threading.Event, loops.append,
                        lambda state, handles: lost.append(state))
    kept = holders if holders is not None else [Holder() for _ in states]
    for state, holder in zip(states, kept, strict=True):
        renewals.add(state, holder)

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        extends = nodes.scripts_sent().count("extend")
        if isinstance(request, Wait) and release_after is not None \
                and extends >= release_after:
            for state in states:
                state.mark_released()
        replies = nodes.execute(request)
        return Replies(replies) if absorb and isinstance(request, Broadcast) else replies

    [loop] = loops  # one loop, however many locks
    assert drive(loop, execute, absorb) is None  # type: ignore[arg-type]
    assert len(renewals) == 0
    return lost


def test_renewals_come_at_a_third_of_the_validity_left_until_released() -> None:
    _, nodes, core, state = held_lock(ttl=9.0)
    validity = 9.0 - Settings().drift(9.0)
    assert run_renewals(core, [state], nodes, release_after=3) == []
    assert nodes.sleeps() == pytest.approx([validity / 3] * 4)
    assert nodes.scripts_sent() == ["extend"] * 3
    # Renewed from the third extend's start.
    assert state.deadline == pytest.approx(1000.0 + validity + 9.0 - Settings().drift(9.0))


def test_the_first_renewal_of_a_late_acquire_comes_before_its_validity_runs_out() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock, round_trip=0.2)  # the acquire took 0.2 s
    core = make_core(3, clock)
    state = held(core, nodes, ttl=0.3)
    nodes.round_trip = 0.0  # renewals are quick
    left = state.deadline - clock()
    assert 0 < left < 0.1
    assert run_renewals(core, [state], nodes, release_after=1) == []
    assert nodes.sleeps()[0] == pytest.approx(left / 3)  # not ttl / 3 = 0.1 s: too late
    assert nodes.scripts_sent()[0] == "extend"


def test_renewals_due_together_go_out_in_one_request() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    states = [held(core, nodes, resource=f"r{i}", ttl=9.0) for i in range(3)]
    assert run_renewals(core, states, nodes, release_after=1) == []
    [renewal] = [b for b in nodes.broadcasts() if b.calls[0].script is scripts.EXTEND]
    assert sorted((c.node, c.keys[0]) for c in renewal.calls) == sorted(
        (node, lock_key(f"r{i}")) for node in range(3) for i in range(3))


def test_renewals_retry_with_backoff_while_validity_remains() -> None:
    _, nodes, core, state = held_lock(ttl=9.0, retry_delay_min=0.1, retry_delay_max=0.3)
    validity = 9.0 - Settings().drift(9.0)
    failed_calls = 0

    def unreachable_for_four_rounds(call: object) -> object:
        nonlocal failed_calls
        if getattr(call, "script", None) is scripts.EXTEND and failed_calls < 4 * 3:
            failed_calls += 1
            return TimeoutError("no reply")
        return PASS

    nodes.intercept = unreachable_for_four_rounds
    with capture_events() as events:
        assert run_renewals(core, [state], nodes, release_after=5) == []
    # A third of the validity, then the backoff doubles from retry_delay_min up to
    # retry_delay_max, then a third of the renewed validity.
    assert nodes.sleeps() == pytest.approx([validity / 3, 0.1, 0.2, 0.3, 0.3, validity / 3])
    assert nodes.scripts_sent() == ["extend"] * 5
    # Four failed renewals, logged once per failing node (then counted: _observe/outages.py).
    assert sorted(e["node"] for e in events if e["event"] == "redlock.extend_retry") == [
        "n0:6379", "n1:6379", "n2:6379"]
    assert state.status == Status.RELEASED  # never lost


def test_renewals_retry_when_only_a_minority_refuses() -> None:
    _, nodes, core, state = held_lock(5, ttl=9.0)
    for i in (0, 1):  # two of five refuse (no more than N - quorum): not proof of loss
        del nodes.data[i][lock_key("r")]
    nodes.down = {2}  # and one is silent: two acks, no quorum
    calls = 0

    def node_2_back_after_one_round(call: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 6:
            nodes.down = set()
        return PASS

    nodes.intercept = node_2_back_after_one_round
    assert run_renewals(core, [state], nodes, release_after=2) == []
    assert nodes.scripts_sent() == ["extend", "extend"]
    assert state.status == Status.RELEASED


def test_renewals_declare_the_lock_lost_at_once_when_a_majority_refuses() -> None:
    _, nodes, core, state = held_lock(ttl=9.0)
    for i in (0, 1):
        del nodes.data[i][lock_key("r")]
    assert run_renewals(core, [state], nodes) == [state]
    assert len(nodes.sleeps()) == 1  # no retry: the key is gone
    assert nodes.scripts_sent() == ["extend", "release"]
    assert state.status == Status.LOST
    assert state.lost_reason.startswith("2 of 3 nodes answered that our key is gone")
    assert [r.outcome for r in state.lost_outcomes] == [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.GRANTED]
    assert all(lock_key("r") not in db for db in nodes.data)


def test_renewals_declare_the_lock_lost_when_validity_runs_out() -> None:
    clock, nodes, core, state = held_lock(ttl=0.9, retry_delay_min=0.1, retry_delay_max=0.25)
    deadline = state.deadline
    nodes.down = {0, 1, 2}
    assert run_renewals(core, [state], nodes) == [state]
    sleeps = nodes.sleeps()
    assert sleeps[:4] == pytest.approx([(deadline - 1000.0) / 3, 0.1, 0.2, 0.25])
    assert clock() == pytest.approx(deadline)  # the last wait is cut at the deadline
    assert sum(sleeps) == pytest.approx(deadline - 1000.0)
    assert state.status == Status.LOST
    assert state.lost_reason.startswith("no quorum of the 3 nodes renewed it before its"
                                        " validity ran out")
    assert nodes.scripts_sent()[-1] == "release"
    assert sorted(c.node for c in nodes.broadcasts()[-1].calls) == [0, 1, 2]


def test_a_lock_released_during_a_renewal_is_neither_lost_nor_released_again() -> None:
    _, nodes, core, state = held_lock(ttl=9.0)

    def released_meanwhile(call: object) -> object:
        state.mark_released()  # the owner released while the extend was out
        return 0  # ...so the key is gone everywhere

    nodes.intercept = released_meanwhile
    assert run_renewals(core, [state], nodes) == []
    assert nodes.scripts_sent() == ["extend"]  # the owner's release is the only release
    assert state.status == Status.RELEASED


def test_a_lock_whose_release_is_under_way_is_not_lost_by_a_renewal_in_flight() -> None:
    """The owner's release was sent (release_called) but its replies are not back, so
    the state is still HELD when the renewal's round finds the keys gone: no loss, no
    on_lost (seen on a busy event loop: on_lost for locks being released)."""
    _, nodes, core, state = held_lock(ttl=9.0)

    def release_under_way(call: object) -> object:
        state.release_called = True  # the release went out; its replies are not read yet
        return 0  # ...and it deleted the key everywhere first

    nodes.intercept = release_under_way
    assert run_renewals(core, [state], nodes) == []
    assert nodes.scripts_sent() == ["extend"]
    assert state.status == Status.HELD  # the release flow marks it released


def test_an_acquisition_whose_handles_were_collected_is_released_not_renewed() -> None:
    _, nodes, core, state = held_lock(ttl=9.0)
    holders = [Holder()]
    loops: list[object] = []
    renewals = Renewals(core, threading.Event, loops.append, lambda *_: None)
    renewals.add(state, holders[0])
    del holders[0]
    gc.collect()
    with capture_events() as events:
        drive(loops[0], nodes.execute)  # type: ignore[arg-type]
    assert nodes.scripts_sent() == ["release"]
    assert all(lock_key("r") not in db for db in nodes.data)
    assert state.status == Status.RELEASED
    assert "redlock.abandoned" in [e["event"] for e in events]


def test_an_extend_round_ends_by_half_the_validity_left_of_the_others_waiting() -> None:
    # The renewal loop renews every lock of the manager: while one round waits (up to
    # half the validity its own locks have left), the others' rounds wait for it.
    clock, nodes, core, state = held_lock(ttl=10.0, node_timeout=0.05)
    for until in (None, clock() + 0.8, clock() - 1.0):
        assert drive(core.holding.extend_many([(state, 10.0)], until=until),
                     nodes.execute) == [None]
    alone, beside, behind = [b.timeout for b in nodes.broadcasts()]
    assert alone > 4.0  # half its own validity left
    assert beside == pytest.approx(0.4)  # half what the other has left
    assert behind == pytest.approx(0.05)  # the other ran out already: a request timeout


def test_a_reply_the_core_cannot_take_in_is_a_crash_the_holders_hear_of() -> None:
    """What a request brought back is handed to the core (``absorb``: round trips,
    server identities, a newer membership) before the flow goes on. Should that raise,
    the exception went out of the driver, past the loop's own handler: the renewal
    thread died without a word, and its holders went on believing they held locks that
    nobody renewed any more. It is thrown into the flow, whose handler decides."""
    _, nodes, core, state = held_lock(ttl=9.0)

    def absorb(replies: Replies) -> None:
        raise ValueError("a reply the core cannot take in")

    with capture_events() as events:
        assert run_renewals(core, [state], nodes, absorb=absorb) == [state]
    assert state.status is Status.LOST
    assert [e["event"] for e in events if e["event"].endswith("crashed")] == \
        ["redlock.renewals_crashed"]
