"""The protocols of the sans-IO core on scripted nodes (tests/scripted.py): acquire and
release, extend, the auto-extend watchdog, amnesia on the acquire path (a new cluster, a
node that lost its data, a restarted node), the background maintenance (judging
restarted nodes, amnesia episodes, repair) and the admin steps repair() and initialise().

Each protocol is a generator that yields requests and receives the nodes' replies;
these tests play the replies (and move a fake clock) and check the decisions: which
requests go where, what counts as success, what is lost, what is repaired.
"""

from __future__ import annotations

import gc
import threading

import pytest

from redlock import ClusterAmnesiaError, LockLost, Outcome
from redlock.testing import capture_events
from tests.internals import (
    PENDING,
    Broadcast,
    Call,
    Invoke,
    LockState,
    RedlockCore,
    Renewals,
    Settings,
    Status,
    Wait,
    drive,
    maintenance,
    node_scripts,
    open_episodes,
    read_counters,
    real_environment,
    repair_node,
    scripts,
)
from tests.scripted import (
    EPISODE,
    GUARD,
    MARKER,
    PASS,
    FakeClock,
    ScriptedNodes,
    fence_key,
    lock_key,
    make_core,
)

# ---------------------------------------------------------------------------
# acquire / release
# ---------------------------------------------------------------------------


def test_first_acquire_inspects_every_node_once_then_never_again() -> None:
    nodes = ScriptedNodes(3)
    nodes.replicas = {1}
    core = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(),
                       real_environment(FakeClock()))
    with capture_events() as events:
        for _ in range(2):
            result = drive(core.acquire("r", 10.0, blocking=False, timeout=None),
                                       nodes.execute)
            assert result.state is not None
            drive(core.release(result.state), nodes.execute)
    first = nodes.requests[0]
    assert isinstance(first, Broadcast)
    assert [(c.node, c.args) for c in first.calls] == [(i, ("INFO",)) for i in range(3)]
    assert nodes.scripts_sent() == ["acquire", "release", "acquire", "release"]
    warnings = [e for e in events if e["event"] == "redlock.node_unsafe_config"]
    assert [e["node"] for e in warnings] == ["n1:6379"]


def test_acquire_protocol_steady_state_is_one_round_trip() -> None:
    nodes = ScriptedNodes(3, counters=[4, 4, 4])
    result = drive(make_core(3).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 5
    assert nodes.scripts_sent() == ["acquire"]
    broadcast = nodes.requests[0]
    assert isinstance(broadcast, Broadcast)
    assert sorted(c.node for c in broadcast.calls) == [0, 1, 2]  # all nodes at once


def test_acquire_protocol_diverged_counters_write_back_to_lower_nodes_only() -> None:
    nodes = ScriptedNodes(5, counters=[10, 5, 5, 5, 5])
    nodes.data[0]["redlock:{r}:lock"] = "someone else"
    nodes.data[1]["redlock:{r}:lock"] = "someone else"
    result = drive(make_core(5).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 6
    assert nodes.scripts_sent() == ["acquire"]  # all three granting nodes returned 6

    nodes = ScriptedNodes(5, counters=[5, 5, 10, 5, 5])
    nodes.data[0]["redlock:{r}:lock"] = "someone else"
    nodes.data[1]["redlock:{r}:lock"] = "someone else"
    result = drive(make_core(5).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is not None
    assert result.state.token == 11
    assert nodes.scripts_sent() == ["acquire", "write_back"]
    write_back = nodes.requests[1]
    assert isinstance(write_back, Broadcast)
    assert sorted(c.node for c in write_back.calls) == [3, 4]
    assert [nodes.data[i]["redlock:{r}:fence"] for i in range(5)] == [5, 5, 11, 11, 11]


def test_acquire_protocol_failure_releases_on_every_node() -> None:
    nodes = ScriptedNodes(3, down=frozenset({1, 2}))
    result = drive(make_core(3).acquire("r", 10.0, blocking=False, timeout=None),
                               nodes.execute)
    assert result.state is None
    assert result.unavailable
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED, Outcome.ERROR,
                                                     Outcome.ERROR]
    assert nodes.scripts_sent() == ["acquire", "release"]
    release = nodes.requests[-1]
    assert isinstance(release, Broadcast)
    # Released everywhere, including the nodes that did not answer.
    assert sorted(c.node for c in release.calls) == [0, 1, 2]
    assert "redlock:{r}:lock" not in nodes.data[0]


def test_acquire_protocol_never_returns_an_expired_lock() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3)

    def slow(request: Broadcast | Wait | Invoke) -> list[object]:
        clock.advance(10.0)  # the round trip ate the whole ttl
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=False,
                                                           timeout=None), slow)
    assert result.state is None
    assert "validity" in result.reason
    assert all("redlock:{r}:lock" not in db for db in nodes.data)


def test_acquire_protocol_interrupted_after_sending_releases_then_reraises() -> None:
    nodes = ScriptedNodes(3)
    protocol = make_core(3).acquire("r", 10.0, blocking=False, timeout=None)
    first = next(protocol)
    assert isinstance(first, Broadcast)
    nodes.execute(first)  # the SETs happened; the replies never came back
    cleanup = protocol.throw(KeyboardInterrupt())
    assert isinstance(cleanup, Broadcast)
    assert cleanup.calls[0].script is scripts.RELEASE
    assert sorted(c.node for c in cleanup.calls) == [0, 1, 2]
    nodes.execute(cleanup)
    with pytest.raises(KeyboardInterrupt):
        protocol.send([1, 1, 1])
    assert all("redlock:{r}:lock" not in db for db in nodes.data)


def test_acquire_protocol_blocking_backs_off_and_stops_at_the_deadline() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db["redlock:{r}:lock"] = "holder"

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        if isinstance(request, Wait):
            assert request.seconds > 0
            clock.advance(request.seconds)
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=True,
                                                           timeout=1.0), execute)
    assert result.state is None
    assert not result.unavailable  # contention, not an outage
    assert result.attempts > 1
    sleeps = [r for r in nodes.requests if isinstance(r, Wait)]
    assert sleeps and all(s.line == "redlock:{r}:released" for s in sleeps)
    # Between retry_delay_min and retry_delay_max, except the last one cut at the deadline.
    settings = Settings()
    assert all(settings.retry_delay_min <= s.seconds <= settings.retry_delay_max
               for s in sleeps[:-1])
    assert clock() - 1000.0 == pytest.approx(1.0, abs=0.3)  # stopped at the deadline


