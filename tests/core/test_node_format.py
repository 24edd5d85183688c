"""The node format (docs/design.md §4.1) on scripted nodes: every marker this release
writes names format 1 (``format=1 run_id=... <what wrote it>``); a node whose marker
names another format (a newer release initialised it) is not used at all: its replies do
not count, it is neither judged, adopted nor repaired, and an acquire it leaves without
a quorum raises ``NodeFormatError`` naming the node and the format.

The same on real nodes and both clients: tests/test_node_format.py; the scripts' side
(every script that reads the marker): tests/core/test_scripts_contract.py."""

from __future__ import annotations

import pytest

from redlock import NodeFormatError, Outcome, QuorumUnavailable
from redlock.testing import capture_events
from tests.core.support import maintain
from tests.internals import drive
from tests.scripted import MARKER, ScriptedNodes, lock_key, make_core

NEWER = "initialised by a newer format 2 of redlock-fenced (this client reads format 1)"


def newer_marker(nodes: ScriptedNodes, node: int) -> str:
    """A marker a release of format 2 might write (stamped with the node's run id)."""
    value = f"format=2 run_id={nodes.run_id(node)} initialised at=1 by=0123456789abcdef"
    nodes.data[node][MARKER] = value
    return value


def test_every_marker_this_release_writes_names_its_format() -> None:
    nodes = ScriptedNodes(3)
    for db in nodes.data:
        db.clear()
    core = make_core(3)
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None
    assert [str(db[MARKER]).split()[:2] for db in nodes.data] == [
        ["format=1", f"run_id={nodes.run_id(i)}"] for i in range(3)]


def test_a_node_of_a_newer_format_seen_on_its_connection_does_not_count() -> None:
    """IDENTIFY, on a new connection, shows the marker: the node's grant (ACQUIRE's usual
    case reads only that a marker exists) is not counted, the others decide, and the
    manager says once why it leaves the node out."""
    nodes = ScriptedNodes(3)
    newer = newer_marker(nodes, 2)
    core = make_core(3)
    with capture_events() as events:
        nodes.connect(core)
        nodes.connect(core)  # a second connection: said once
    assert core.amnesia.health.incompatible == {2: NEWER}
    assert [(e["node"], e["why"]) for e in events
            if e["event"] == "redlock.node_incompatible"] == [("n2:6379", NEWER)]
    assert not core.amnesia.needs_maintenance()  # neither judged nor repaired
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert result.state is not None and result.state.token == 1
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED, Outcome.GRANTED,
                                                    Outcome.INCOMPATIBLE]
    assert str(result.outcomes[2]) == f"n2:6379 incompatible ({NEWER})"
    assert nodes.data[2][MARKER] == newer  # left as it is
    assert core.amnesia.health.benched() == set()  # not amnesiac: another release's


def test_an_acquire_that_newer_nodes_leave_without_a_quorum_raises_node_format_error() -> None:
    nodes = ScriptedNodes(3)
    for node in (1, 2):
        newer_marker(nodes, node)
    core = make_core(3)
    nodes.attach(core)
    with pytest.raises(NodeFormatError) as raised:
        drive(core.acquire("r", 10.0, blocking=True, timeout=5.0), nodes.execute)
    error = raised.value
    assert isinstance(error, QuorumUnavailable)  # an outage, to code that catches those
    assert error.resource == "r"
    assert str(error).startswith(
        f"could not acquire lock on 'r': node n1:6379 was {NEWER}; node n2:6379 was {NEWER};"
        " upgrade this client: it must not use such a node, and too few others are left for"
        ' a quorum (docs/operations.md, "Upgrading: the node format"). Per node: ')
    assert [r.outcome for r in error.outcomes] == [Outcome.GRANTED] + [
        Outcome.INCOMPATIBLE] * 2
    # No retry can help: one attempt, and what it set is released everywhere.
    assert nodes.scripts_sent().count("acquire") == 1
    assert not any(lock_key("r") in db for db in nodes.data)


def test_a_granting_script_names_a_newer_format_outside_the_usual_case() -> None:
    """Without the connection's word (no IDENTIFY read yet), the scripts refuse where they
    read the marker: ACQUIRE with a line, ACQUIRE_MANY; the manager then leaves the node
    out as if IDENTIFY had said it, the usual case included."""
    nodes = ScriptedNodes(3)
    newer_marker(nodes, 0)
    core = make_core(3)
    many = drive(core.acquire(("a", "b"), 10.0, blocking=False, timeout=None), nodes.execute)
    assert many.state is not None
    assert many.outcomes[0].outcome is Outcome.INCOMPATIBLE
    assert many.outcomes[0].detail == NEWER
    assert core.amnesia.health.incompatible == {0: NEWER}
    assert lock_key("a") not in nodes.data[0]  # refused: nothing set
    one = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert one.state is not None
    assert one.outcomes[0].outcome is Outcome.INCOMPATIBLE  # granted there, not counted


def test_a_node_repaired_by_a_newer_release_is_left_out_not_counted_again() -> None:
    """A node this manager waits to repair gets its marker from a newer release's client
    meanwhile: the episode's look finds it, and the node is left out from then on."""
    nodes = ScriptedNodes(3)
    nodes.restart(2, keep_data=False)
    core = make_core(3)
    core.amnesia.health.lost_data(2)
    newer_marker(nodes, 2)
    with capture_events() as events:
        maintain(core, nodes, sleeps=None)  # ends by itself: nothing left to do
    assert nodes.commands_sent() == ["horizon", "open_episode"]
    assert core.amnesia.health.incompatible == {2: NEWER}
    assert core.amnesia.health.benched() == set()
    assert [e["node"] for e in events if e["event"] == "redlock.node_incompatible"] == [
        "n2:6379"]


def test_a_new_connection_that_finds_this_format_again_uses_the_node_again() -> None:
    nodes = ScriptedNodes(3)
    newer_marker(nodes, 1)
    core = make_core(3)
    nodes.connect(core)
    assert core.amnesia.health.incompatible == {1: NEWER}
    nodes.data[1][MARKER] = nodes.stamp(1, "initialised again")
    nodes.connect(core, [1])
    assert core.amnesia.health.incompatible == {}
    result = drive(core.acquire("r", 10.0, blocking=False, timeout=None), nodes.execute)
    assert [r.outcome for r in result.outcomes] == [Outcome.GRANTED] * 3


def test_initialise_leaves_a_cluster_with_a_node_of_another_format_alone() -> None:
    nodes = ScriptedNodes(3)
    nodes.data[0].clear()
    newer = newer_marker(nodes, 2)
    core = make_core(3)
    reports = drive(core.initialise(force=True), nodes.execute)
    assert [(r.status, r.detail) for r in reports] == [
        ("healthy", "not changed: some node is of another format"),
        ("healthy", "not changed: some node is of another format"),
        ("failed", f"{NEWER}: upgrade this client")]
    assert nodes.data[0] == {} and nodes.data[2][MARKER] == newer
    assert nodes.commands_sent() == ["identify"]
