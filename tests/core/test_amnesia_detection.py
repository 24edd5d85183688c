"""Amnesia on the acquire path (redlock/_core/amnesia/, docs/design.md §4.2-§4.4) on scripted
nodes: a new cluster initialised by a full view only, a missing marker looked at again,
a node that lost its data benched, a majority that did refused, restarted nodes as
suspects whose replies do not count, and markers without a known run adopted.

Amnesia elsewhere: the background maintenance (judging, episodes) in
test_amnesia_maintenance.py, repair in test_amnesia_repair.py, initialise() in
test_amnesia_initialise.py (all here, in tests/core); on real nodes and both clients in
tests/test_tokens.py and tests/test_new_cluster.py; under faults in
tests/faults/test_crash_amnesia.py and tests/faults/test_restarts.py."""

from __future__ import annotations

import pytest

from redlock import ClusterAmnesiaError, Outcome
from redlock.testing import capture_events
from tests.core.support import maintain
from tests.internals import (
    Call,
    Wait,
    drive,
    node_scripts,
)
from tests.scripted import (
    EPISODE,
    MARKER,
    PASS,
    ScriptedNodes,
    lock_key,
    make_core,
)


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
    assert [(c.node, c.keys) for c in initialise.calls] == [
        (i, (MARKER, EPISODE)) for i in range(3)]
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
            nodes.run_script(2, node_scripts.INIT_MARKER,
                             (MARKER, EPISODE),
                             ("by another client",))
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
    # (When it rejoins: the maintenance bounds it, and says so: redlock.node_out.)
    assert [e["node"] for e in events if e["event"] == "redlock.node_amnesiac"] == ["n2:6379"]
    # Nothing written on the acquire's path: no marker, no lock key, no episode yet.
    assert nodes.data[2] == {}
    # Known now: the next acquire does not look at it again.
    drive(core.holding.release(result.state), nodes.execute)
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
    "format=1 run_id=unknown initialised by a user who may not run INFO",
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
    assert [str(db[MARKER]).split()[:2] for db in nodes.data] == [
        ["format=1", f"run_id={nodes.run_id(i)}"] for i in range(3)]
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
    for i, value in enumerate([5, 5, 9]):
        nodes.set_counter(i, value, "a")
    nodes.set_counter(0, 1, "b")  # b's bucket: below
    core = make_core(3)
    nodes.attach(core)
    nodes.restart(2, keep_data=True)
    result = drive(core.acquire(("a", "b"), 10.0, blocking=False, timeout=None),
                   nodes.execute)
    assert result.state is not None
    assert result.state.tokens == {"a": 6, "b": 6}  # one token for the set
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