def held(core: RedlockCore, nodes: ScriptedNodes, resource: str = "r",
         ttl: float = 10.0) -> LockState:
    """A lock acquired on the scripted nodes; the requests log starts empty after it."""
    result = drive(core.acquire(resource, ttl, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None, result.reason
    nodes.requests.clear()
    return result.state


# ---------------------------------------------------------------------------
# extend
# ---------------------------------------------------------------------------


def test_extend_with_a_quorum_of_acks_renews_from_the_start_of_the_extend() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes)
    clock.advance(4.0)
    del nodes.data[2][lock_key("r")]  # one node lost our key: two acks are a quorum
    nodes.round_trip = 0.5
    started, deadline = clock(), state.deadline
    assert drive(core.extend(state, 20.0), nodes.execute) is None
    [request] = nodes.broadcasts()
    assert [(c.node, c.script, c.keys, c.args) for c in request.calls] == [
        (i, scripts.EXTEND, (lock_key("r"),), (state.owner, 20_000)) for i in range(3)]
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
    failure = drive(core.extend(state, 10.0), nodes.execute)
    assert failure is not None
    assert [r.outcome for r in failure] == [Outcome.REFUSED, Outcome.ERROR, Outcome.GRANTED]
    assert "our key is gone" in failure[0].detail
    # One extend round decides nothing about loss: its callers do.
    assert (state.deadline, state.status) == (deadline, Status.HELD)


def test_extend_is_bounded_by_the_validity_left_and_late_acks_do_not_count() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes)
    deadline = state.deadline
    clock.advance(deadline - clock() - 0.01)  # 10 ms of validity left
    nodes.round_trip = 0.02  # every node acks, 20 ms later: past the deadline
    failure = drive(core.extend(state, 10.0), nodes.execute)
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
    drive(core.release(released), nodes.execute)
    clock.advance(10.0)
    for state in (expired, released):
        with pytest.raises(StopIteration) as finished:  # returns before its first request
            next(core.extend(state, 10.0))
        assert finished.value.value == ()


def test_drive_returns_the_value_of_a_protocol_that_needs_no_request() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes)
    clock.advance(10.0)
    assert drive(core.extend(state, 10.0), nodes.execute) == ()


def test_explicit_extend_that_fails_loses_the_lock_releases_everywhere_and_raises() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    state = held(core, nodes)
    assert drive(core.extend_or_lose(state, 5.0), nodes.execute) is None  # success
    assert nodes.scripts_sent() == ["extend"]
    nodes.requests.clear()
    for i in (0, 1):
        del nodes.data[i][lock_key("r")]
    gone = "2 of 3 nodes answered that our key is gone"
    with pytest.raises(LockLost, match=gone) as caught:
        drive(core.extend_or_lose(state, 5.0), nodes.execute)
    assert [r.outcome for r in caught.value.outcomes] == [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.GRANTED]
    assert state.status == Status.LOST
    assert nodes.scripts_sent() == ["extend", "release"]
    assert sorted(c.node for c in nodes.broadcasts()[-1].calls) == [0, 1, 2]
    assert all(lock_key("r") not in db for db in nodes.data)  # what was left is dropped
    # Lost stays lost: the next explicit extend raises at once, without I/O.
    nodes.requests.clear()
    with pytest.raises(LockLost, match=gone):
        drive(core.extend_or_lose(state, 5.0), nodes.execute)
    assert nodes.requests == []


def test_explicit_extend_retries_through_a_stall_while_validity_is_left() -> None:
    """Nodes that do not answer in time say nothing about our key: the extend tries again
    (backing off) while validity is left, and a lock whose nodes answer again is kept,
    keys and all. Before, one timed-out round marked the lock lost and deleted its keys
    everywhere, with 9 s of validity left (nodes ~2 ms away, stalled 0.3 s once)."""
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=10.0)
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
    assert drive(core.extend_or_lose(state, 10.0), nodes.execute) is None
    assert nodes.scripts_sent() == ["extend"] * 3  # two timed out, the third acked
    assert len(nodes.sleeps()) == 2  # the backoff between them
    assert state.status == Status.HELD
    assert all(lock_key("r") in db for db in nodes.data)  # never released


def test_explicit_extend_gives_up_when_the_validity_runs_out() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock, retry_delay_min=0.1, retry_delay_max=0.25)
    state = held(core, nodes, ttl=0.9)
    nodes.down = {0, 1, 2}
    with pytest.raises(LockLost, match="no quorum of the 3 nodes renewed it"):
        drive(core.extend_or_lose(state, 5.0), nodes.execute)
    assert state.status == Status.LOST
    assert clock() >= state.deadline


def test_replies_not_read_never_count_as_our_key_gone() -> None:
    """A reply the transport never read (PENDING) is an error, not a refusal: neither an
    extend nor the renewal loop may decide that a majority lost our key from it."""
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=9.0)
    nodes.intercept = lambda call: PENDING if getattr(call, "node", None) in (0, 1) else PASS
    failure = drive(core.extend(state, 9.0), nodes.execute)
    assert failure is not None
    assert [r.outcome for r in failure] == [Outcome.ERROR, Outcome.ERROR, Outcome.GRANTED]
    assert not core.key_gone(failure)


def test_explicit_extend_of_an_expired_lock_raises_without_io() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes)
    clock.advance(10.0)
    with pytest.raises(LockLost, match="expired"):
        drive(core.extend_or_lose(state, 10.0), nodes.execute)
    assert nodes.requests == []


# ---------------------------------------------------------------------------
# auto-extend: the manager's renewal loop
# ---------------------------------------------------------------------------


class Holder:
    """Stands for a lock handle (the renewal loop holds handles weakly)."""


def run_renewals(core: RedlockCore, states: list[LockState], nodes: ScriptedNodes,
                 release_after: int | None = None,
                 holders: list[Holder] | None = None) -> list[LockState]:
    """Renew ``states`` with the manager's loop until none is left; the owner releases
    them all at the first sleep after ``release_after`` extend rounds (None: never).
    Returns the states the loop reported lost."""
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
        return nodes.execute(request)

    [loop] = loops  # one loop, however many locks
    assert drive(loop, execute) is None  # type: ignore[arg-type]
    assert len(renewals) == 0
    return lost


def test_renewals_come_at_a_third_of_the_validity_left_until_released() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=9.0)
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
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock, retry_delay_min=0.1, retry_delay_max=0.3)
    state = held(core, nodes, ttl=9.0)
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
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    core = make_core(5, clock)
    state = held(core, nodes, ttl=9.0)
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
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=9.0)
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
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock, retry_delay_min=0.1, retry_delay_max=0.25)
    state = held(core, nodes, ttl=0.9)
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
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=9.0)

    def released_meanwhile(call: object) -> object:
        state.mark_released()  # the owner released while the extend was out
        return 0  # ...so the key is gone everywhere

    nodes.intercept = released_meanwhile
    assert run_renewals(core, [state], nodes) == []
    assert nodes.scripts_sent() == ["extend"]  # the owner's release is the only release
    assert state.status == Status.RELEASED


def test_an_acquisition_whose_handles_were_collected_is_released_not_renewed() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock)
    state = held(core, nodes, ttl=9.0)
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


# amnesia on the acquire path: a new cluster, a node that lost its data, a majority
# that did, a node that restarted
# ---------------------------------------------------------------------------


