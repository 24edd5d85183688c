"""The admin step ``initialise()`` (redlock/_core/amnesia/repair.py, docs/design.md
§4.8) on scripted nodes: the rest of an interrupted initialisation, nodes that lost data
refused unless forced, the whole keyspace looked through, and every node must answer."""

from __future__ import annotations

import pytest

from redlock.testing import capture_events
from tests.internals import (
    drive,
    node_scripts,
)
from tests.scripted import (
    EPISODE,
    GUARD,
    MARKER,
    ScriptedNodes,
    lock_key,
    make_core,
)


def test_initialise_completes_an_interrupted_initialisation() -> None:
    nodes = ScriptedNodes(3)
    for i in (1, 2):  # INIT_MARKER reached node 0 only...
        nodes.data[i].clear()
    nodes.set_counter(0, 2)  # ...which granted twice without a quorum
    core = make_core(3)
    with capture_events() as events:
        reports = drive(core.initialise(force=False), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", ""), ("initialised", "1 fence counters re-seeded (highest 2)"),
        ("initialised", "1 fence counters re-seeded (highest 2)")]
    blank = nodes.broadcasts()[1:5]  # node by node: no episode, no key of ours
    assert [(c.node, c.args) for b in blank for c in b.calls] == [
        (i, call) for i in (1, 2) for call in (
            ("EXISTS", EPISODE), ("SCAN", 0, "MATCH", "redlock:*", "COUNT", 1000))]
    assert nodes.commands_sent() == ["identify"] + ["EXISTS", "SCAN"] * 2 + [
        "SET", "HGETALL", "seed_counters", "finish_repair"] * 2
    assert [c.node for b in nodes.broadcasts() for c in b.calls
            if c.args[:1] == ("HGETALL",)] == [0, 0]  # the counters read from the marked node only
    assert all(nodes.healthy(i) for i in range(3))
    assert [nodes.counter(i) for i in range(3)] == [2, 2, 2]
    assert not any(GUARD in db or EPISODE in db for db in nodes.data)
    [event] = [e for e in events if e["event"] == "redlock.cluster_initialised_by_hand"]
    assert (event["nodes"], event["initialised"], event["forced"]) == (3, 2, False)
    assert core.amnesia.health.marker_seen
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 3


def test_initialise_refuses_nodes_that_lost_data_unless_forced() -> None:
    nodes = ScriptedNodes(5)
    nodes.set_counter(0, 5)
    nodes.set_counter(1, 8)
    for i in (2, 3, 4):
        nodes.restart(i, keep_data=False)
    nodes.begin_episode(2)  # an amnesia episode
    nodes.set_counter(3, 4)  # a counter of its own
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
    assert [nodes.counter(i) for i in range(5)] == [5, 8, 8, 8, 8]
    assert not any(GUARD in db or EPISODE in db for db in nodes.data)
    [event] = [e for e in events if e["event"] == "redlock.cluster_initialised_by_hand"]
    assert (event["initialised"], event["forced"]) == (3, True)
    finishes = [b.calls[0] for b in nodes.broadcasts()
                if b.calls[0].script is node_scripts.FINISH_REPAIR]
    assert [c.args[2] for c in finishes] == ["0", "0", "0"]  # forced: no rejoin time


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
