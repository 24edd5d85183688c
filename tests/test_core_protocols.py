"""The protocols of the sans-IO core on scripted nodes (tests/scripted.py): acquire and
release, extend, the auto-extend watchdog, amnesia handling and node repair.

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
    Broadcast,
    LockState,
    RedlockCore,
    Renewals,
    Settings,
    Sleep,
    Status,
    drive,
    read_counters,
    repair_node,
    scripts,
)
from tests.scripted import (
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
    core = RedlockCore([f"n{i}:6379" for i in range(3)], Settings(), FakeClock())
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

    def slow(request: Broadcast | Sleep) -> list[object]:
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

    def execute(request: Broadcast | Sleep) -> list[object]:
        if isinstance(request, Sleep):
            assert request.seconds > 0
            clock.advance(request.seconds)
        return nodes.execute(request)

    result = drive(make_core(3, clock).acquire("r", 10.0, blocking=True,
                                                           timeout=1.0), execute)
    assert result.state is None
    assert not result.unavailable  # contention, not an outage
    assert result.attempts > 1
    sleeps = [r for r in nodes.requests if isinstance(r, Sleep)]
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
    started = clock()
    assert drive(core.extend(state, 20.0), nodes.execute) is None
    [request] = nodes.broadcasts()
    assert [(c.node, c.script, c.keys, c.args) for c in request.calls] == [
        (i, scripts.EXTEND, (lock_key("r"),), (state.owner, 20_000)) for i in range(3)]
    assert request.timeout == Settings().node_timeout
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
    with pytest.raises(LockLost, match="extend did not reach a quorum") as caught:
        drive(core.extend_or_lose(state, 5.0), nodes.execute)
    assert [r.outcome for r in caught.value.outcomes] == [
        Outcome.REFUSED, Outcome.REFUSED, Outcome.GRANTED]
    assert state.status == Status.LOST
    assert nodes.scripts_sent() == ["extend", "release"]
    assert sorted(c.node for c in nodes.broadcasts()[-1].calls) == [0, 1, 2]
    assert all(lock_key("r") not in db for db in nodes.data)  # what was left is dropped
    # Lost stays lost: the next explicit extend raises at once, without I/O.
    nodes.requests.clear()
    with pytest.raises(LockLost, match="extend did not reach a quorum"):
        drive(core.extend_or_lose(state, 5.0), nodes.execute)
    assert nodes.requests == []


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

    def execute(request: Broadcast | Sleep) -> list[object]:
        extends = nodes.scripts_sent().count("extend")
        if isinstance(request, Sleep) and release_after is not None \
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

    nodes.intercept = unreachable_for_four_rounds  # type: ignore[assignment]
    with capture_events() as events:
        assert run_renewals(core, [state], nodes, release_after=5) == []
    # A third of the validity, then the backoff doubles from retry_delay_min up to
    # retry_delay_max, then a third of the renewed validity.
    assert nodes.sleeps() == pytest.approx([validity / 3, 0.1, 0.2, 0.3, 0.3, validity / 3])
    assert nodes.scripts_sent() == ["extend"] * 5
    assert [e["event"] for e in events].count("redlock.extend_retry") == 4
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

    nodes.intercept = node_2_back_after_one_round  # type: ignore[assignment]
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
    assert state.lost_reason == "a majority of nodes no longer hold our key"
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
    assert state.lost_reason == "renewal failed until the validity ran out"
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

    nodes.intercept = released_meanwhile  # type: ignore[assignment]
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


# ---------------------------------------------------------------------------
# amnesia: a new cluster, a node that lost its data, a majority that did
# ---------------------------------------------------------------------------


def test_a_new_cluster_is_initialised_by_a_full_view_then_the_acquire_retries() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 1
    assert result.attempts == 2
    assert nodes.commands_sent() == ["acquire", "SET", "release", "acquire"]
    initialise = nodes.broadcasts()[1]
    assert all(c.args[:2] == ("SET", MARKER) and c.args[3] == "NX" for c in initialise.calls)
    assert all(MARKER in db for db in nodes.data)


def test_a_new_cluster_with_a_silent_node_is_not_initialised_and_nobody_is_benched() -> None:
    nodes = ScriptedNodes(3, down={2})
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is None and result.unavailable
    assert result.reason == "new cluster not initialised yet: all 3 nodes must answer once, " \
                            "1 did not"
    assert nodes.commands_sent() == ["acquire", "release"]
    assert not any(MARKER in db for db in nodes.data)
    assert core.amnesia.health.amnesiac_since == {}


def test_a_missing_marker_is_looked_at_again_before_it_counts_as_amnesia() -> None:
    """Beside nodes with markers, a node without one is most often one that another
    client is initialising right now: probed again one node timeout later."""
    nodes = ScriptedNodes(3)
    del nodes.data[2][MARKER]
    core = make_core(3)

    def initialised_meanwhile(call: object) -> object:
        if getattr(call, "args", ())[:1] == ("EXISTS",):
            nodes.data[2][MARKER] = "landed"
        return PASS

    nodes.intercept = initialised_meanwhile  # type: ignore[assignment]
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.attempts == 2
    assert nodes.commands_sent() == ["acquire", "EXISTS", "release", "acquire"]
    sleep = nodes.requests[1]
    assert isinstance(sleep, Sleep) and sleep.seconds == Settings().node_timeout
    assert [c.node for c in nodes.broadcasts()[1].calls] == [2]  # only the missing one
    assert not core.amnesia.health.is_amnesiac(2)
    assert all(lock_key("r") in db for db in nodes.data)


def test_a_node_that_lost_its_marker_is_benched_and_the_rest_grant() -> None:
    nodes = ScriptedNodes(3)
    nodes.data[2].clear()  # restarted empty
    core = make_core(3)
    with capture_events() as events:
        result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.attempts == 1
    assert [r.outcome for r in result.outcomes] == [
        Outcome.GRANTED, Outcome.GRANTED, Outcome.AMNESIAC]
    assert nodes.commands_sent() == ["acquire", "EXISTS"]
    assert core.amnesia.health.is_amnesiac(2)
    assert [e["node"] for e in events if e["event"] == "redlock.node_amnesiac"] == ["n2:6379"]
    assert lock_key("r") not in nodes.data[2] and MARKER not in nodes.data[2]
    # Known now: the next acquire does not look at it again.
    drive(core.release(result.state), nodes.execute)
    nodes.requests.clear()
    assert drive(core.acquire("s", 10.0, blocking=False, timeout=None),
                 nodes.execute).state is not None
    assert nodes.commands_sent() == ["acquire"]


def test_a_majority_without_markers_raises_cluster_amnesia_after_releasing() -> None:
    nodes = ScriptedNodes(5)
    for i in (0, 1, 2):
        nodes.data[i].clear()
    core = make_core(5)
    with pytest.raises(ClusterAmnesiaError, match="3 of 5 nodes lost their node marker"):
        drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert nodes.commands_sent() == ["acquire", "EXISTS", "release"]
    assert not any(lock_key("r") in db for db in nodes.data)
    assert [MARKER in db for db in nodes.data] == [False, False, False, True, True]


# ---------------------------------------------------------------------------
# repair of a node that lost its data
# ---------------------------------------------------------------------------


def amnesiac_cluster(n: int = 5, **options: object) -> ScriptedNodes:
    """Node 0 restarted empty; the others hold diverged counters of a, b and c."""
    nodes = ScriptedNodes(n, **options)  # type: ignore[arg-type]
    nodes.data[0].clear()
    table = {"a": [7, 3, 5, 2], "b": [1, 9, 9], "c": [0, 0, 0, 4]}
    for resource, values in table.items():
        for i, value in enumerate(values, start=1):
            if i < n:
                nodes.data[i][fence_key(resource)] = value
    nodes.data[1][lock_key("a")] = "a holder"  # not a counter: never seeded
    return nodes


def test_repair_claims_the_node_reads_every_healthy_node_seeds_the_max_and_marks_it() -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    core.amnesia.health.note_amnesiac(0, core.clock())
    report = drive(repair_node(core, 0), nodes.execute)
    assert (report.node, report.status) == ("n0:6379", "repaired")
    assert report.detail == "3 fence counters re-seeded"
    assert {k: v for k, v in nodes.data[0].items() if k != MARKER} == {
        fence_key("a"): 7, fence_key("b"): 9, fence_key("c"): 4}
    assert MARKER in nodes.data[0] and GUARD not in nodes.data[0]
    assert not core.amnesia.health.is_amnesiac(0)
    claim = nodes.broadcasts()[0].calls[0]
    assert claim.node == 0
    assert claim.args[:2] == ("SET", GUARD) and claim.args[3:] == ("NX", "PX", 60_000)
    probe = nodes.broadcasts()[1]
    assert [(c.node, c.args) for c in probe.calls] == [
        (i, ("EXISTS", MARKER)) for i in (1, 2, 3, 4)]
    assert nodes.commands_sent() == ["SET", "EXISTS"] + ["SCAN", "MGET"] * 4 + [
        "seed_counters", "finish_repair"]


def test_repair_fails_cleanly_when_fewer_than_a_quorum_of_healthy_nodes_answer() -> None:
    nodes = amnesiac_cluster(down={3})
    nodes.data[4].clear()  # another amnesiac node: no source
    core = make_core(5)
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "failed"
    assert report.detail == "read counters from 2 healthy nodes, need 3"
    assert nodes.commands_sent()[-1] == "DEL"  # gave the claim back
    assert nodes.data[0] == {}  # no counter, no marker, no guard


@pytest.mark.parametrize("broken", ["SCAN", "MGET"])
def test_repair_does_not_count_a_source_whose_counters_could_not_be_read(broken: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)

    def sources_2_and_3_fail(call: object) -> object:
        if getattr(call, "node", None) in (2, 3) and getattr(call, "args", ())[:1] == (broken,):
            return ConnectionError("reset")
        return PASS

    nodes.intercept = sources_2_and_3_fail  # type: ignore[assignment]
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "failed"
    assert report.detail == "read counters from 2 healthy nodes, need 3"
    assert nodes.data[0] == {}


@pytest.mark.parametrize(("claim", "detail"), [(None, "busy"),
                                                (TimeoutError("no reply"), "TimeoutError")])
def test_repair_that_cannot_claim_the_node_does_nothing(claim: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    nodes.intercept = lambda call: claim if call.args[:1] == ("SET",) else PASS
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "failed"
    assert report.detail.startswith("could not claim the repair: " + detail)
    assert nodes.commands_sent() == ["SET"]


@pytest.mark.parametrize(("step", "detail"), [(scripts.SEED_COUNTERS, "seeding interrupted"),
                                              (scripts.FINISH_REPAIR, "marker not written")])
def test_repair_interrupted_by_the_node_losing_the_guard_writes_no_marker(
        step: object, detail: str) -> None:
    nodes = amnesiac_cluster()
    core = make_core(5)
    core.amnesia.health.note_amnesiac(0, core.clock())
    nodes.intercept = lambda call: 0 if call.script is step else PASS
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "failed" and report.detail.startswith(detail)
    assert MARKER not in nodes.data[0]
    assert core.amnesia.health.is_amnesiac(0)


def test_repair_reads_counters_page_by_page_and_seeds_them_in_batches() -> None:
    nodes = ScriptedNodes(3, scan_page=100)
    nodes.data[0].clear()
    for i in range(1200):
        for source in (1, 2):
            nodes.data[source][fence_key(f"r{i}")] = i + source
    core = make_core(3)
    report = drive(repair_node(core, 0), nodes.execute)
    assert report.status == "repaired" and report.detail == "1200 fence counters re-seeded"
    assert all(nodes.data[0][fence_key(f"r{i}")] == i + 2 for i in range(1200))
    seeds = [b for b in nodes.broadcasts() if b.calls[0].script is scripts.SEED_COUNTERS]
    assert [len(b.calls[0].keys) - 1 for b in seeds] == [500, 500, 200]  # the guard + keys
    scans = [b.calls[0] for b in nodes.broadcasts() if b.calls[0].args[:1] == ("SCAN",)]
    assert len(scans) == 2 * 12  # twelve pages on each source, each cursor followed


def test_read_counters_skips_keys_that_vanished_and_gives_up_on_a_malformed_page() -> None:
    nodes = ScriptedNodes(3, scan_page=2)
    for i, resource in enumerate("abc", start=1):
        nodes.data[1][fence_key(resource)] = i
    nodes.data[1][lock_key("a")] = "holder"
    core = make_core(3)
    nodes.intercept = lambda call: ([b"7"] + [None] * (len(call.args) - 2)
                                    if call.args[:1] == ("MGET",) else PASS)
    # Pages of two keys (a, b then c; never the lock key): on each, MGET answers for the
    # first key only; the others vanished meanwhile.
    assert drive(read_counters(core, 1), nodes.execute) == {fence_key("a"): 7,
                                                            fence_key("c"): 7}
    assert nodes.commands_sent() == ["SCAN", "MGET", "SCAN", "MGET"]
    nodes.intercept = lambda call: b"garbage" if call.args[:1] == ("SCAN",) else PASS
    assert drive(read_counters(core, 1), nodes.execute) is None


def test_repair_reports_every_node_and_repairs_only_after_one_max_ttl_unless_forced() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(down={4})
    core = make_core(5, clock, max_ttl=60.0)
    statuses = drive(core.repair(force=False), nodes.execute)
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


def test_repair_of_an_uninitialised_cluster_reports_it_healthy_and_writes_nothing() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    reports = drive(core.repair(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [("healthy", "uninitialised cluster")] * 3
    assert nodes.commands_sent() == ["EXISTS"]
    assert all(db == {} for db in nodes.data)


def test_acquires_repair_a_due_node_and_retry_a_failed_repair_only_after_an_interval() -> None:
    clock = FakeClock()
    nodes = amnesiac_cluster(clock=clock)
    core = make_core(5, clock, max_ttl=10.0, repair_interval=5.0)
    reads_fail = True
    nodes.intercept = lambda call: (ConnectionError("reset")
                                    if reads_fail and call.args[:1] == ("SCAN",) else PASS)

    def acquire() -> list[str]:
        nodes.requests.clear()
        result = drive(core.acquire("x", 5.0, blocking=False, timeout=None), nodes.execute)
        assert result.state is not None  # four healthy nodes grant either way
        drive(core.release(result.state), nodes.execute)
        return nodes.commands_sent()

    assert "SET" not in acquire()[:2]  # detects node 0; not due before one max_ttl
    assert core.amnesia.health.is_amnesiac(0)
    clock.advance(10.0)
    assert acquire()[:2] == ["SET", "EXISTS"]  # due: tried, and the reads failed
    assert core.amnesia.health.is_amnesiac(0)
    clock.advance(1.0)
    assert acquire()[0] == "acquire"  # within the repair interval: not tried again
    clock.advance(4.0)
    reads_fail = False
    assert acquire()[:2] == ["SET", "EXISTS"]
    assert not core.amnesia.health.is_amnesiac(0) and MARKER in nodes.data[0]