def test_a_new_cluster_is_initialised_by_a_full_view_then_the_acquire_retries() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    nodes.connect(core)  # no marker anywhere: nothing to judge
    with capture_events() as events:
        result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 1
    assert result.attempts == 2
    assert nodes.commands_sent() == ["acquire", "init_marker", "release", "acquire"]
    initialise = nodes.broadcasts()[1]
    assert [(c.node, c.keys) for c in initialise.calls] == [(i, (MARKER, EPISODE))
                                                            for i in range(3)]
    assert len({c.args for c in initialise.calls}) == 1  # one marker text for the cluster
    assert all(nodes.healthy(i) for i in range(3))  # each stamped with its own run id
    assert [e["nodes"] for e in events if e["event"] == "redlock.cluster_initialised"] == [3]
    assert core.amnesia.health.benched() == set()


def test_a_new_cluster_with_a_silent_node_is_not_initialised_and_nobody_is_benched() -> None:
    nodes = ScriptedNodes(3, down={2})
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    nodes.connect(core)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is None and result.unavailable
    assert result.reason == "new cluster not initialised yet: all 3 nodes must answer once, " \
                            "1 did not"
    assert nodes.commands_sent() == ["acquire", "release"]
    assert all(db == {} for db in nodes.data)
    assert core.amnesia.health.benched() == set()
    assert not core.amnesia.needs_maintenance()


def test_a_missing_marker_is_looked_at_again_before_it_counts_as_amnesia() -> None:
    """Beside nodes with markers, a node without one is most often one that another
    client is initialising right now: probed again one node timeout later."""
    nodes = ScriptedNodes(3)
    del nodes.data[2][MARKER]
    core = make_core(3)

    def initialised_meanwhile(call: Call) -> object:
        if call.args[:1] == ("EXISTS",):  # the other client's INIT_MARKER landed
            nodes.run_script(2, node_scripts.INIT_MARKER, (MARKER, EPISODE), ("by another client",))
        return PASS

    nodes.intercept = initialised_meanwhile
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.attempts == 2
    assert nodes.commands_sent() == ["acquire", "EXISTS", "release", "acquire"]
    sleep = nodes.requests[1]
    assert isinstance(sleep, Wait) and sleep.seconds == core.timeout()
    assert [(c.node, c.args) for c in nodes.broadcasts()[1].calls] == [
        (2, ("EXISTS", MARKER))]  # only the missing one
    assert core.amnesia.health.benched() == set()
    assert all(lock_key("r") in db for db in nodes.data)


def test_a_node_that_lost_its_marker_is_benched_and_the_rest_grant() -> None:
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=False)  # restarted empty
    core = make_core(3, max_ttl=60.0)
    nodes.connect(core, [2])  # its connection broke: the transport identified it again
    assert core.amnesia.health.suspect == {}  # no marker: nothing to judge, just missing
    with capture_events() as events:
        result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.attempts == 1
    assert [r.outcome for r in result.outcomes] == [
        Outcome.GRANTED, Outcome.GRANTED, Outcome.AMNESIAC]
    assert nodes.commands_sent() == ["acquire", "EXISTS"]  # the one look again
    assert core.amnesia.health.benched() == {2}
    assert core.amnesia.needs_maintenance()  # the background maintenance takes it on
    assert [(e["node"], e["rejoins_after_s"]) for e in events
            if e["event"] == "redlock.node_amnesiac"] == [("n2:6379", 60.0)]
    # Nothing written on the acquire's path: no marker, no lock key, no episode yet.
    assert nodes.data[2] == {}
    # Known now: the next acquire does not look at it again.
    drive(core.release(result.state), nodes.execute)
    nodes.requests.clear()
    assert drive(core.acquire("s", 10.0, blocking=False, timeout=None),
                 nodes.execute).state is not None
    assert nodes.commands_sent() == ["acquire"]


def test_a_majority_without_markers_raises_cluster_amnesia_after_releasing() -> None:
    nodes = ScriptedNodes(5)
    for i in (0, 1, 2):
        nodes.restart(i, keep_data=False)
    core = make_core(5)
    with pytest.raises(ClusterAmnesiaError, match="3 of 5 nodes have no node marker") as caught:
        drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert "initialise --force" in str(caught.value)
    assert [r.outcome for r in caught.value.outcomes] == [Outcome.AMNESIAC] * 3 + [
        Outcome.GRANTED] * 2
    assert nodes.commands_sent() == ["acquire", "EXISTS", "release"]
    assert not any(lock_key("r") in db for db in nodes.data)
    assert [MARKER in db for db in nodes.data] == [False, False, False, True, True]


def test_a_restarted_node_is_a_suspect_whose_replies_do_not_count() -> None:
    """Its data may be an older copy: its grant does not count toward the quorum, and
    its counter (which may be anything) does not take part in choosing the token."""
    nodes = ScriptedNodes(3, counters=[5, 5, 9])
    stamped = str(nodes.data[2][MARKER])
    old_run = nodes.run_id(2)
    core = make_core(3)
    nodes.attach(core)
    nodes.restart(2, keep_data=True)
    with capture_events() as events:
        # The new connection's IDENTIFY rides ahead of the acquire: the node is a suspect
        # before the acquire's replies are looked at.
        result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert core.amnesia.health.suspect == {2: (stamped.encode(), nodes.run_id(2))}
    assert core.amnesia.needs_maintenance()
    assert [(e["node"], e["run_id"], e["stamped"]) for e in events
            if e["event"] == "redlock.node_restarted"] == [("n2:6379", nodes.run_id(2), old_run)]
    assert result.state is not None
    assert result.state.token == 6  # from nodes 0 and 1: not 10 from the suspect
    assert [r.outcome for r in result.outcomes] == [
        Outcome.GRANTED, Outcome.GRANTED, Outcome.AMNESIAC]
    assert result.outcomes[2].detail.startswith("restarted since its marker was written")
    assert nodes.commands_sent() == ["acquire"]  # no look again, no write-back to it
    assert core.amnesia.health.benched() == {2}
    # A refusal from it does not count either.
    nodes.data[2][lock_key("t")] = "someone"
    refused = drive(core.acquire("t", 10.0, blocking=False, timeout=None), nodes.execute)
    assert refused.state is not None and refused.outcomes[2].outcome is Outcome.AMNESIAC


@pytest.mark.parametrize("marker", [
    "initialised 1700000000.000 by 0123456789abcdef",  # a release before run ids
    "run_id=unknown initialised by a user who may not run INFO",
])
def test_a_marker_without_a_known_run_is_adopted_not_judged(marker: str) -> None:
    """Its writer could not tell restarts apart: what it promised holds (the node counts
    at once), and the maintenance stamps it with the run id found, from when on restarts
    are detected."""
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db[MARKER] = marker
    core = make_core(3)
    nodes.connect(core)
    assert core.amnesia.health.benched() == set()
    assert set(core.amnesia.health.adopt) == {0, 1, 2} and core.amnesia.health.news
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)
    assert [str(db[MARKER]).split()[0] for db in nodes.data] == [
        f"run_id={nodes.run_id(i)}" for i in range(3)]
    assert not core.amnesia.needs_maintenance()
    assert sorted(e["node"] for e in events if e["event"] == "redlock.node_marker_adopted") \
        == ["n0:6379", "n1:6379", "n2:6379"]


def test_a_user_who_cannot_identify_the_server_suspects_no_restart() -> None:
    """IDENTIFY answers run id 'unknown' to a user who may not run INFO: a marker stamped
    by another user's client is no sign of a restart to it (it cannot tell)."""
    nodes = ScriptedNodes(3)
    core = make_core(3)
    core.amnesia.identified({i: [b"unknown", str(nodes.data[i][MARKER]).encode()]
                             for i in range(3)})
    assert core.amnesia.health.benched() == set()
    assert not core.amnesia.needs_maintenance()


def test_a_suspects_counters_take_no_part_in_the_tokens_of_a_set() -> None:
    nodes = ScriptedNodes(3)
    for i, (a, b) in enumerate([(5, 1), (5, 1), (9, 9)]):
        nodes.data[i][fence_key("a")] = a
        nodes.data[i][fence_key("b")] = b
    core = make_core(3)
    nodes.attach(core)
    nodes.restart(2, keep_data=True)
    result = drive(core.acquire(("a", "b"), 10.0, blocking=False, timeout=None),
                   nodes.execute)
    assert result.state is not None
    assert result.state.tokens == {"a": 6, "b": 2}
    assert result.outcomes[2].outcome is Outcome.AMNESIAC
    assert nodes.commands_sent() == ["acquire_many"]


def test_two_suspects_of_three_leave_no_quorum() -> None:
    nodes = ScriptedNodes(3)
    for i in (1, 2):
        nodes.restart(i, keep_data=True)
    core = make_core(3)
    nodes.connect(core)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is None and result.unavailable
    assert result.reason == "1 of 3 nodes granted, need 2"
    assert nodes.commands_sent() == ["acquire", "release"]
    assert all(lock_key("r") not in db for db in nodes.data)


def test_a_fresh_manager_finding_every_node_demoted_does_not_call_it_initialised() -> None:
    """Every node lost its marker through DEMOTE (a restart of the whole cluster without
    durable persistence, judged by another process): each holds an amnesia episode, so
    INIT_MARKER refuses everywhere. A process that starts afterwards must not report the
    cluster initialised: this is a majority that lost its data."""
    nodes = ScriptedNodes(3)
    for i in range(3):
        nodes.restart(i, keep_data=True, durable=False)
        nodes.data[i].pop(MARKER)
        nodes.begin_episode(i, why="restarted with appendonly no")
    core = make_core(3)
    nodes.connect(core)
    with capture_events() as events:
        outcome: object
        try:
            outcome = drive(core.acquire("r", 10.0, blocking=False, timeout=None),
                            nodes.execute)
        except ClusterAmnesiaError as error:
            outcome = error
    assert all(MARKER not in db for db in nodes.data)  # INIT_MARKER refused everywhere
    assert "redlock.cluster_initialised" not in [e["event"] for e in events]
    assert isinstance(outcome, ClusterAmnesiaError)


# ---------------------------------------------------------------------------
# background maintenance: judging restarted nodes, amnesia episodes, repair
# ---------------------------------------------------------------------------


def maintain(core: RedlockCore, nodes: ScriptedNodes, *, sleeps: int | None = 1,
             stop: threading.Event | None = None) -> threading.Event:
    """Run the background maintenance on the scripted nodes; the manager closes (sets
    its stop event) when the maintenance asks for sleep number ``sleeps`` (None: never,
    the maintenance must end by itself). Returns the stop event."""
    stop = stop if stop is not None else threading.Event()
    news = threading.Event()  # the manager sets it on close, and when a node needs it
    asked = 0

    def execute(request: Broadcast | Wait | Invoke) -> list[object]:
        nonlocal asked
        if isinstance(request, Wait):
            assert request.wake is news  # news or closing cut the wait short
            asked += 1
            if sleeps is not None and asked >= sleeps:
                stop.set()
                news.set()
        return nodes.execute(request)

    assert drive(maintenance(core.amnesia, stop, news), execute) is None
    return stop


def test_maintenance_with_nothing_pending_ends_at_once() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    nodes.connect(core)
    assert not core.amnesia.needs_maintenance()
    maintain(core, nodes, sleeps=None)
    assert nodes.requests == []


def test_maintenance_stops_when_the_manager_closes() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.restart(2, keep_data=False)
    core = make_core(3, clock, max_ttl=60.0, repair_interval=5.0)
    core.amnesia.health.lost_data(2)
    closed = threading.Event()
    closed.set()
    maintain(core, nodes, sleeps=None, stop=closed)  # closed before it began: nothing
    assert nodes.requests == []
    stop = maintain(core, nodes, sleeps=2)  # closed during its second wait
    assert stop.is_set()
    assert nodes.commands_sent() == ["open_episode"]
    assert nodes.sleeps() == [5.0, 5.0]
    assert clock() == 1005.0  # the wait that the close cut short did not last
    assert core.amnesia.needs_maintenance()


@pytest.mark.parametrize("resp3", [False, True])
def test_judging_restamps_a_node_restarted_with_durable_persistence(resp3: bool) -> None:
    nodes = ScriptedNodes(3, resp3=resp3)
    judged = str(nodes.data[2][MARKER])
    nodes.restart(2, keep_data=True)  # appendonly yes, appendfsync always
    core = make_core(3)
    nodes.connect(core)
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)  # ends by itself: nothing left to do
    assert nodes.commands_sent() == ["CONFIG", "restamp"]
    [config, restamp] = nodes.broadcasts()
    assert [(c.node, c.args) for c in config.calls] == [
        (2, ("CONFIG", "GET", "appendonly")), (2, ("CONFIG", "GET", "appendfsync")),
        (2, ("INFO", "replication"))]
    assert config.timeout == restamp.timeout == Settings().repair_timeout
    [call] = restamp.calls
    assert (call.node, call.keys, call.args[0]) == (2, (MARKER,), judged.encode())
    assert nodes.healthy(2)
    assert str(nodes.data[2][MARKER]).startswith(f"run_id={nodes.run_id(2)} restamped at=")
    assert core.amnesia.health.benched() == set()
    assert [e["node"] for e in events if e["event"] == "redlock.node_restamped"] == ["n2:6379"]
    assert nodes.sleeps() == []
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED] * 3  # counts again


@pytest.mark.parametrize(("durable", "promoted", "why"), [
    (False, False, "restarted with appendonly no, appendfsync everysec: the last writes"
                   " may be lost"),
    (True, True, "a promoted replica (its copy may lag behind the old primary)"),
])
def test_judging_demotes_a_node_that_may_have_come_back_older(
        durable: bool, promoted: bool, why: str) -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    judged = str(nodes.data[2][MARKER])
    nodes.data[2][lock_key("r")] = "a holder"
    nodes.restart(2, keep_data=True, durable=durable, promoted=promoted)
    core = make_core(3, clock, max_ttl=60.0, repair_interval=5.0)
    nodes.connect(core)
    with capture_events() as events:
        maintain(core, nodes, sleeps=1)
    assert nodes.commands_sent() == ["CONFIG", "demote", "open_episode"]
    [demote] = nodes.broadcasts()[1].calls
    assert (demote.keys, demote.args) == ((MARKER, EPISODE), (judged.encode(), why))
    assert MARKER not in nodes.data[2]
    assert nodes.episode(2) == (nodes.now_ms(2), nodes.run_id(2), why)
    assert nodes.data[2][lock_key("r")] == "a holder"  # its keys stay: they expire
    assert core.amnesia.health.suspect == {}
    assert core.amnesia.health.benched() == {2}
    assert core.amnesia.health.rejoins_in(2, clock()) == 60.0
    assert [(e["node"], e["rejoins_after_s"]) for e in events
            if e["event"] == "redlock.node_amnesiac"] == [("n2:6379", 60.0)]
    assert nodes.sleeps() == [5.0]  # repair_interval: it rejoins 60 s from now
    # It refuses by itself now, and the acquire knows it: no look again.
    nodes.requests.clear()
    result = drive(core.acquire("s", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.outcomes[2].outcome is Outcome.AMNESIAC
    assert nodes.commands_sent() == ["acquire"]


def test_judging_identifies_the_node_again_when_its_marker_changed_meanwhile() -> None:
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=True)
    core = make_core(3)
    nodes.connect(core)

    def restamped_by_another_client(call: Call) -> object:
        if call.script is node_scripts.RESTAMP:
            nodes.run_script(2, node_scripts.RESTAMP, (MARKER,),
                             (nodes.data[2][MARKER], "by another client", nodes.run_id(2)))
        return PASS

    nodes.intercept = restamped_by_another_client
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "restamp", "identify"]
    assert str(nodes.data[2][MARKER]) == nodes.stamp(2, "by another client")  # left as is
    assert core.amnesia.health.benched() == set()


def test_judging_a_node_demoted_meanwhile_leaves_it_to_the_acquire_path() -> None:
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=True, durable=False)
    core = make_core(3)
    nodes.connect(core)

    def demoted_by_another_client(call: Call) -> object:
        if call.script is node_scripts.DEMOTE:
            nodes.run_script(2, node_scripts.DEMOTE, (MARKER, EPISODE),
                             (nodes.data[2][MARKER], "by another client"))
        return PASS

    nodes.intercept = demoted_by_another_client
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "demote", "identify"]
    assert nodes.episode(2) == (nodes.now_ms(2), nodes.run_id(2), "by another client")
    assert core.amnesia.health.benched() == set()  # not a suspect: no marker to judge
    nodes.intercept = None
    nodes.requests.clear()
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    assert nodes.commands_sent() == ["acquire", "EXISTS"]  # missing: looked at again
    assert core.amnesia.health.benched() == {2}


def test_a_suspect_that_cannot_be_judged_stays_suspect_and_is_judged_again_later() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.restart(2, keep_data=True)
    core = make_core(3, clock, repair_interval=5.0)
    nodes.connect(core)
    nodes.down = {2}
    maintain(core, nodes, sleeps=1)
    assert nodes.commands_sent() == ["CONFIG", "identify"]  # unreachable: nothing decided
    assert 2 in core.amnesia.health.suspect
    assert nodes.sleeps() == [5.0]
    nodes.down = set()
    nodes.requests.clear()
    maintain(core, nodes, sleeps=None)
    assert nodes.commands_sent() == ["CONFIG", "restamp"]
    assert core.amnesia.health.benched() == set() and nodes.healthy(2)


def test_an_episode_of_the_same_server_run_is_kept_one_from_another_run_begins_anew() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    nodes.data[2].clear()
    begun = nodes.begin_episode(2, ago=45.0)  # another client opened it 45 s ago
    core = make_core(3, clock, max_ttl=60.0)
    health = core.amnesia.health
    health.lost_data(2)
    assert health.rejoins_in(2, clock()) is None  # not known before its episode is read
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    [call] = nodes.broadcasts()[0].calls
    assert (call.node, call.keys) == (2, (MARKER, EPISODE))
    assert nodes.data[2][EPISODE] == begun  # kept: the same server run
    assert health.rejoins_in(2, clock()) == pytest.approx(15.0)  # by the node's clock
    # Restarted with its data (the episode key too): the run that began it is gone,
    # and its data may be older than the episode says.
    clock.advance(20.0)
    nodes.restart(2, keep_data=True)
    health.episode_unknown(2)
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    assert nodes.episode(2) == (nodes.now_ms(2), nodes.run_id(2), "lost its node marker")
    assert health.rejoins_in(2, clock()) == 60.0
    # Unreachable: its rejoin time is kept until it answers.
    nodes.down = {2}
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    assert health.rejoins_in(2, clock()) == 60.0
    # Repaired meanwhile by another client: healthy, nothing written.
    nodes.down = set()
    nodes.data[2][MARKER] = nodes.stamp(2, "repaired by another client")
    drive(open_episodes(core.amnesia, [2]), nodes.execute)
    assert health.benched() == set()


def test_a_benched_node_found_restarted_while_its_episode_is_read_is_still_judged() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(3, clock=clock)
    core = make_core(3, clock, max_ttl=60.0)
    nodes.attach(core)
    nodes.restart(2, keep_data=False)  # lost its data
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and core.amnesia.health.benched() == {2}
    # Another client repairs it; then it restarts without durable persistence: its data,
    # marker included, may be older than what it acknowledged.
    nodes.data[2][MARKER] = nodes.stamp(2, "repaired by another client")
    nodes.restart(2, keep_data=True, durable=False)
    nodes.requests.clear()
    maintain(core, nodes, sleeps=2)
    assert nodes.commands_sent()[0] == "open_episode"  # its IDENTIFY rode on this call
    assert "demote" in nodes.commands_sent()
    assert MARKER not in nodes.data[2] and core.amnesia.health.benched() == {2}


def test_restamp_refuses_a_server_other_than_the_one_judged() -> None:
    nodes = ScriptedNodes(3)
    core = make_core(3)
    nodes.attach(core)
    nodes.restart(2, keep_data=True)  # durable: would be re-stamped
    nodes.connect(core, [2])
    assert 2 in core.amnesia.health.suspect
    failovers = 0

    def failover_before_restamp(call: Call) -> object:
        nonlocal failovers
        if call.script is node_scripts.RESTAMP and not failovers:
            failovers += 1  # a replica with a copy of the marker took the node's place
            nodes.restart(2, keep_data=True, promoted=True)
        return PASS

    nodes.intercept = failover_before_restamp
    maintain(core, nodes, sleeps=1)
    assert not nodes.healthy(2)  # the promoted replica is not stamped unjudged
    assert 2 in core.amnesia.health.benched()


def amnesiac_cluster(n: int = 5, **options: object) -> ScriptedNodes:
    """Node 0 restarted empty; the others hold diverged counters of a, b and c."""
    nodes = ScriptedNodes(n, **options)  # type: ignore[arg-type]
    nodes.restart(0, keep_data=False)
    table = {"a": [7, 3, 5, 2], "b": [1, 9, 9], "c": [0, 0, 0, 4]}
    for resource, values in table.items():
        for i, value in enumerate(values, start=1):
            if i < n:
                nodes.data[i][fence_key(resource)] = value
    nodes.data[1][lock_key("a")] = "a holder"  # not a counter: never seeded
    return nodes


def test_maintenance_repairs_a_node_once_its_episode_is_max_ttl_old_then_ends() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=60.0, repair_interval=5.0)
    core.amnesia.health.lost_data(0)
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)
    assert nodes.sleeps() == [5.0] * 12  # 60 s, looked at every repair_interval
    assert nodes.commands_sent() == ["open_episode", "SET", "identify"] + [
        "SCAN", "MGET"] * 4 + ["seed_counters", "finish_repair"]
    assert nodes.healthy(0) and EPISODE not in nodes.data[0]
    assert core.amnesia.health.benched() == set()
    assert [(e["node"], e["counters_seeded"], e["sources"]) for e in events
            if e["event"] == "redlock.node_repaired"] == [("n0:6379", 3, 4)]


# ---------------------------------------------------------------------------
# repair of one node
# ---------------------------------------------------------------------------


def test_repair_claims_the_node_reads_every_healthy_node_seeds_the_max_and_marks_it() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=60.0)
    core.amnesia.health.lost_data(0)
    nodes.begin_episode(0, ago=60.0)
    report = drive(repair_node(core, 0), nodes.execute)
    assert (report.node, report.status) == ("n0:6379", "repaired")
    assert report.detail == "3 fence counters re-seeded"
    assert {k: v for k, v in nodes.data[0].items() if k != MARKER} == {
        fence_key("a"): 7, fence_key("b"): 9, fence_key("c"): 4}
    assert str(nodes.data[0][MARKER]).startswith(f"run_id={nodes.run_id(0)} repaired at=")
    assert core.amnesia.health.benched() == set()
    claim = nodes.broadcasts()[0].calls[0]
    assert claim.node == 0
    assert claim.args[:2] == ("SET", GUARD) and claim.args[3:] == ("NX", "PX", 60_000)
    probe = nodes.broadcasts()[1]
    assert [(c.node, c.args) for c in probe.calls] == [
        (i, ("EVAL", node_scripts.IDENTIFY.source, 1, MARKER)) for i in (1, 2, 3, 4)]
    assert nodes.commands_sent() == ["SET", "identify"] + ["SCAN", "MGET"] * 4 + [
        "seed_counters", "finish_repair"]
    [finish] = nodes.broadcasts()[-1].calls
    assert finish.keys == (GUARD, MARKER, EPISODE)
    assert (finish.args[0], finish.args[2]) == (claim.args[2], 60_000)  # checked node-side


def test_repair_reads_only_nodes_stamped_by_their_running_server() -> None:
    nodes = amnesiac_cluster()
    nodes.restart(4, keep_data=True)  # a suspect: its counters may be an older copy
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "repaired"
    scanned = [b.calls[0].node for b in nodes.broadcasts() if b.calls[0].args[:1] == ("SCAN",)]
    assert scanned == [1, 2, 3]
    assert nodes.data[0].get(fence_key("c")) is None  # only the suspect had c


def test_repair_fails_cleanly_when_fewer_than_a_quorum_of_healthy_nodes_answer() -> None:
    nodes = amnesiac_cluster(down={3})
    nodes.data[4].clear()  # another amnesiac node: no source
    core = make_core(5)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail == "read counters from 2 healthy nodes, need 3"
    assert nodes.commands_sent()[-1] == "DEL"  # gave the claim back
    assert nodes.data[0] == {}  # no counter, no marker, no guard


@pytest.mark.parametrize("broken", ["SCAN", "MGET"])
def test_repair_does_not_count_a_source_whose_counters_could_not_be_read(broken: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)

    def sources_2_and_3_fail(call: Call) -> object:
        if call.node in (2, 3) and call.args[:1] == (broken,):
            return ConnectionError("reset")
        return PASS

    nodes.intercept = sources_2_and_3_fail
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail == "read counters from 2 healthy nodes, need 3"
    assert nodes.data[0] == {}


@pytest.mark.parametrize(("claim", "detail"), [(None, "busy"),
                                                (TimeoutError("no reply"), "TimeoutError")])
def test_repair_that_cannot_claim_the_node_does_nothing(claim: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    nodes.intercept = lambda call: claim if call.args[:1] == ("SET",) else PASS
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed"
    assert report.detail.startswith("could not claim the repair: " + detail)
    assert nodes.commands_sent() == ["SET"]


@pytest.mark.parametrize(("step", "detail"), [(node_scripts.SEED_COUNTERS, "seeding interrupted"),
                                              (node_scripts.FINISH_REPAIR, "marker not written")])
def test_repair_interrupted_by_the_node_losing_its_data_writes_no_marker(
        step: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    core.amnesia.health.lost_data(0)

    def restarts_empty_first(call: Call) -> object:
        if call.script is step:
            nodes.restart(0, keep_data=False)  # the guard goes with the data
        return PASS

    nodes.intercept = restarts_empty_first
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "failed" and report.detail.startswith(detail)
    assert nodes.data[0] == {}
    assert core.amnesia.health.benched() == {0}


def test_repair_reads_counters_page_by_page_and_seeds_them_in_batches() -> None:
    nodes = ScriptedNodes(3, scan_page=100)
    nodes.restart(0, keep_data=False)
    for i in range(1200):
        for source in (1, 2):
            nodes.data[source][fence_key(f"r{i}")] = i + source
    core = make_core(3)
    report = drive(repair_node(core, 0, force=True), nodes.execute)
    assert report.status == "repaired" and report.detail == "1200 fence counters re-seeded"
    assert all(nodes.data[0][fence_key(f"r{i}")] == i + 2 for i in range(1200))
    seeds = [b for b in nodes.broadcasts() if b.calls[0].script is node_scripts.SEED_COUNTERS]
    assert [len(b.calls[0].keys) - 1 for b in seeds] == [500, 500, 200]  # the guard + keys
    scans = [b.calls[0] for b in nodes.broadcasts() if b.calls[0].args[:1] == ("SCAN",)]
    assert len(scans) == 2 * 13  # 1201 keys on each source (the marker too): 13 pages


def test_read_counters_skips_keys_that_vanished_and_gives_up_on_a_malformed_page() -> None:
    nodes = ScriptedNodes(3, scan_page=3)
    for i, resource in enumerate("abc", start=1):
        nodes.data[1][fence_key(resource)] = i
    nodes.data[1][lock_key("a")] = "holder"
    core = make_core(3)
    nodes.intercept = lambda call: ([b"7"] + [None] * (len(call.args) - 2)
                                    if call.args[:1] == ("MGET",) else PASS)
    # Pages of three keys: (the marker, a, a's lock key), then (b, c); MATCH leaves the
    # counters. On each page MGET answers for the first key only: the others vanished.
    assert drive(read_counters(core, 1), nodes.execute) == {fence_key("a"): 7,
                                                            fence_key("b"): 7}
    assert nodes.commands_sent() == ["SCAN", "MGET", "SCAN", "MGET"]
    assert [b.calls[0].args for b in nodes.broadcasts()][::2] == [
        ("SCAN", 0, "MATCH", "redlock:{*}:fence", "COUNT", 1000),
        ("SCAN", b"3", "MATCH", "redlock:{*}:fence", "COUNT", 1000)]  # cursor followed
    nodes.intercept = lambda call: b"garbage" if call.args[:1] == ("SCAN",) else PASS
    assert drive(read_counters(core, 1), nodes.execute) is None
    nodes.intercept = lambda call: TimeoutError() if call.args[:1] == ("MGET",) else PASS
    assert drive(read_counters(core, 1), nodes.execute) is None
    nodes.intercept = None
    nodes.scan_page = 1
    nodes.requests.clear()
    # A page that MATCH leaves empty is no reason to stop, nor to ask MGET.
    assert drive(read_counters(core, 1), nodes.execute) == {
        fence_key("a"): 1, fence_key("b"): 2, fence_key("c"): 3}
    assert nodes.commands_sent() == ["SCAN", "SCAN", "MGET", "SCAN", "SCAN", "MGET",
                                     "SCAN", "MGET"]
    assert drive(read_counters(core, 2), nodes.execute) == {}  # no counter at all


def test_a_repair_waits_for_max_ttl_by_the_nodes_clock_not_the_clients() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=60.0)
    core.amnesia.health.lost_data(0)
    drive(open_episodes(core.amnesia, [0]), nodes.execute)  # begins now, by node 0's clock
    begun = nodes.data[0][EPISODE]
    clock.advance(60.0)
    nodes.skew[0] = -10.0  # node 0's clock was set back 10 s meanwhile
    nodes.requests.clear()
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "waiting"
    assert nodes.commands_sent()[-4:] == ["seed_counters", "finish_repair", "DEL",
                                          "open_episode"]
    assert MARKER not in nodes.data[0] and GUARD not in nodes.data[0]
    assert nodes.data[0][EPISODE] == begun
    assert core.amnesia.health.rejoins_in(0, clock()) == 10.0  # read again: its clock says
    clock.advance(10.0)  # one max_ttl by its clock now
    assert drive(repair_node(core, 0), nodes.execute).status == "repaired"
    assert nodes.healthy(0) and EPISODE not in nodes.data[0]


@pytest.mark.parametrize("loss", ["restart empty", "restart with its data", "flushall"])
def test_a_second_data_loss_during_the_wait_restarts_it(loss: str) -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=60.0, repair_interval=5.0)
    core.amnesia.health.lost_data(0)
    maintain(core, nodes, sleeps=11)  # the episode began; 50 s of the wait went by
    first = nodes.episode(0)
    assert first is not None
    assert core.amnesia.health.rejoins_in(0, clock()) == 10.0
    if loss == "flushall":
        nodes.data[0].clear()
    else:
        nodes.restart(0, keep_data=loss == "restart with its data")
    nodes.requests.clear()
    with capture_events() as events:
        maintain(core, nodes, sleeps=4)  # 60 s after the first loss: due by our clock
    assert nodes.commands_sent()[:2] == ["SET", "identify"]  # tried...
    assert nodes.commands_sent()[-3:] == ["finish_repair", "DEL", "open_episode"]  # refused
    assert "redlock.node_repaired" not in [e["event"] for e in events]
    assert MARKER not in nodes.data[0]
    again = nodes.episode(0)
    assert again is not None and again[1] == nodes.run_id(0)
    assert again[0] - first[0] == 60_000  # begun anew when read again, at the refusal
    assert core.amnesia.health.rejoins_in(0, clock()) == 55.0  # one round later


def test_maintenance_retries_a_failed_repair_only_after_repair_interval() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=10.0, repair_interval=5.0)
    core.amnesia.health.lost_data(0)
    claims: list[float] = []

    def reads_fail_twice(call: Call) -> object:
        if call.args[:1] == ("SET",):
            claims.append(clock())
        if len(claims) <= 2 and call.args[:1] == ("SCAN",):
            return ConnectionError("reset")
        return PASS

    nodes.intercept = reads_fail_twice
    maintain(core, nodes, sleeps=None)
    assert [t - 1000.0 for t in claims] == [10.0, 15.0, 20.0]
    assert nodes.sleeps() == [5.0] * 4
    assert nodes.healthy(0) and core.amnesia.health.benched() == set()


def test_maintenance_repairs_as_soon_as_the_nodes_clock_says_after_a_too_early_try() -> None:
    """A repair tried a little early by the client's clock (the node's runs behind) is no
    failure: the episode is read again and the repair comes when the node's clock says,
    not one repair_interval later."""
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=10.0, repair_interval=5.0)
    core.amnesia.health.lost_data(0)
    finishes: list[float] = []

    def node_clock_falls_behind(call: Call) -> object:
        if call.script is node_scripts.FINISH_REPAIR:
            finishes.append(clock())
            nodes.skew[0] = -2.0 if len(finishes) == 1 else nodes.skew.get(0, 0.0)
        return PASS

    nodes.intercept = node_clock_falls_behind
    maintain(core, nodes, sleeps=None)
    assert [t - 1000.0 for t in finishes] == [10.0, 12.0]
    assert nodes.healthy(0)


# ---------------------------------------------------------------------------
# the admin steps: repair() and initialise()
# ---------------------------------------------------------------------------


def test_repair_reports_every_node_and_repairs_only_after_one_max_ttl_unless_forced() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(down={4}, clock=clock)
    core = make_core(5, clock, max_ttl=60.0)
    statuses = drive(core.repair(force=False), nodes.execute)
    assert nodes.commands_sent() == ["identify", "open_episode"]
    assert [(r.status, r.detail[:12]) for r in statuses] == [
        ("waiting", "rejoins in 6"), ("healthy", ""), ("healthy", ""), ("healthy", ""),
        ("failed", "TimeoutError")]
    assert statuses[0].detail.startswith("rejoins in 60.0 s")
    clock.advance(30.0)
    assert drive(core.repair(force=False), nodes.execute)[0].detail.startswith(
        "rejoins in 30.0 s")
    assert MARKER not in nodes.data[0]
    forced = drive(core.repair(force=True), nodes.execute)
    assert forced[0].status == "repaired"
    # The max over the sources that answered: c was only on the silent node.
    assert {k: v for k, v in nodes.data[0].items() if k != MARKER} == {
        fence_key("a"): 7, fence_key("b"): 9}
    assert [r.status for r in drive(core.repair(force=False), nodes.execute)] == [
        "healthy", "healthy", "healthy", "healthy", "failed"]


def test_repair_repairs_a_node_whose_episode_is_old_enough_without_force() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    nodes.begin_episode(0, ago=61.0)  # opened by another client a while ago
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert [r.status for r in reports] == ["repaired"] + ["healthy"] * 4
    assert nodes.healthy(0)


def test_repair_judges_restarted_nodes() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    nodes.restart(1, keep_data=True)  # durable: re-stamped
    nodes.restart(2, keep_data=True)  # its replication cannot be read: undecided

    def replication_unreadable(call: Call) -> object:
        return TimeoutError("no reply") if call.node == 2 and call.args[:1] == (
            "INFO",) else PASS

    nodes.intercept = replication_unreadable
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", ""), ("healthy", ""),
        ("failed", "restarted; its persistence could not be checked"),
        ("healthy", ""), ("healthy", "")]
    assert nodes.healthy(1) and not nodes.healthy(2)
    assert core.amnesia.health.benched() == {2}


def test_repair_reports_a_node_it_demoted_as_waiting_for_its_episode() -> None:
    clock = FakeClock()
    nodes = ScriptedNodes(5, clock=clock)
    nodes.restart(2, keep_data=True, durable=False)
    core = make_core(5, clock, max_ttl=60.0)
    reports = drive(core.repair(force=False), nodes.execute)
    assert MARKER not in nodes.data[2] and nodes.episode(2) is not None  # demoted
    assert (reports[2].status, reports[2].detail[:16]) == ("waiting", "rejoins in 60.0 ")


def test_repair_of_an_uninitialised_cluster_reports_it_healthy_and_writes_nothing() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    reports = drive(core.repair(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [("healthy", "uninitialised cluster")] * 3
    assert nodes.commands_sent() == ["identify"]
    assert all(db == {} for db in nodes.data)


def test_initialise_completes_an_interrupted_initialisation() -> None:
    nodes = ScriptedNodes(3)
    for i in (1, 2):  # INIT_MARKER reached node 0 only...
        nodes.data[i].clear()
    nodes.data[0][fence_key("r")] = 2  # ...which granted twice without a quorum
    core = make_core(3)
    with capture_events() as events:
        reports = drive(core.initialise(force=False), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", ""), ("initialised", "1 fence counters re-seeded"),
        ("initialised", "1 fence counters re-seeded")]
    blank = nodes.broadcasts()[1:5]  # node by node: no episode, no key of ours
    assert [(c.node, c.args) for b in blank for c in b.calls] == [
        (i, call) for i in (1, 2) for call in (
            ("EXISTS", EPISODE), ("SCAN", 0, "MATCH", "redlock:*", "COUNT", 1000))]
    assert nodes.commands_sent() == ["identify"] + ["EXISTS", "SCAN"] * 2 + [
        "SET", "SCAN", "MGET", "seed_counters", "finish_repair"] * 2
    assert [c.node for b in nodes.broadcasts() for c in b.calls
            if c.args[:1] == ("SCAN",) and c.args[2:4] == ("MATCH", "redlock:{*}:fence")] == [
        0, 0]  # the counters read from the marked node only
    assert all(nodes.healthy(i) for i in range(3))
    assert [db.get(fence_key("r")) for db in nodes.data] == [2, 2, 2]
    assert not any(GUARD in db or EPISODE in db for db in nodes.data)
    [event] = [e for e in events if e["event"] == "redlock.cluster_initialised_by_hand"]
    assert (event["nodes"], event["initialised"], event["forced"]) == (3, 2, False)
    assert core.amnesia.health.marker_seen
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 3


def test_initialise_refuses_nodes_that_lost_data_unless_forced() -> None:
    nodes = ScriptedNodes(5)
    nodes.data[0][fence_key("r")] = 7
    nodes.data[1][fence_key("r")] = 5
    nodes.data[1][fence_key("s")] = 2
    for i in (2, 3, 4):
        nodes.restart(i, keep_data=False)
    nodes.begin_episode(2)  # an amnesia episode
    nodes.data[3][fence_key("r")] = 4  # a counter of its own
    nodes.data[4][lock_key("q")] = "a holder"  # a lock key
    before = [dict(db) for db in nodes.data]
    core = make_core(5)
    with capture_events() as events:
        reports = drive(core.initialise(force=False), nodes.execute)
    assert [r.status for r in reports] == ["healthy", "healthy", "failed", "failed", "failed"]
    assert all(r.detail.startswith("it lost data (it holds keys or an amnesia episode)")
               for r in reports[2:])
    # Node 2 has an episode; 3 and 4 have keys of ours.
    assert nodes.commands_sent() == ["identify", "EXISTS", "EXISTS", "SCAN", "EXISTS", "SCAN"]
    assert [dict(db) for db in nodes.data] == before
    assert "redlock.cluster_initialised_by_hand" not in [e["event"] for e in events]
    with capture_events() as events:
        forced = drive(core.initialise(force=True), nodes.execute)
    assert [r.status for r in forced] == ["healthy", "healthy"] + ["initialised"] * 3
    assert all(nodes.healthy(i) for i in range(5))
    # Seeded from every marked node (the max), never lowered.
    assert [db.get(fence_key("r")) for db in nodes.data] == [7, 5, 7, 7, 7]
    assert [db.get(fence_key("s")) for db in nodes.data[2:]] == [2, 2, 2]
    assert not any(GUARD in db or EPISODE in db for db in nodes.data)
    [event] = [e for e in events if e["event"] == "redlock.cluster_initialised_by_hand"]
    assert (event["initialised"], event["forced"]) == (3, True)
    finishes = [b.calls[0] for b in nodes.broadcasts()
                if b.calls[0].script is node_scripts.FINISH_REPAIR]
    assert [c.args[2] for c in finishes] == [0, 0, 0]  # no rejoin delay


def test_initialise_looks_through_every_page_of_a_shared_database() -> None:
    nodes = ScriptedNodes(3, scan_page=4)
    for i in (1, 2):
        nodes.data[i].clear()
    for k in range(6):  # another application's keys on node 1
        nodes.data[1][f"app:{k}"] = "theirs"
    core = make_core(3)
    reports = drive(core.initialise(force=False), nodes.execute)
    assert [r.status for r in reports] == ["healthy", "initialised", "initialised"]


@pytest.mark.parametrize("force", [False, True])
def test_initialise_needs_every_node_to_answer(force: bool) -> None:
    nodes = ScriptedNodes(3, down={1})
    nodes.data[2].clear()
    core = make_core(3)
    reports = drive(core.initialise(force=force), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", "not changed: every node must answer"),
        ("failed", "TimeoutError: no reply"),
        ("healthy", "not changed: every node must answer")]
    assert nodes.commands_sent() == ["identify"]
    assert nodes.data[2] == {}


def test_initialise_without_force_never_marks_a_node_when_a_quorum_has_markers() -> None:
    """With a quorum marked, locks may have been granted: a blank node is one that lost
    its data (before anyone opened its episode), not one an initialisation missed. It
    rejoins through repair, after max_ttl; initialise() leaves it alone."""
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=False)  # blank: no marker, no episode, no key
    core = make_core(3)
    reports = drive(core.initialise(force=False), nodes.execute)
    assert [r.status for r in reports] == ["healthy", "healthy", "failed"]
    assert "repair() brings it back one max_ttl after the loss" in reports[2].detail
    assert nodes.commands_sent() == ["identify"]
    assert MARKER not in nodes.data[2]
